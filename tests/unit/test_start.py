"""The start's parts that need no Spark: the input a cutover run reads, the run summary the
Spark job hands to its task, and the carry-over proof's verdict (runs on Spark-written
checkpoints: tests/spark/test_run_query.py)."""

from __future__ import annotations

import json
import os
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest

from stateops.control.lock import QueryLock, force_release
from stateops.core.errors import StateOpsError
from stateops.core.registry import load_registry
from stateops.core.storage import begin_unfinished, end_unfinished
from stateops.ops.start import (
    STOP_INSIDE_TRIGGER,
    _discard_failed_start,
    _proof_error,
    _proof_summary,
    _read_nothing,
    _stop_between_batches,
    files_before,
    read_summary,
    refuse_unrunnable,
    write_summary,
)
from tests.conftest import write_registry

pytestmark = pytest.mark.unit

CUTOVER = datetime(2026, 1, 1, 12, tzinfo=UTC)


def _query(tmp_path):
    return load_registry(write_registry(tmp_path / "data")).query("page_visits")


def test_a_new_querys_cutover_reads_the_files_modified_before_it_and_no_hidden_ones(tmp_path):
    query = _query(tmp_path)
    source = tmp_path / "source"
    source.mkdir()
    query = query.model_copy(
        update={"source": query.source.model_copy(update={"path": str(source)})}
    )
    for name, hour in (("a.json", 10), ("b.json", 11), ("c.json", 12), ("_tmp.json", 9), (".x", 9)):
        (source / name).write_text("{}")
        stamp = datetime(2026, 1, 1, hour, tzinfo=UTC).timestamp()
        os.utime(source / name, (stamp, stamp))
    assert files_before(query, CUTOVER) == [source / "a.json", source / "b.json"]


def test_a_missing_source_folder_is_named(tmp_path):
    query = _query(tmp_path)
    missing = tmp_path / "gone"
    query = query.model_copy(
        update={"source": query.source.model_copy(update={"path": str(missing)})}
    )
    with pytest.raises(
        StateOpsError, match=f"^page_visits: source folder {missing} does not exist$"
    ):
        files_before(query, CUTOVER)


def test_a_task_reads_only_the_summary_its_own_run_wrote(tmp_path, monkeypatch):
    registry = load_registry(write_registry(tmp_path / "data"))
    with pytest.raises(StateOpsError, match="no summary of run 'start-1': the Spark job did not"):
        read_summary(registry, "page_visits", "start-1")
    write_summary(registry, {"query": "page_visits", "run_id": "start-1", "batches_run": 2})
    write_summary(registry, {"query": "page_visits", "run_id": "start-2", "batches_run": 3})
    assert read_summary(registry, "page_visits", "start-1")["batches_run"] == 2, "by run id"
    latest = json.loads(registry.run_summary_path("page_visits").read_text())
    assert latest["run_id"] == "start-2", "the status reads the latest"
    with pytest.raises(StateOpsError, match="no summary of run 'start-3'"):
        read_summary(registry, "page_visits", "start-3")
    monkeypatch.setattr("stateops.ops.start.KEPT_SUMMARIES", 2)
    write_summary(registry, {"query": "page_visits", "run_id": "start-3", "batches_run": 4})
    with pytest.raises(StateOpsError, match="no summary of run 'start-1'"):
        read_summary(registry, "page_visits", "start-1")  # the oldest beyond the kept ones
    assert read_summary(registry, "page_visits", "start-2")["batches_run"] == 3


def _proof(ok: bool) -> dict:
    variables = [
        {
            "variable": "visits",
            "kind": "value",
            "batch": b,
            "ok": ok or b == 3,
            "actual_rows": rows,
            "expected_rows": 5,
            "actual_checksum": "a",
            "expected_checksum": "e",
        }
        for b, rows in ((3, 5), (4, 5 if ok else 4))
    ]
    return {
        "ok": ok,
        "sample": False,
        "seconds": 1.5,
        "batches": [3, 4],
        "reference": "old",
        "variables": variables,
        "watermarks": [],
        "proof_file": "/p/proof.json",
        "query": "page_visits",
        "carried": "old state",
        "input_files": 1,
        "input_rows": 2,
    }


