"""Every shape of stateful query is a managed query: for each (the windowed count on both
stores, dedup within the watermark, a stream-stream join of two sources, session windows,
applyInPandasWithState with an event-time timeout, and the two processors), the lifecycle
operations that the DAGs call (start, cleanup, backup, backfill = rollback 3 batches +
reprocess + validation, restore) leave its state and output equal to a control run that nothing
touched. Library-level, in the shared Spark session: each DAG's own run of these steps is in
tests/dag (stream_start and stream_checkpoint_backup run every query of registry.yaml)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from stateops.control.lock import checkpoint_lock, new_run_id
from stateops.core.registry import load_registry
from stateops.ops.backfill import plan_backfill, run_backfill
from stateops.ops.backup import backup_query
from stateops.ops.cleanup import run_cleanup
from stateops.ops.restore import execute_restore, plan_restore
from tests.conftest import TEST_SPARK_CONF, TEST_STATE_STORE, write_registry
from tests.spark.harness import job_runner, land, run_in_session, state_and_output

pytestmark = pytest.mark.spark

USER_CODE = Path(__file__).parent / "user_code"
VIEWS = {
    "format": "json",
    "path": "landing/page_visits",
    "schema": "user_id STRING, page STRING, event_time TIMESTAMP",
    "options": {"maxFilesPerTrigger": 1},
}
EVENTS = {
    "format": "json",
    "path": "landing/user_sessions",
    "schema": "user_id STRING, data STRING, is_last BOOLEAN, event_time TIMESTAMP",
    "options": {"maxFilesPerTrigger": 1},
}


def _transform(function: str, **entry) -> dict:
    inputs = {"source": VIEWS} if "sources" not in entry else {}
    return {**inputs, "transform": {"function": function, "output_mode": "append"},
            "state_store": {"provider": "rocksdb"}, **entry}  # fmt: skip


# The shapes beside registry.yaml's own queries (user_sessions, page_visits, page_counts on the
# HDFS-backed store, idle_sessions with applyInPandasWithState): name -> registry entry, or
# the registered query whose entry it takes on RocksDB.
SHAPES = {
    "page_counts_rocksdb": "page_counts",
    "first_views": _transform("shapes:first_views", key_columns=["user_id", "page"]),
    "session_counts": _transform("shapes:session_counts"),
    "views_near_events": _transform(
        "shapes:views_near_events", sources={"views": VIEWS, "events": EVENTS}
    ),
}


def shape_registry(root: Path) -> Path:
    """registry.yaml's queries and the shapes above, test-sized, backed up to the test's S3."""
    path = write_registry(root)
    raw = yaml.safe_load(path.read_text())
    queries = raw["queries"]
    for name, entry in SHAPES.items():
        if isinstance(entry, str):
            entry = {**queries[entry], "state_store": {"provider": "rocksdb"}}
        queries[name] = {
            "shuffle_partitions": 2,
            "spark_conf": dict(TEST_SPARK_CONF),
            **entry,
            "state_store": {**TEST_STATE_STORE, **entry["state_store"]},
            "sink": {"format": "parquet", "path": f"output/{name}"},
            "checkpoint": f"checkpoints/{name}",
        }
    raw["code_paths"] = [str(USER_CODE)]
    raw["backups"]["url"] = f"s3://backups/{root.parent.name}"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


QUERIES = ["user_sessions", "page_visits", "page_counts", "idle_sessions", *SHAPES]


@pytest.mark.parametrize("name", QUERIES)
def test_every_operation_leaves_state_and_output_equal_to_an_untouched_run(
    spark, s3, tmp_path, name
):
    control, touched = shape_registry(tmp_path / "control"), shape_registry(tmp_path / "touched")
    for registry in (control, touched):
        land(registry.parent / "landing", round_=0, files=5)
    run_in_session(spark, control, name)
    untouched = state_and_output(spark, control, name)
    last = untouched[0]  # 5 files, one a batch, and any batch a moved watermark adds
    assert last >= 4 and untouched[1] and untouched[2], untouched

    # Started as stream_start starts it (run_query.py), then cleaned as the scheduled cleanup
    # does, keeping what restarts after each of the last 4 batches need.
    run_in_session(spark, touched, name)
    registry, client, quiet = load_registry(touched), s3.client(), lambda _: None
    checkpoint = registry.query(name).checkpoint
    lock = checkpoint_lock(checkpoint, registry, "cleanup", new_run_id("cleanup"))
    cleaned = run_cleanup(checkpoint, 4, lock, log=quiet)
    assert cleaned["delete"]["files"] > 0, "cleanup had nothing to delete: the proof is void"
    assert state_and_output(spark, touched, name) == untouched

    # Backed up; rolled back 3 batches and reprocessed through the backfill's own steps
    # (its backup first, the validation with Great Expectations last).
    backup = backup_query(registry, name, client, log=quiet)
    assert backup["batch_id"] == last
    run_id = new_run_id("backfill")
    plan = plan_backfill(registry, name, run_id, to_batch=last - 3, log=quiet)
    before_backfill = lambda: backup_query(registry, name, client, log=quiet)["backup_id"]  # noqa: E731
    done = run_backfill(registry, plan, before_backfill, job_runner(spark), run_id, log=quiet)
    assert done["summary"]["batches_run"] == 3, done["summary"]
    assert state_and_output(spark, touched, name) == untouched

    # The first backup restored over the checkpoint.
    restore = plan_restore(name, client, backup=backup["backup_id"], registry=registry,
                           replace=True)  # fmt: skip
    execute_restore(restore, client, registry=registry, log=quiet)
    assert state_and_output(spark, touched, name) == untouched

    # Both go on with new input: the same state and output again.
    for registry_path in (control, touched):
        land(registry_path.parent / "landing", round_=1, files=2)
        run_in_session(spark, registry_path, name)
    assert state_and_output(spark, touched, name) == state_and_output(spark, control, name)
