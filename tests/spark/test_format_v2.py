"""Checkpoint format v2 (issue 21), on a checkpoint Spark wrote with
``state_store.checkpoint_format: 2`` whose batch 3 failed once after its tasks uploaded their
state, so that one state version has two file sets and the commit names one
(harness.v2_case): ``inspect`` says v2 and agrees with Spark's ``state-metadata``; ``verify``
reads the lineage and finds each kind of damage; the export and Great Expectations read the
state; a rollback of three batches then reprocessing, the restart set alone and a restored
backup each go on like the untouched query; and the repartition, which Spark 4.2 cannot do
on v2, refuses in one line and changes nothing. Cleanup, rollback and transplant on v2 are
proven beside their v1 proofs: tests/spark/test_cleanup.py, test_rollback.py,
test_migration_run.py and the fault injection of tests/faults."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from stateops.core.checkpoint import load_checkpoint
from stateops.core.registry import load_registry
from tests.conftest import run_cli, tree_digest, write_registry
from tests.spark.harness import (
    FAILS_ONCE,
    PAGE_VISITS_READS,
    V2_STATE_STORE,
    copy_checkpoint,
    land,
    read_sink,
    read_state,
    run_in_session,
    v2_case,
)

pytestmark = pytest.mark.spark

QUERY = "page_visits"
V2 = v2_case()


@pytest.fixture(scope="module")
def v2(spark, s3, tmp_path_factory):
    """A registry whose page_visits writes format v2, run by Spark over six files, its batch
    FAILS_ONCE failed once after its state was written and run again (harness.v2_case)."""
    root = tmp_path_factory.mktemp("format-v2")
    land(root / "landing", round_=0, files=6)
    V2.run(spark, root, root / "checkpoints" / QUERY, root / "output" / QUERY)
    registry = write_registry(root, page_visits={"state_store": V2_STATE_STORE, "approval": "none"})
    return registry


def test_spark_wrote_format_v2_and_inspect_says_so(spark, v2):
    checkpoint = Path(load_registry(v2).query(QUERY).checkpoint)
    cp = load_checkpoint(checkpoint)
    assert cp.last_committed_batch == 5
    # Spark's own marks of v2: commits that name the state files of their batch, and state
    # files named <version>_<id>.
    assert all(c.get("stateUniqueIds") for c in cp.commits.values()), cp.commits
    state_files = [p.name for p in (checkpoint / "state").rglob("*.changelog")]
    assert state_files and all(
        re.fullmatch(r"\d+_[0-9a-f-]{36}\.changelog", n) for n in state_files
    ), state_files
    assert cp.format_version == 2
    # The batch that failed once left a second file set of its state version in each store,
    # an id no commit names: the attempt the commit names is the one a restart loads.
    version = FAILS_ONCE + 1
    for store in cp.operators[0].stores:
        ids = store.v2_files[version]
        named = cp.state_ids(FAILS_ONCE)[(0, store.partition, "default")]
        assert len(ids) == 2 and named in ids, (store.rel_dir, ids, named)
    report = json.loads(
        run_cli("--registry", str(v2), "inspect", QUERY, "--json", check=True).stdout
    )
    assert report["format_version"] == 2
    # It agrees with Spark's own reading of the checkpoint, store by store (Spark's batch ids
    # are state versions - 1), and its snapshot groups are those of the committed ids.
    spark_says = sorted(
        (
            r.operatorId,
            r.operatorName,
            r.stateStoreName,
            r.numPartitions,
            r.minBatchId,
            r.maxBatchId,
        )
        for r in spark.read.format("state-metadata").load(str(checkpoint)).collect()
    )
    we_say = sorted(
        (
            op["operator_id"],
            op["operator_name"],
            store,
            op["num_partitions"],
            op["min_version"] - 1,
            op["max_version"] - 1,
        )
        for op in report["operators"]
        for store in op["store_names"]
    )
    assert spark_says == we_say and we_say, (spark_says, we_say)
    [op] = report["operators"]
    assert len(op["snapshot_groups"]) >= 2 and all(s["snapshots"] for s in op["stores"]), op
    text = run_cli("--registry", str(v2), "inspect", QUERY, check=True).stdout
    assert "format      v2 (every operation reads it but repartition: " in text, text


@pytest.mark.parametrize(
    "dry_run",
    [
        pytest.param(["--dry-run"], id="dry-run"),
        pytest.param([], id="run", marks=pytest.mark.whole),
    ],
)
def test_the_repartition_refuses_a_v2_checkpoint_in_one_line_and_changes_nothing(v2, s3, dry_run):
    """Spark 4.2's repartition loads each store without its checkpoint id and fails on the v2
    file names (seen here), so it is refused before anything runs."""
    checkpoint = Path(load_registry(v2).query(QUERY).checkpoint)
    before = tree_digest(checkpoint)
    proc = run_cli(
        "--registry", str(v2), "repartition", QUERY, "--partitions", "3", *dry_run, env=s3.env()
    )
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
    assert "checkpoint format v2: repartition reads format v1 only" in proc.stderr, proc.stderr
    assert proc.stderr.strip().count("\n") == 0, f"more than one line: {proc.stderr}"
    assert tree_digest(checkpoint) == before


def test_verify_reads_the_lineage_and_finds_each_kind_of_damage_on_v2(v2, tmp_path):
    """The files a restart needs are those the last commit's ids name: its zip, or the
    snapshot its changelog's lineage starts from and the changelogs after it."""
    checkpoint = Path(load_registry(v2).query(QUERY).checkpoint)
    cp = load_checkpoint(checkpoint)
    needed = cp.restart_files(cp.last_committed_batch)
    ids = cp.state_ids(cp.last_committed_batch)
    assert len(ids) == 2  # one store in each of the 2 partitions
    last = cp.last_committed_batch
    named = []  # version last + 1's file by the commit's id: its snapshot if Spark uploaded one,
    for (_, partition, _), uid in ids.items():  # else its changelog (and its lineage's base)
        mine = [r for r in needed if r.startswith(f"state/0/{partition}/{last + 1}_{uid}.")]
        assert mine and any(
            r.startswith(f"state/0/{partition}/") and r.endswith(".zip") for r in needed
        ), needed
        named += [r for r in mine if not r.endswith(".crc")]
    proc = run_cli("verify", str(checkpoint))
    assert proc.returncode == 0 and "0 errors" in proc.stdout, proc.stdout + proc.stderr

    state_file = named[0]
    newest = state_file.rsplit(".", 1)[0]  # its zip and changelog: with one of them left,
    damages = {  # Spark (and the model) still load the version, from the zip or the lineage
        "missing file": (
            lambda root: [p.unlink() for p in root.glob(f"{newest}.*")],
            f"{newest}.changelog: missing: a restart after batch {last} needs it",
        ),
        "flipped byte": (lambda root: _flip(root / state_file), f"{state_file}: "),
        "gap": (lambda root: (root / "commits" / "1").unlink(), "commits/1: missing: a gap"),
        "missing metadata": (lambda root: (root / "metadata").unlink(), "metadata: missing"),
    }
    for kind, (damage, said) in damages.items():
        copy = tmp_path / kind.replace(" ", "-")
        shutil.copytree(checkpoint, copy)
        damage(copy)
        proc = run_cli("verify", str(copy))
        assert proc.returncode == 1 and said in proc.stdout, (kind, proc.stdout, proc.stderr)