def test_the_run_summary_keeps_the_proofs_last_batch_and_a_failure_says_what_and_where(capsys):
    assert _proof_summary(None) is None
    summary = _proof_summary(_proof(ok=False))
    assert summary["variables"] == {"visits": 4}, "the last batch's rows"
    assert summary["ok"] is False and summary["proof_file"] == "/p/proof.json"
    assert _proof_error(_proof(ok=True)) is None
    assert _proof_error(_proof(ok=False)) == (
        "carry-over proof failed: batch 4 visits: 4 rows, expected 5; details in /p/proof.json; "
        "move the checkpoint aside and carry the state over again"
    )
    assert "NOT PROVEN: state of page_visits after batches 3-4" in capsys.readouterr().err


def _sources(*moves: tuple[object, object]) -> dict:
    return {"sources": [{"startOffset": a, "endOffset": b} for a, b in moves]}


def test_a_clock_driven_run_is_drained_once_a_trigger_planned_no_new_input():
    """Progress events as Spark 4.2 reports them for a file source (tests/spark/
    test_clock_driven.py runs the drain itself)."""
    first, after = {"logOffset": 0}, {"logOffset": 1}
    assert not _read_nothing(_sources((None, first)))  # batch 0 of a new query
    assert not _read_nothing(_sources((first, after)))  # a data batch (an empty file too)
    assert not _read_nothing(_sources((first, first), (first, after)))  # one source moved on
    assert _read_nothing(_sources((after, after), (first, first)))  # read nothing / idle
    assert _read_nothing(_sources((None, None)))  # nothing landed yet


_WAITING = {"isTriggerActive": False, "message": "Waiting for next trigger"}
_ACTIVE = {"isTriggerActive": True, "message": "Processing new data"}


class _Idle:
    """A streaming query between triggers whose stop takes ``stop_seconds`` to arrive."""

    def __init__(self, stop_seconds: float):
        self.isActive, self.stop_seconds = True, stop_seconds
        self.status = _WAITING
        self.lastProgress = {"batchId": 4, "timestamp": "t"}

    def stop(self):
        import time

        time.sleep(self.stop_seconds)
        self.isActive = False


@pytest.mark.parametrize("late", [False, True], ids=["in time", "late"])
def test_a_drains_stop_that_lands_after_the_next_trigger_was_due_says_it_may_be_inside(
    tmp_path, capsys, late
):
    """A stop sent in a gap that took longer than the gap to arrive (seen on a loaded machine)
    says so: what it interrupted may log a trace (docs/limits.md), which the tests then allow."""
    streaming = _Idle(stop_seconds=1.1 if late else 0)
    _stop_between_batches(streaming, _query(tmp_path))
    said = capsys.readouterr().err
    assert not streaming.isActive
    assert (STOP_INSIDE_TRIGGER in said) == late, said
    if late:
        assert f"it may have {STOP_INSIDE_TRIGGER} 4" in said, said


class _Overran(_Idle):
    """A query whose trigger overran its interval: the next one begins at once, right after
    one status that says it waits (Spark's ProcessingTimeExecutor), and runs a while."""

    def __init__(self):
        super().__init__(stop_seconds=0)
        self.statuses = [_WAITING] + [_ACTIVE] * 5
        self.read = 0  # statuses read so far
        self.stopped_after = None

    @property
    def status(self):
        self.read += 1
        return self.statuses[self.read - 1] if self.read <= len(self.statuses) else _WAITING

    @status.setter
    def status(self, _):
        pass

    def stop(self):
        self.stopped_after = self.read
        super().stop()


def test_a_drains_stop_is_not_sent_in_the_instant_between_an_overrun_trigger_and_the_next(
    tmp_path,
):
    """Seen in the whole proof: the stop of a TTL query's drain, sent on one status that said
    it waited, interrupted the next trigger (a trace, and no line that said so)."""
    streaming = _Overran()
    _stop_between_batches(streaming, _query(tmp_path))
    # two looks in a row after the trigger (more where a look fell in the margin before the
    # next one was due: it starts the count again)
    assert streaming.stopped_after >= len(streaming.statuses) + 2, streaming.stopped_after


