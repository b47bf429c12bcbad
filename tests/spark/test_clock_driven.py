"""Queries whose batches the clock drives (applyInPandasWithState with a processing-time
timeout: Spark runs a batch that reads nothing on every trigger, so an available-now run never
ends). `stateops run`'s default mode, which is stream_start's run (run_query.py), and the
backfill's reprocessing end, and leave the state (but its wall-clock timeout column) and the
output equal to a continuous run that Spark stopped at the same input; a run that does not
drain within its bound stops after a committed batch and says so. And a first run that Spark
refuses leaves no checkpoint folder behind. Library-level, in the shared Spark session."""

from __future__ import annotations

import contextlib
import threading
import time
from pathlib import Path

import pytest
import yaml

from stateops.control.lock import new_run_id
from stateops.control.target import query_target
from stateops.core.registry import load_registry
from stateops.ops.backfill import plan_backfill, run_backfill
from stateops.ops.backup import backup_first
from stateops.ops.start import _finish_planned, checkpoint_state
from stateops.spark.streaming import (
    apply_query_conf,
    clock_driven,
    query_frame,
    start_query,
    use_code_paths,
)
from tests.spark.harness import (
    _registered_conf,
    fail_once,
    job_in_session,
    job_runner,
    land,
    last_committed,
    quiesce,
    read_sink,
    run_in_session,
    shape_registry,
)

pytestmark = pytest.mark.spark

NAME = "quiet_users"
FILES = 5  # one a batch (maxFilesPerTrigger: 1)
# A run that has not ended by then never will: its queries are stopped so the test fails
# instead of hanging (a clock-driven available-now run ran on for good before).
WATCHDOG_SECONDS = 300


def clock_registry(root: Path, landing: Path | None = None, **transform) -> Path:
    """The shapes' registry (tests/spark/harness.py) and the clock-driven query: views per
    user with a processing-time timeout of an hour, so that nothing times out in a test and
    its output is the same whenever it runs."""
    path = shape_registry(root, landing)
    raw = yaml.safe_load(path.read_text())
    raw["queries"][NAME] = {
        **raw["queries"]["first_views"],  # its source, test-sized settings of RocksDB
        "transform": {"function": "clock:quiet_users", "output_mode": "update", **transform},
        "key_columns": ["user_id"],
        "trigger": {"processing_time": "1 second"},
        "sink": {"format": "parquet", "path": f"output/{NAME}"},
        "checkpoint": f"checkpoints/{NAME}",
    }
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


def set_drain_limit(registry: Path, limit: str | None) -> None:
    """The query's ``trigger.drain_limit`` (None: the default)."""
    raw = yaml.safe_load(registry.read_text())
    trigger = raw["queries"][NAME]["trigger"]
    trigger.pop("drain_limit", None)
    if limit:
        trigger["drain_limit"] = limit
    registry.write_text(yaml.safe_dump(raw, sort_keys=False))


@contextlib.contextmanager
def watchdog(spark, seconds: float = WATCHDOG_SECONDS):
    """Stop every streaming query of the session once ``seconds`` passed; fail if it had to."""
    fired = threading.Event()

    def stop_all() -> None:
        fired.set()
        for streaming in spark.streams.active:
            streaming.stop()

    timer = threading.Timer(seconds, stop_all)
    timer.start()
    try:
        yield
    finally:
        timer.cancel()
    assert not fired.is_set(), f"the run did not end within {seconds} s: its queries were stopped"


def run_continuously(spark, registry: Path) -> None:
    """The control: Spark's own run on the query's processing-time trigger, stopped once it has
    read every file and committed a batch that read nothing after them."""
    reg = load_registry(registry)
    query = reg.query(NAME)
    use_code_paths(reg, spark)
    _registered_conf(spark)  # as job_in_session does for the runs it compares with
    apply_query_conf(spark, query)
    streaming = start_query(spark, query, available_now=False)
    commit = Path(query.checkpoint) / "commits" / str(FILES)
    deadline = time.monotonic() + WATCHDOG_SECONDS
    try:
        while not commit.exists() and streaming.isActive and time.monotonic() < deadline:
            time.sleep(0.2)
        assert streaming.exception() is None, streaming.exception()
        assert commit.exists(), "the continuous control did not read its input in time"
    finally:
        streaming.stop()
        quiesce(spark)


def clock_state_and_output(spark, registry: Path) -> tuple:
    """(the stores Spark lists, the state but its wall-clock timeout, the output batches that
    wrote rows) of the query after its last committed batch. The state is read with Spark's
    own readers, not the library's: every store the checkpoint has, each column but
    ``value.timeoutTimestamp`` (processing time plus the timeout: when the run happened)."""
    query = load_registry(registry).query(NAME)
    checkpoint = query.checkpoint
    batch = last_committed(Path(checkpoint))
    meta = spark.read.format("state-metadata").load(checkpoint).collect()
    stores = sorted((r["operatorId"], r["operatorName"], r["stateStoreName"]) for r in meta)
    df = spark.read.format("statestore").option("batchId", batch).load(checkpoint)
    value = df.schema["value"].dataType.fieldNames()
    assert value == ["groupState", "timeoutTimestamp"], value  # nothing else is left out
    state = sorted(repr(r) for r in df.select("key", "value.groupState", "partition_id").collect())
    quiesce(spark)
    # A batch that read nothing writes an empty folder; how many ran depends on the clock.
    output = {b: rows for b, rows in read_sink(Path(query.sink.path)).items() if rows}
    assert state and output, (state, output)
    return stores, state, output