def _flip(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


@pytest.mark.whole
def test_the_expectations_validate_the_state_of_a_v2_checkpoint(spark, v2):
    """Great Expectations on the state Spark reads from the files the last commit's ids name;
    the count of visits it checks non-negative is a value kept per user."""
    from stateops.spark.expectations import validate_state

    result = validate_state(spark, load_registry(v2).query(QUERY))
    assert result["ok"] and result["batch_id"] == 5, result
    assert {v["variable"] for v in result["variables"]} == {"pages", "count"}, result


@pytest.mark.whole
def test_the_export_holds_the_state_spark_reads_at_the_last_batch(spark, v2, tmp_path):
    """``stateops export`` on v2: each variable's rows and checksum are those Spark's state
    reader gives for the last batch (the files its commit's ids name)."""
    from stateops.spark.export import export_state, state_checksum

    checkpoint = load_registry(v2).query(QUERY).checkpoint
    manifest = export_state(spark, checkpoint, tmp_path / "export")
    assert manifest["batch_id"] == 5
    by_var = {e["variable"]: e for e in manifest["entries"]}
    assert set(by_var) == {"pages", "count"}, manifest
    for variable, entry in by_var.items():
        live = state_checksum(
            spark.read.format("statestore")
            .options(batchId="5", stateVarName=variable)
            .load(checkpoint)
        )
        assert live[0] > 0 and entry["rows"] == live[0], (variable, entry, live)
        if entry["kind"] != "list":  # a list's checksum is of its rows by position
            assert entry["checksum"] == live[1], (variable, entry, live)


def test_rollback_three_batches_and_reprocess_gives_the_untouched_run(spark, s3, v2, tmp_path):
    """Commit log and lineage stay consistent: the commit of the batch rolled back to names
    the files its restart loads, and Spark, reprocessing the same input from there, arrives at
    the state and output of the run nobody touched (the attempt no commit names stays for
    cleanup)."""
    original = load_registry(v2).query(QUERY)
    checkpoint, sink = tmp_path / "checkpoints" / QUERY, tmp_path / "output" / QUERY
    copy_checkpoint(Path(original.checkpoint), checkpoint)
    shutil.copytree(original.sink.path, sink)
    (tmp_path / "landing").symlink_to(v2.parent / "landing")
    last = load_checkpoint(checkpoint).last_committed_batch
    to_batch = last - 3
    assert to_batch < FAILS_ONCE + 1 <= last  # the version with two attempts is rolled over

    proc = run_cli(
        "rollback",
        str(checkpoint),
        "--to-batch",
        str(to_batch),
        "--sink",
        str(sink),
        "--backup-to",
        "s3://backups/v2-rollback",
        env=s3.env(),
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rolled = load_checkpoint(checkpoint)
    assert rolled.last_committed_batch == to_batch
    assert all(v <= to_batch + 1 for s in rolled.operators[0].stores for v in s.versions)
    assert rolled.restart_requirements(to_batch)[1] == []
    V2.run(spark, tmp_path, checkpoint, sink)
    assert load_checkpoint(checkpoint).last_committed_batch == last
    assert read_state(spark, checkpoint, PAGE_VISITS_READS) == read_state(
        spark, Path(original.checkpoint), PAGE_VISITS_READS
    )
    assert read_sink(sink) == read_sink(Path(original.sink.path))


@pytest.mark.whole
def test_the_restart_set_alone_and_a_restored_backup_go_on_like_the_original(
    spark, s3, v2, tmp_path
):
    """Last in this file: it runs the original on."""
    from stateops.core.files import copy_restart_set
    from stateops.ops.backup import backup_checkpoint
    from stateops.ops.restore import restore_backup
    from tests.spark.harness import state_and_output

    original = load_registry(v2).query(QUERY)
    cp = load_checkpoint(original.checkpoint)
    copies = {}
    for name in ("restart-set", "restored"):
        entry = {
            "state_store": {"checkpoint_format": 2, "min_deltas_for_snapshot": 2},
            "source": original.source.model_dump(by_alias=True),
        }
        copies[name] = write_registry(tmp_path / name, page_visits=entry)
        shutil.copytree(original.sink.path, load_registry(copies[name]).query(QUERY).sink.path)
    copy_restart_set(
        cp, cp.last_committed_batch, load_registry(copies["restart-set"]).query(QUERY).checkpoint
    )
    quiet = lambda _: None  # noqa: E731
    backup = backup_checkpoint(original.checkpoint, "s3://backups/v2", s3.client(), log=quiet)
    assert backup["files"] and all(
        f["path"] in cp.restart_files(cp.last_committed_batch) for f in backup["files"]
    )
    restore_backup(
        f"s3://backups/v2/{backup['backup_id']}",
        load_registry(copies["restored"]).query(QUERY).checkpoint,
        s3.client(),
        log=quiet,
    )

    land(v2.parent / "landing", round_=1, files=2)
    for registry in (v2, *copies.values()):
        run_in_session(spark, registry, QUERY)
    expected = state_and_output(spark, v2, QUERY)
    assert expected[0] > cp.last_committed_batch
    for name, registry in copies.items():
        assert state_and_output(spark, registry, QUERY) == expected, name
