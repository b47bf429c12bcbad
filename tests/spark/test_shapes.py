"""Every shape of stateful query is a managed query: for each (the windowed count on both
stores, dedup within the watermark, a stream-stream join of two sources, session windows,
applyInPandasWithState with an event-time timeout, and the two processors), the lifecycle
operations that the DAGs call (start, cleanup, backup, backfill = rollback 3 batches +
reprocess + validation, restore) leave its state and output equal to a control run that nothing
touched. Library-level, in the shared Spark session: each DAG's own run of these steps is in
tests/dag (stream_start and stream_checkpoint_backup run every query of registry.yaml)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from stateops.control.lock import new_run_id
from stateops.control.target import query_target
from stateops.core.registry import load_registry
from stateops.ops.backfill import plan_backfill, run_backfill
from stateops.ops.backup import backup_checkpoint, backup_first
from stateops.ops.cleanup import run_cleanup
from stateops.ops.restore import plan_restore, run_restore
from tests.spark.harness import (
    SHAPES,
    copy_checkpoint,
    job_runner,
    land,
    run_in_session,
    shape_registry,
    state_and_output,
)

pytestmark = pytest.mark.spark

QUERIES = ["user_sessions", "page_visits", "page_counts", "idle_sessions", *SHAPES]


@pytest.mark.whole  # the shape matrix: the gate proves each operation on its own road
@pytest.mark.parametrize("name", QUERIES)
def test_every_operation_leaves_state_and_output_equal_to_an_untouched_run(
    spark, s3, tmp_path, name
):
    # Started as stream_start starts it (run_query.py). The control goes on untouched; the
    # touched query is a copy of what the start wrote (checkpoint and output), on the same input.
    control = shape_registry(tmp_path / "control")
    touched = shape_registry(tmp_path / "touched", landing=control.parent / "landing")
    land(control.parent / "landing", round_=0, files=5)
    run_in_session(spark, control, name)
    untouched = state_and_output(spark, control, name)
    last = untouched[0]  # 5 files, one a batch, and any batch a moved watermark adds
    assert last >= 4 and untouched[1] and untouched[2], untouched
    started, registry = load_registry(control).query(name), load_registry(touched)
    checkpoint = registry.query(name).checkpoint
    copy_checkpoint(Path(started.checkpoint), Path(checkpoint))
    shutil.copytree(started.sink.path, registry.query(name).sink.path)

    # Cleaned as the scheduled cleanup does, keeping what restarts after each of the last 4
    # batches need.
    client, quiet = s3.client(), lambda _: None
    cleaned = run_cleanup(query_target(registry, name), 4, run_id=new_run_id("cleanup"), log=quiet)
    assert cleaned["delete"]["files"] > 0, "cleanup had nothing to delete: the proof is void"
    assert state_and_output(spark, touched, name) == untouched

    # Backed up; rolled back 3 batches and reprocessed through the backfill's own steps
    # (its backup first, the validation with Great Expectations last).
    target = query_target(registry, name)
    backup = backup_checkpoint(checkpoint, target.backup_location(), client, log=quiet)
    assert backup["batch_id"] == last
    run_id = new_run_id("backfill")
    plan = plan_backfill(target, run_id, to_batch=last - 3, dry_run=False, log=quiet)
    before_backfill = backup_first(target, client, "backfill", log=quiet)
    done = run_backfill(
        target, plan, run_id=run_id, backup=before_backfill, run_job=job_runner(spark), log=quiet
    )
    assert done["summary"]["batches_run"] == 3, done["summary"]
    assert state_and_output(spark, touched, name) == untouched

    # The first backup restored over the checkpoint.
    restore = plan_restore(
        name, client, backup=backup["backup_id"], registry=registry, replace=True
    )
    run_restore(restore, client, registry=registry, log=quiet)
    assert state_and_output(spark, touched, name) == untouched

    # Both go on with new input: the same state and output again.
    land(control.parent / "landing", round_=1, files=2)
    for registry_path in (control, touched):
        run_in_session(spark, registry_path, name)
    assert state_and_output(spark, touched, name) == state_and_output(spark, control, name)