@pytest.mark.whole
def test_clock_driven_runs_end_and_equal_a_continuous_run(spark, s3, tmp_path, capsys):
    control = clock_registry(tmp_path / "control")
    touched = clock_registry(tmp_path / "touched", landing=control.parent / "landing")
    land(control.parent / "landing", round_=0, files=FILES)
    run_continuously(spark, control)
    expected = clock_state_and_output(spark, control)
    assert expected[0] == [(0, "applyInPandasWithState", "default")], expected[0]

    # `stateops run` as stream_start runs it (run_query.py in its default mode), first with a
    # drain limit it cannot meet: it stops after a committed batch and says so.
    set_drain_limit(touched, "1 second")
    with watchdog(spark):
        bounded = run_in_session(spark, touched, NAME)
    assert bounded["mode"] == "available-now" and bounded["status"] == "succeeded", bounded
    assert "ProcessingTimeTimeout" in bounded["clock_driven"], bounded
    assert bounded["drained"] is False and bounded["uncommitted_batches"] == [], bounded
    assert bounded["last_committed_batch"] is not None, bounded
    said = f"{NAME}: input not drained within trigger.drain_limit 1 second (group state with a"
    assert said in capsys.readouterr().err

    # Again with the default limit: it goes on from there until its input is drained.
    set_drain_limit(touched, None)
    with watchdog(spark):
        ran = run_in_session(spark, touched, NAME)
    assert ran["drained"] is True and ran["uncommitted_batches"] == [], ran
    assert ran["last_committed_batch"] >= FILES - 1, ran
    assert clock_state_and_output(spark, touched) == expected

    # The backfill: rolled back to batch 2 (backup first), so that the last two files are read
    # again (batches that read nothing after them have nothing to read again), reprocessed by
    # run_query.py (available-now) and validated.
    registry, quiet = load_registry(touched), lambda _: None
    run_id = new_run_id("backfill")
    target = query_target(registry, NAME)
    plan = plan_backfill(target, run_id, to_batch=FILES - 3, dry_run=False, log=quiet)
    backup = backup_first(target, s3.client(), "backfill", log=quiet)
    with watchdog(spark):
        done = run_backfill(
            target, plan, run_id=run_id, backup=backup, run_job=job_runner(spark), log=quiet
        )
    summary = done["summary"]
    assert summary["drained"] is True and summary["batches_run"] >= 3, summary
    assert clock_state_and_output(spark, touched) == expected


def test_a_batch_a_stop_left_planned_is_finished_and_nothing_after_it(spark, tmp_path):
    """The drain's safety net, where its stop fell inside a batch. Such a batch made the way
    Spark leaves one: its foreachBatch fails once, after its output, before its commit."""
    reg = load_registry(clock_registry(tmp_path))
    land(tmp_path / "landing", round_=0, files=2)
    query = reg.query(NAME)
    use_code_paths(reg, spark)
    apply_query_conf(spark, query)
    fail_once(spark, query, 1, WATCHDOG_SECONDS)
    assert checkpoint_state(query.checkpoint) == (0, [1])

    with watchdog(spark):
        finished = _finish_planned(spark, query, poll_seconds=0.2)
    error, progress = finished.error, finished.progress
    quiesce(spark)
    assert error is None and [p["batchId"] for p in progress] == [1], (error, progress)
    assert checkpoint_state(query.checkpoint) == (1, [])  # and no batch 2 planned


def test_spark_knows_clock_driven_queries_before_they_start(spark, tmp_path):
    """From the query's plan: a processing-time timeout or transformWithState in
    ProcessingTime mode is clock-driven; event-time ones and no timeout are not."""
    path = clock_registry(tmp_path)
    raw = yaml.safe_load(path.read_text())
    raw["queries"]["ticking_visits"] = {
        **raw["queries"]["page_visits"],
        "processor": {**raw["queries"]["page_visits"]["processor"], "time_mode": "ProcessingTime"},
        "sink": {"format": "parquet", "path": "output/ticking_visits"},  # one writer per sink
        "checkpoint": "checkpoints/ticking_visits",
    }
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    land(tmp_path / "landing", round_=0, files=1)
    registry = load_registry(path)
    use_code_paths(registry)
    found = {n: clock_driven(query_frame(spark, registry.query(n))) for n in registry.queries}
    assert found == {
        **dict.fromkeys(registry.queries),
        NAME: "group state with a processing-time timeout "
        "(FlatMapGroupsInPandasWithState ProcessingTimeTimeout)",
        "ticking_visits": "transformWithState in ProcessingTime time mode "
        "(TransformWithStateInPySpark ProcessingTime)",
    }, found


def test_a_first_run_spark_refuses_leaves_no_checkpoint_folder(spark, tmp_path, capsys):
    """Group state in complete mode: Spark refuses it as the query starts."""
    registry = clock_registry(tmp_path, output_mode="complete")
    land(tmp_path / "landing", round_=0, files=1)
    code, _ = job_in_session(spark, "run_query.py", "--registry", str(registry), "--query", NAME)
    err = capsys.readouterr().err
    assert code == 2, err
    assert f"query {NAME}: Spark cannot start it: " in err, err
    assert "the checkpoint it began is removed" in err, err
    assert not Path(load_registry(registry).query(NAME).checkpoint).exists()
