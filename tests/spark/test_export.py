"""State export on Spark-written checkpoints: rows and checksums (independent of row order;
a list's order is in its rows' positions)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from stateops.core.checkpoint import load_checkpoint
from stateops.core.errors import CheckpointError
from stateops.core.storage import begin_unfinished, list_files, location, unfinished
from stateops.spark.export import MANIFEST, export_state, state_checksum
from tests.conftest import run_cli, tree_digest
from tests.spark.harness import ALL_CASES, join_case, land

pytestmark = pytest.mark.spark

CASES = {c.name: c for c in ALL_CASES}


@pytest.fixture(scope="module")
def written(spark, tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("export")
    land(root / "landing", round_=0, files=4)
    out = {}
    for case in (CASES["user_sessions-rocksdb"], CASES["page_visits-rocksdb"], join_case("hdfs")):
        out[case.name] = root / case.name
        case.run(spark, root, out[case.name], root / f"out-{case.name}")
    return out


def _live(spark, checkpoint: Path, batch: int, **options: str) -> tuple[int, str]:
    df = (
        spark.read.format("statestore").options(batchId=str(batch), **options).load(str(checkpoint))
    )
    return state_checksum(df)


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        (
            "user_sessions-rocksdb",
            {"timers": {"readRegisteredTimers": "true"}, "events": {"stateVarName": "events"}},
        ),
        pytest.param(
            "page_visits-rocksdb",
            {"pages": {"stateVarName": "pages"}, "count": {"stateVarName": "count"}},
            marks=pytest.mark.whole,
        ),
        pytest.param(
            "join-hdfs",
            {
                s: {"storeName": s}
                for s in (
                    "left-keyToNumValues",
                    "left-keyWithIndexToValue",
                    "right-keyToNumValues",
                    "right-keyWithIndexToValue",
                )
            },
            marks=pytest.mark.whole,
        ),
    ],
)
def test_every_variable_is_exported_with_the_live_state_counts_and_checksums(
    spark, written, tmp_path, name, expected
):
    ckpt = written[name]
    batch = load_checkpoint(ckpt).last_committed_batch
    manifest = export_state(spark, str(ckpt), tmp_path / "export")
    assert manifest["batch_id"] == batch
    assert manifest["query_id"] == load_checkpoint(ckpt).query_id
    assert json.loads((tmp_path / "export" / MANIFEST).read_text()) == manifest
    by_var = {e["variable"]: e for e in manifest["entries"]}
    assert set(by_var) == set(expected)
    for var, options in expected.items():
        entry = by_var[var]
        if entry["kind"] != "list":
            assert (entry["rows"], entry["checksum"]) == _live(spark, ckpt, batch, **options)
            continue
        # A list's elements in their order: each key's rows by position are Spark's list.
        assert entry["rows"] == _live(spark, ckpt, batch, **options)[0]
        assert entry["position"] == "list_position"
        assert _lists(spark.read.parquet(str(tmp_path / "export" / entry["path"]))) == _lists(
            spark.read.format("statestore")
            .options(batchId=str(batch), flattenCollectionTypes="false", **options)
            .load(str(ckpt))
        )
    assert sum(e["rows"] for e in manifest["entries"]) > 0
    cp = load_checkpoint(ckpt)
    assert manifest["watermark"] == {
        "batch_watermark_ms": cp.offsets[batch].watermark_ms,
        "next_batch_watermark_ms": cp.commits[batch]["nextBatchWatermarkMs"],
    }


def _lists(df) -> dict:
    """Key -> its list, from exported rows (by position) or Spark's unflattened list state."""
    if "list_value" in df.columns:
        return {r["key"]: list(r["list_value"]) for r in df.collect()}
    lists: dict = {}
    for r in sorted(df.collect(), key=lambda r: r["list_position"]):
        lists.setdefault(r["key"], []).append(r["list_element"])
    return lists


@pytest.mark.whole
def test_a_list_in_another_order_is_another_state(spark, written, tmp_path):
    manifest = export_state(spark, str(written["user_sessions-rocksdb"]), tmp_path / "e")
    entry = next(e for e in manifest["entries"] if e["kind"] == "list")
    df = spark.read.parquet(str(tmp_path / "e" / entry["path"]))
    # Each list reversed: the same rows but for their positions.
    reversed_ = df.selectExpr(
        "key",
        "list_element",
        "count(1) OVER (PARTITION BY key) - 1 - list_position AS list_position",
    )
    assert state_checksum(reversed_)[0] == entry["rows"]
    assert state_checksum(reversed_)[1] != entry["checksum"]


