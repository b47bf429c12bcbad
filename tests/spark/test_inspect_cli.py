"""`stateops inspect` on a Spark-written checkpoint: output contract and one-line errors."""

from __future__ import annotations

import json
import shutil

import pytest

from stateops.core.checkpoint import load_checkpoint
from tests.conftest import run_cli, tree_digest
from tests.spark.harness import aggregation_case, land

pytestmark = pytest.mark.spark


@pytest.fixture(scope="module")
def checkpoint(spark, tmp_path_factory):
    root = tmp_path_factory.mktemp("inspect")
    land(root / "landing", round_=0, files=5)
    aggregation_case("hdfs").run(spark, root, root / "ckpt", root / "out")
    return root / "ckpt"


@pytest.fixture
def damaged(checkpoint, tmp_path):
    copy = tmp_path / "ckpt"
    shutil.copytree(checkpoint, copy)
    return copy


def test_json_has_the_documented_fields(checkpoint):
    proc = run_cli(
        "inspect", str(checkpoint), "--json", "--min-deltas-for-snapshot", "2", check=True
    )
    report = json.loads(proc.stdout)
    cp = load_checkpoint(checkpoint)
    assert report["query_id"] == cp.query_id
    assert report["last_committed_batch"] == report["latest_offset_batch"] == 4
    assert report["file_count"] == len(cp.sizes) and report["total_bytes"] == cp.total_bytes
    op = report["operators"][0]
    assert {
        "operator_id",
        "provider",
        "num_partitions",
        "store_names",
        "min_version",
        "max_version",
        "snapshot_groups",
        "file_count",
        "total_bytes",
    } <= set(op)
    assert (op["operator_id"], op["provider"], op["num_partitions"]) == (0, "hdfs", 2)
    assert (op["min_version"], op["max_version"]) == (1, 5)
    groups = op["snapshot_groups"]
    assert len(groups) >= 2 and groups[0]["snapshot_versions"] == []
    assert all(g["group_id"] == v // 2 for g in groups for v in g["snapshot_versions"])
    assert [
        (s["partition"], s["store_name"], s["max_version"], s["missing_versions"])
        for s in op["stores"]
    ] == [(0, "default", 5, []), (1, "default", 5, [])]


def test_table_output_is_readable(checkpoint):
    out = run_cli("inspect", str(checkpoint), "--min-deltas-for-snapshot", "2", check=True).stdout
    assert "last committed 4" in out
    assert "stateStoreSave" in out and "hdfs" in out
    assert any(
        line.split()[:3] == ["group", "snapshot", "versions"]
        for line in out.splitlines()
        if line.strip()
    )
    assert "(empty base)" in out


def test_files_for_batch_json(checkpoint):
    proc = run_cli("inspect", str(checkpoint), "--files-for-batch", "3", "--json", check=True)
    assert json.loads(proc.stdout) == {
        "batch": 3,
        "files": load_checkpoint(checkpoint).restart_files(3),
    }


def _assert_one_line_error(proc, *needles: str) -> None:
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stdout == ""
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    for needle in needles:
        assert needle in lines[0]


@pytest.mark.parametrize(
    ("damage", "needles"),
    [
        (
            lambda c: (c / "offsets" / "3").write_text('v1\n{"batchWatermarkMs":0,'),
            ["offsets/3", "corrupt"],
        ),
        (
            lambda c: (c / "offsets" / "2").write_text("v1\n{}\n{logOffset:}"),
            ["offsets/2", "line 3"],
        ),
        (lambda c: (c / "commits" / "4").write_text(""), ["commits/4", "no version header"]),
        (lambda c: (c / "metadata").unlink(), ["metadata", "missing"]),
        (lambda c: (c / "metadata").write_text("{"), ["metadata", "corrupt"]),
    ],
    ids=[
        "truncated-offsets",
        "bad-source-offset",
        "empty-commit",
        "missing-metadata",
        "bad-metadata",
    ],
)
def test_corruption_is_one_line_exit_2_and_changes_nothing(damaged, damage, needles):
    damage(damaged)
    before = tree_digest(damaged)
    for args in (
        ["inspect", str(damaged)],
        ["inspect", str(damaged), "--json"],
        ["inspect", str(damaged), "--files-for-batch", "4"],
    ):
        _assert_one_line_error(run_cli(*args), *needles)
    assert tree_digest(damaged) == before


def test_paths_that_are_not_checkpoints(tmp_path):
    _assert_one_line_error(run_cli("inspect", str(tmp_path / "absent")), "no such directory")
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "readme.txt").write_text("hello")
    _assert_one_line_error(run_cli("inspect", str(tmp_path / "notes")), "not a Spark checkpoint")


def test_a_batch_that_was_never_committed(checkpoint):
    before = tree_digest(checkpoint)
    _assert_one_line_error(
        run_cli("inspect", str(checkpoint), "--files-for-batch", "99"),
        "batch 99 is not a committed batch",
        "last committed batch: 4",
    )
    assert tree_digest(checkpoint) == before


def test_a_batch_that_cleanup_removed_says_so(damaged):
    for log in ("commits", "offsets"):  # what the cleanup of batch 0 removes from the logs
        for name in ("0", ".0.crc"):
            (damaged / log / name).unlink()
    before = tree_digest(damaged)
    _assert_one_line_error(
        run_cli("inspect", str(damaged), "--files-for-batch", "0"),
        "batch 0 is older than the oldest retained batch (1): cleanup removed it; pick a later "
        "batch, or restore an older backup",
    )
    assert tree_digest(damaged) == before


def test_planned_but_uncommitted_batch_and_gaps_are_reported(damaged):
    (damaged / "commits" / "4").unlink()
    (damaged / "offsets" / "1").unlink()
    (damaged / "state" / "0" / "1" / "2.delta").unlink()
    report = json.loads(run_cli("inspect", str(damaged), "--json", check=True).stdout)
    assert report["last_committed_batch"] == 3 and report["uncommitted_batches"] == [4]
    assert report["offsets"]["gaps"] == [1] and report["commits"]["gaps"] == []
    assert report["operators"][0]["uncommitted_versions"] == [5]
    stores = report["operators"][0]["stores"]
    assert [s["missing_versions"] for s in stores] == [[], [2]]
    table = run_cli("inspect", str(damaged), check=True).stdout
    assert "NOT committed: [4]" in table and "GAPS at [1]" in table
    assert "partition 1 store default: versions MISSING [2]" in table
