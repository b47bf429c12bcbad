"""The checkpoint model on checkpoints Spark writes here, for both providers, the reference
pipelines and built-in operators (aggregation, stream-stream join).

The restart set is proven by restarting Spark on a folder holding only that set (with the
original moved away, so nothing outside the set can be read) and comparing its output and state
with the original query given the same further input.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest

from stateops.core.checkpoint import Checkpoint, load_checkpoint
from stateops.core.errors import CheckpointError
from stateops.core.files import copy_restart_set
from stateops.core.report import checkpoint_report
from stateops.ops.backup import backup_checkpoint
from stateops.ops.restore import restore_backup
from tests.spark.harness import (
    ALL_CASES,
    Case,
    gate_cases,
    land,
    last_committed,
    read_sink,
    read_state,
    round_0,
)

pytestmark = pytest.mark.spark


@dataclass
class Story:
    case: Case
    root: Path
    before: Checkpoint  # the original after round 0
    restart_batch: int
    restart_files: list[str]
    original_out: dict[int, list[tuple]]
    original_state: list[list[str]]
    copy_out: dict[int, list[tuple]]
    copy_state: list[list[str]]
    earlier_batch: int
    earlier_state: list[list[str]]
    earlier_out: dict[int, list[tuple]]
    round0_out: dict[int, list[tuple]]
    round0_state: list[list[str]]
    backup: dict  # the S3 backup of the original after round 0
    restored_out: dict[int, list[tuple]]
    restored_state: list[list[str]]


# The gate: an aggregation on RocksDB; the other provider and shapes in the whole proof.
@pytest.fixture(scope="module", params=gate_cases(ALL_CASES, {"aggregation-rocksdb"}))
def story(request, spark, s3, tmp_path_factory) -> Story:
    case: Case = request.param
    root = tmp_path_factory.mktemp(case.name)
    original, copy, earlier = root / "ck-original", root / "ck-copy", root / "ck-earlier"
    restored = root / "ck-restored"

    round_0(spark, tmp_path_factory, case, 6, root)  # landing, ck-original, out-original
    round0_out = read_sink(root / "out-original")
    round0_state = read_state(spark, original, case.state_reads)
    before = load_checkpoint(original)
    n = last_committed(original)
    files = copy_restart_set(before, n, copy)
    # The same restart point through S3: backup, then restore into a new folder.
    quiet = lambda _: None  # noqa: E731
    backup = backup_checkpoint(original, f"s3://backups/{case.name}", s3.client(), log=quiet)
    url = f"s3://backups/{case.name}/{backup['backup_id']}"
    restore_backup(url, restored, s3.client(), log=quiet)
    # An earlier committed batch too (what a rollback to it keeps), re-run on the same input:
    # watermark queries plan no-data batches, so only the same input gives the same batch ids.
    earlier_batch = n - 2
    copy_restart_set(before, earlier_batch, earlier)
    case.run(spark, root, earlier, root / "out-earlier")

    land(root / "landing", round_=1, files=3)
    case.run(spark, root, original, root / "out-original")
    original_state = read_state(spark, original, case.state_reads)
    case.run(spark, root, copy, root / "out-copy")
    case.run(spark, root, restored, root / "out-restored")

    return Story(
        case=case,
        root=root,
        before=before,
        restart_batch=n,
        restart_files=files,
        original_out=read_sink(root / "out-original"),
        original_state=original_state,
        copy_out=read_sink(root / "out-copy"),
        copy_state=read_state(spark, copy, case.state_reads),
        earlier_batch=earlier_batch,
        earlier_state=read_state(spark, earlier, case.state_reads),
        earlier_out=read_sink(root / "out-earlier"),
        round0_out=round0_out,
        round0_state=round0_state,
        backup=backup,
        restored_out=read_sink(root / "out-restored"),
        restored_state=read_state(spark, restored, case.state_reads),
    )


def test_model_sees_operators_stores_and_provider(story: Story):
    report = checkpoint_report(story.before, min_deltas_for_snapshot=2)
    assert report["last_committed_batch"] == story.restart_batch
    assert report["latest_offset_batch"] == story.restart_batch
    assert report["uncommitted_batches"] == []
    assert report["commits"]["gaps"] == [] and report["offsets"]["gaps"] == []
    assert len(report["operators"]) == 1
    op = report["operators"][0]
    assert op["provider"] == story.case.provider
    assert op["num_partitions"] == 2
    if story.case.name.startswith("join"):
        assert op["store_names"] == [
            "left-keyToNumValues",
            "left-keyWithIndexToValue",
            "right-keyToNumValues",
            "right-keyWithIndexToValue",
        ]
    else:
        assert op["store_names"] == ["default"]
    assert op["max_version"] == story.restart_batch + 1
    assert op["file_count"] > 0 and op["total_bytes"] > 0
    assert report["file_count"] == len(story.before.sizes)


def test_several_snapshot_groups_exist_and_partition_the_versions(story: Story):
    op = story.before.operators[0]
    for store in op.stores:
        groups = store.snapshot_groups(story.before.sizes)
        assert len(groups) >= 2, f"{store.rel_dir}: expected several snapshot groups"
        covered = [v for g in groups for v in g.versions]
        assert sorted(covered) == store.versions, "groups must cover each version exactly once"
        for g in groups[1:]:
            assert g.snapshot_version in store.snapshots


def test_restart_set_is_a_strict_subset_without_old_groups(story: Story):
    state_files = {
        rel
        for rel in story.before.sizes
        if rel.startswith("state/") and not rel.endswith(".crc") and "_metadata" not in rel
    }
    needed = set(story.restart_files)
    assert needed < set(story.before.sizes)
    # Loading version N+1 starts at the latest snapshot: the oldest versions' files are not needed.
    assert state_files - needed, "old snapshot groups should not be in the restart set"
    for op in story.before.operators:
        for store in op.stores:
            chain, missing = store.load_chain(story.restart_batch + 1)
            assert not missing and set(chain) <= needed
    assert "metadata" in needed and f"commits/{story.restart_batch}" in needed
    assert f"offsets/{story.restart_batch - 1}" in needed
    assert f"commits/{story.restart_batch - 1}" not in needed
    assert all((story.root / "ck-original" / rel).exists() for rel in needed)
    for rel in needed:
        if not rel.endswith(".crc"):
            parent, _, name = rel.rpartition("/")
            sidecar = f"{parent}/.{name}.crc" if parent else f".{name}.crc"
            assert (sidecar in needed) == (sidecar in story.before.sizes)


def test_source_log_from_its_latest_compaction(story: Story):
    log = story.before.sources["0"]
    compacted = sorted(i for i, rel in log.items() if rel.endswith(".compact"))
    needed = {rel for rel in story.restart_files if rel.startswith("sources/0/")}
    needed = {rel for rel in needed if not rel.rpartition("/")[2].startswith(".")}
    if not story.case.name.startswith(("aggregation", "join")):
        assert not compacted  # the pipelines keep Spark's default interval of 10
        assert needed == set(log.values())
        return
    assert compacted, "the built-in cases compact their source log every 3 entries"
    latest = max(compacted)
    assert needed == {rel for i, rel in log.items() if i >= latest}


def test_restart_from_only_the_restart_set_continues_identically(story: Story):
    n = story.restart_batch
    new_batches = {b: rows for b, rows in story.original_out.items() if b > n}
    assert new_batches, "the original produced no batches after the restart point"
    assert {b: rows for b, rows in story.copy_out.items() if b > n} == new_batches
    assert any(rows for rows in story.original_state), "state should not be empty"
    assert story.copy_state == story.original_state


def test_restore_from_an_s3_backup_continues_identically(story: Story):
    """Backup to S3, restore into a new folder, restart there: same output, same state."""
    n = story.restart_batch
    assert story.backup["batch_id"] == n
    assert [f["path"] for f in story.backup["files"]] == story.restart_files
    new_batches = {b: rows for b, rows in story.original_out.items() if b > n}
    assert new_batches, "round 1 should have produced output"
    assert {b: rows for b, rows in story.restored_out.items() if b > n} == new_batches
    assert story.restored_state == story.original_state


def test_restart_set_of_an_earlier_batch_reprocesses_to_the_same_state(story: Story):
    k = story.earlier_batch
    assert min(story.earlier_out) == k + 1
    assert story.earlier_out == {b: r for b, r in story.round0_out.items() if b > k}
    assert story.earlier_state == story.round0_state


def test_a_needed_version_that_is_gone_is_named(story: Story, tmp_path):
    damaged = tmp_path / "damaged"
    shutil.copytree(story.root / "ck-original", damaged)
    cp = load_checkpoint(damaged)
    n = cp.last_committed_batch
    store = cp.operators[0].stores[0]
    for rel in (store.deltas.get(n + 1), store.snapshots.get(n + 1)):
        if rel:
            (damaged / rel).unlink()
    with pytest.raises(CheckpointError, match=f"missing: .*{store.rel_dir}/{n + 1}"):
        load_checkpoint(damaged).restart_files(n)


def test_a_missing_schema_file_that_the_operator_metadata_names_is_named(story: Story, tmp_path):
    op = story.before.operators[0]
    if not any(k is not None for k in op.metadata_files):
        pytest.skip("only transformWithState writes operator metadata v2")
    damaged = tmp_path / "damaged"
    shutil.copytree(story.root / "ck-original", damaged)
    schema = next(iter(op.schema_files))
    (damaged / schema).unlink()
    with pytest.raises(CheckpointError, match="_stateSchema/"):
        load_checkpoint(damaged).restart_files(story.restart_batch)


def test_a_missing_sst_that_a_needed_zip_lists_is_named(story: Story, tmp_path):
    if story.case.provider != "rocksdb":
        pytest.skip("HDFS stores have no SST files")
    damaged = tmp_path / "damaged"
    shutil.copytree(story.root / "ck-original", damaged)
    needed = load_checkpoint(damaged).restart_files(story.restart_batch)
    sst = next(f for f in needed if f.endswith(".sst"))
    (damaged / sst).unlink()
    with pytest.raises(CheckpointError, match="SSTs/"):
        load_checkpoint(damaged).restart_files(story.restart_batch)


def test_input_files_of_each_batch_across_compactions(story: Story):
    """Every landed file was read by exactly one batch, also where the log was compacted."""
    cp = story.before
    read = [f["path"] for b in sorted(cp.commits) for f in cp.input_files(b)]
    # `before` is the checkpoint after round 0 (round 1 landed later).
    landed = sorted(p.name for p in (story.root / "landing" / story.case.landing).glob("*r000*"))
    assert sorted(Path(p).name for p in read) == landed
    assert len(landed) == 6
    with pytest.raises(CheckpointError, match="offsets/99 is gone|batch 99 is not in offsets"):
        cp.input_files(99)