@pytest.mark.whole
def test_checksums_ignore_row_order_and_partitioning(spark, written, tmp_path):
    manifest = export_state(spark, str(written["page_visits-rocksdb"]), tmp_path / "e")
    for entry in manifest["entries"]:
        df = spark.read.parquet(str(tmp_path / "e" / entry["path"]))
        shuffled = df.repartition(7).orderBy(df.columns[0], ascending=False)
        assert state_checksum(shuffled) == (entry["rows"], entry["checksum"])


@pytest.mark.whole
def test_an_earlier_batch_is_a_different_state(spark, written, tmp_path):
    ckpt = str(written["page_visits-rocksdb"])
    last = export_state(spark, ckpt, tmp_path / "last")
    earlier = export_state(spark, ckpt, tmp_path / "earlier", batch=last["batch_id"] - 1)
    assert earlier["batch_id"] == last["batch_id"] - 1
    count = {
        m["batch_id"]: next(e for e in m["entries"] if e["variable"] == "count")
        for m in (last, earlier)
    }
    assert count[last["batch_id"]]["checksum"] != count[earlier["batch_id"]]["checksum"]


def test_refusals_change_nothing(spark, written, tmp_path):
    ckpt = written["page_visits-rocksdb"]
    before = tree_digest(ckpt)
    with pytest.raises(CheckpointError, match="batch 99 is not a committed batch"):
        export_state(spark, str(ckpt), tmp_path / "x", batch=99)
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "keep.txt").write_text("mine")
    with pytest.raises(CheckpointError, match="not empty"):
        export_state(spark, str(ckpt), tmp_path / "full")
    assert tree_digest(ckpt) == before
    assert [p.name for p in (tmp_path / "full").iterdir()] == ["keep.txt"]


def test_an_export_into_an_s3_prefix_that_holds_something_is_refused(
    spark, written, s3a_env, tmp_path
):
    ckpt = written["page_visits-rocksdb"]
    full = location(s3a_env.url(f"{tmp_path.name}/full"))
    (full / "keep.txt").write_text("mine")
    with pytest.raises(
        CheckpointError, match=r"full: not empty; export into a new or empty prefix"
    ):
        export_state(spark, str(ckpt), full)
    assert list_files(full) == {"keep.txt": 4}


@pytest.mark.whole  # a fault story
def test_an_export_killed_half_way_is_done_again_when_its_step_runs_again(
    spark, written, s3a_env, tmp_path
):
    """A worker lost in the middle of a migration's export (SIGKILL after the first state
    variable) leaves part of an export in its run's work folder; the step run again, on any
    host, empties it and exports the whole state, where a folder of someone else's stays
    refused."""
    ckpt = str(written["page_visits-rocksdb"])
    out = location(s3a_env.url(f"{tmp_path.name}/work/export"))
    killed = run_cli("export", ckpt, "--out", str(out), env={"STATEOPS_KILL_AT": "export:1"})
    assert killed.returncode != 0
    left = list_files(out)
    assert any(rel.endswith(".parquet") for rel in left) and MANIFEST not in left, left
    again = run_cli("export", ckpt, "--out", str(out))
    assert again.returncode == 0, again.stderr[-3000:]
    whole = export_state(spark, ckpt, tmp_path / "whole")
    exported = json.loads((out / MANIFEST).read_text())
    assert [(e["path"], e["rows"], e["checksum"]) for e in exported["entries"]] == [
        (e["path"], e["rows"], e["checksum"]) for e in whole["entries"]
    ]
    parts = {rel for rel in left if rel.endswith(".parquet")}  # named by the killed write
    assert not parts & set(list_files(out)), "the killed export's files were left"
    local = tmp_path / "local"  # what a kill leaves in a local folder: the same marker
    begin_unfinished(local)
    (local / "op0").mkdir()
    (local / "op0" / "part-0.parquet").write_text("half")
    assert export_state(spark, ckpt, local)["entries"] == whole["entries"]
    assert not (local / "op0" / "part-0.parquet").exists() and not unfinished(local)


@pytest.mark.whole
def test_cli_export_through_spark_submit(written, tmp_path):
    proc = run_cli("export", str(written["user_sessions-rocksdb"]), "--out", str(tmp_path / "e"))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert {e["variable"] for e in summary["entries"]} == {"timers", "events"}
    bad = run_cli(
        "export",
        str(written["user_sessions-rocksdb"]),
        "--out",
        str(tmp_path / "f"),
        "--batch",
        "99",
    )
    assert (
        bad.returncode == 2 and bad.stderr.startswith("error: ") and not (tmp_path / "f").exists()
    )