def test_a_failed_first_start_leaves_no_checkpoint_folder_and_a_committed_one_stays(tmp_path):
    query = _query(tmp_path)
    checkpoint = tmp_path / "data" / "checkpoints" / "page_visits"
    assert query.checkpoint == str(checkpoint)
    assert not _discard_failed_start(query, fresh=True)  # nothing there: nothing to do
    checkpoint.mkdir(parents=True)  # what a start Spark refused left (Spark 4.2)
    assert _discard_failed_start(query, fresh=True) and not checkpoint.exists()
    (checkpoint / "offsets").mkdir(parents=True)  # a batch 0 that failed
    (checkpoint / "metadata").write_text("{}")
    (checkpoint / "offsets" / "0").write_text("v1")
    assert not _discard_failed_start(query, fresh=False)  # it was there before this start
    assert _discard_failed_start(query, fresh=True) and not checkpoint.exists()
    (checkpoint / "commits").mkdir(parents=True)
    (checkpoint / "commits" / "0").write_text("v1")
    assert not _discard_failed_start(query, fresh=True) and checkpoint.exists()


def test_a_failed_first_start_that_lost_its_lease_removes_nothing(tmp_path, capsys):
    """Its lease taken over, the next holder is running batch 0 in that checkpoint: the
    failed first run leaves it alone, and says why."""
    query = _query(tmp_path)
    registry = load_registry(write_registry(tmp_path / "data"))
    checkpoint = Path(query.checkpoint)
    (checkpoint / "offsets").mkdir(parents=True)
    (checkpoint / "offsets" / "0").write_text("the next holder's batch 0")
    with QueryLock(registry.lock_path(query.name), query.name, "run", ttl_seconds=60) as lock:
        force_release(lock.path)
        QueryLock(lock.path, query.name, "run", run_id="next").acquire()  # another host's
        time.sleep(1.0)  # the guard asks the store at most once a second
        assert not _discard_failed_start(query, fresh=True)
    assert (checkpoint / "offsets" / "0").read_text() == "the next holder's batch 0"
    assert "what the failed first run began stays" in capsys.readouterr().err


def test_a_start_refuses_a_checkpoint_a_restore_left_half_published(tmp_path):
    """A restore into an S3 prefix killed mid-publish leaves any subset of the checkpoint and
    its marker: a start on another host must not run Spark on it (it would take it for a new
    query, or resume from whatever logs arrived)."""
    registry = load_registry(write_registry(tmp_path / "data"))
    query = registry.query("page_visits")
    checkpoint = Path(query.checkpoint)
    begin_unfinished(checkpoint)
    (checkpoint / "offsets").mkdir()
    (checkpoint / "offsets" / "0").write_text("v1")  # what arrived before the kill
    with pytest.raises(StateOpsError, match="a restore or transplant into it was interrupted"):
        refuse_unrunnable(registry, query)
    end_unfinished(checkpoint)
    refuse_unrunnable(registry, query)


TRANSIENT = "org.apache.spark.SparkException: Python worker failed to connect back."


@pytest.mark.parametrize(
    "attempts, runs, error, progress",
    [
        # A transient failure: the query runs once more, and the run is the two together.
        ([(False, TRANSIENT, [1]), (False, None, [2, 3])], 2, None, [1, 2, 3]),
        # Twice in a row: the second is the run's error, no third start.
        ([(False, TRANSIENT, []), (False, TRANSIENT, [])], 2, TRANSIENT, []),
        # Any other failure is the run's error at once.
        ([(False, "boom", [1])], 1, "boom", [1]),
        # A stop request was taken (continuous mode): the operator's stop stands.
        ([(True, TRANSIENT, [1])], 1, TRANSIENT, [1]),
    ],
)
def test_a_run_restarts_once_after_a_transient_spark_failure(
    monkeypatch, tmp_path, capsys, attempts, runs, error, progress
):
    import stateops.ops.start as start

    left = [start._Ran(stopped, err, list(p)) for stopped, err, p in attempts]
    calls = []

    def once(spark, query, stop, poll_seconds, until_batch, initial_state):
        calls.append(initial_state)
        return left.pop(0)

    monkeypatch.setattr(start, "_run_stream_once", once)
    query = _query(tmp_path)
    ran = start._run_stream(None, query, None, 1.0, None, "the initial state")
    assert (len(calls), ran.error, ran.progress) == (runs, error, progress)
    assert calls == ["the initial state"] * runs  # batch 0 may not have committed: passed again
    said = capsys.readouterr().err
    assert ("restarting the query once" in said) == (runs == 2), said
