"""Run a registered query under its lifecycle lock and summarise the run (Spark-side).

The one run path of the project: ``run_query.py`` and ``bootstrap_state.py`` both call
:func:`run_start`. PySpark is imported lazily.
"""

from __future__ import annotations

import functools
import json
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote, urlparse

from stateops.control.audit import append_audit
from stateops.control.lock import (
    CHECKPOINTS,
    QueryLock,
    new_run_id,
    read_hold,
    release_hold,
    require_conditional_writes,
)
from stateops.control.markers import clear_carry_over, holder_marker, refuse_retired, take_stop
from stateops.control.target import Target
from stateops.core import fence
from stateops.core.checkpoint import interrupted_batch, load_checkpoint
from stateops.core.errors import LeaseLostError, StateOpsError, one_line, query_error_line
from stateops.core.registry import Query, Registry, Trigger
from stateops.core.staging import has_entries, occupied
from stateops.core.storage import S3Path, location, remove_all, write_file
from stateops.ops.pending import killed_repartition, pending_carry_over, refuse_pending_rollback
from stateops.ops.repartition import proof_path, repartition_locked, undo_repartition_locked

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming import StreamingQuery

__all__ = [
    "checkpoint_state",
    "files_before",
    "read_summary",
    "refuse_unrunnable",
    "run_start",
    "summary_line",
    "write_summary",
]


def checkpoint_state(checkpoint: str) -> tuple[int | None, list[int]]:
    """Last committed batch and planned-but-uncommitted batches; (None, []) for a new query.

    Anything already in the folder goes through the checkpoint model first, so a damaged
    checkpoint is a one-line error here rather than a Spark stack trace.
    """
    path = location(checkpoint)
    if not has_entries(path):
        return None, []
    cp = load_checkpoint(path)
    return cp.last_committed_batch, cp.uncommitted_batches


def files_before(query: Query, before: datetime) -> list[Path]:
    """The query's input files not read yet and modified before ``before`` (a cutover).

    Refused when the query already read, or planned to read, a file modified at or after it:
    that input is past the cutover, and it cannot be taken back.
    """
    path = location(query.checkpoint)
    seen = set()
    if has_entries(path):
        cp = load_checkpoint(path)
        if cp.uncommitted_batches:
            raise StateOpsError(
                f"{query.name}: {interrupted_batch(cp.uncommitted_batches[0])}: finish it with "
                f"stateops run {query.name} (or drop it: "
                f"stateops rollback {query.name} --to-batch {cp.last_committed_batch}), then "
                "cut over"
            )
        seen = cp.seen_files()
    limit = before.timestamp()
    pending, past = [], []
    folder = Path(query.source.path)
    if not folder.is_dir():
        raise StateOpsError(f"{query.name}: source folder {folder} does not exist")
    for file in folder.iterdir():
        if file.name.startswith((".", "_")) or not file.is_file():
            continue
        modified = file.stat().st_mtime
        if str(file) in seen:
            past += [file] if modified >= limit else []
        elif modified < limit:
            pending.append(file)
    if past:
        raise StateOpsError(
            f"{query.name} already read {len(past)} input files modified at or after the "
            f"cutover {before.isoformat()} (e.g. {past[0].name}); choose a later cutover"
        )
    return sorted(pending)


def await_run(
    streaming, stop: Callable[[], bool] | None, poll_seconds: float, until_batch: int | None = None
) -> bool:
    """Wait for the query to end, or (continuous mode) for a stop request (``stop()`` takes it),
    or until batch ``until_batch`` has committed; True if it stopped the query."""
    while streaming.isActive:
        last = streaming.lastProgress
        if until_batch is not None and last and last["batchId"] >= until_batch:
            streaming.stop()
            return True
        if stop is not None and stop():
            # Graceful: let the current batch commit before stopping. A trigger may still start
            # in between; the summary then lists that batch as uncommitted.
            while streaming.isActive and streaming.status["isTriggerActive"]:
                time.sleep(0.2)
            streaming.stop()
            return True
        streaming.awaitTermination(poll_seconds)
    return False


# A clock-driven query's available-now run goes on this processing-time trigger: short, so a
# backlog is not paced by it, and not zero, so that batches that read nothing can leave a gap to
# stop in.
_DRAIN_MS = 1000
DRAIN_TRIGGER = f"{_DRAIN_MS} milliseconds"
# Send a stop in a gap only this long or more before the next trigger is due (triggers fall on
# multiples of the interval since the epoch); a stop takes a few milliseconds to arrive on an
# idle machine, and was seen to take more than 100 on a loaded one.
_STOP_MARGIN_MS = 300
# How long to wait for such a gap: batches that read nothing vary in length, and one shorter
# than the interval leaves one.
_GAP_WAIT_INTERVALS = 10


def await_drained(streaming: StreamingQuery, query: Query, limit_seconds: float) -> bool:
    """Wait for a clock-driven query's input to drain, then stop it between batches
    (:func:`_stop_between_batches`): True once a trigger found no new input (a batch that read
    nothing has committed, or there was nothing to run), False when ``limit_seconds`` passed
    first."""
    deadline = time.monotonic() + limit_seconds
    while streaming.isActive:
        last = streaming.lastProgress
        drained = last is not None and _read_nothing(json.loads(last.json))
        if drained or time.monotonic() >= deadline:
            _stop_between_batches(streaming, query)
            return drained
        time.sleep(0.1)
    return False


def _read_nothing(progress: dict[str, Any]) -> bool:
    """A trigger that planned no new input: every source ends where it started (a data
    batch's sources move on, even for an empty file)."""
    return all(s["startOffset"] == s["endOffset"] for s in progress["sources"])


# What a drain says when its stop may have fallen inside a trigger: what that stop interrupts in
# Spark may log a trace (docs/limits.md); the batch it left planned is finished by the next run.
STOP_INSIDE_TRIGGER = "stopped inside the trigger after batch"


def _stop_between_batches(streaming: StreamingQuery, query: Query) -> None:
    """Stop in a gap between triggers. Where none comes (batches back to back, each slower
    than the interval), as soon as a batch has committed (its progress event is new: the next
    trigger is listing its sources) and never while the query's foreachBatch function runs. A
    stop inside a trigger (seen: writing the offsets, or in the Python foreachBatch call) can
    kill Spark 4.2's stream thread with a StackOverflowError, from its check of whether the
    error is an interruption; the query is stopped all the same, and a batch the stop left
    planned is finished by :func:`_run_stream`."""
    from stateops.spark.streaming import writing

    give_up = time.monotonic() + _GAP_WAIT_INTERVALS * _DRAIN_MS / 1000
    seen = _event(streaming)
    due = None  # when the next trigger was due as the gap was found (epoch milliseconds)
    waiting = 0  # polls in a row that found the query waiting for its next trigger
    while streaming.isActive:
        now = time.time() * 1000
        to_next = _DRAIN_MS - now % _DRAIN_MS
        # Waiting twice in a row, not once: a trigger that overran its interval is followed by
        # the next at once, whatever the clock says (Spark's ProcessingTimeExecutor), so one
        # poll may fall in the instant between them.
        waiting = waiting + 1 if to_next > _STOP_MARGIN_MS and _waiting(streaming) else 0
        if waiting == 2:
            due = now + to_next
            break
        event = _event(streaming)
        if time.monotonic() > give_up and event != seen and not writing(query):
            print(
                f"{query.name}: no gap between triggers: {STOP_INSIDE_TRIGGER} {event[0]}",
                file=sys.stderr,
            )
            break
        seen = event
        time.sleep(0.01)
    streaming.stop()
    if due is not None and time.time() * 1000 >= due:
        # the stop took longer than the gap (a busy machine): the next trigger may have begun
        print(
            f"{query.name}: the stop came after the next trigger was due: it may have "
            f"{STOP_INSIDE_TRIGGER} {_event(streaming)[0]}",
            file=sys.stderr,
        )


def _waiting(streaming: StreamingQuery) -> bool:
    """Between triggers: no trigger active and the stream thread past its trigger's end (one
    status, read at once)."""
    status = streaming.status
    return not status["isTriggerActive"] and status["message"] == "Waiting for next trigger"


def _event(streaming: StreamingQuery) -> tuple[Any, Any]:
    last = streaming.lastProgress
    return (last["batchId"], last["timestamp"]) if last else (None, None)


def _cutover_run(query: Query, cutover: datetime, first: int) -> tuple[Query, list[Path], int]:
    """The query as a cutover run runs it: one batch of exactly the input files not read yet
    and modified before ``cutover`` (Spark refuses ``modifiedBefore`` on streams); those files,
    and the batch after which it stops."""
    pending = files_before(query, cutover)
    print(
        f"{query.name}: {len(pending)} input files modified before "
        f"{cutover.isoformat()} not read yet",
        file=sys.stderr,
    )
    options = {**query.source.options, "maxFilesPerTrigger": max(len(pending), 1)}
    query = query.model_copy(
        update={"source": query.source.model_copy(update={"options": options})}
    )
    return _one_batch(query), pending, first if pending else first - 1


def _one_batch(query: Query) -> Query:
    """``query`` on a day-long trigger: a run that stops once the batch it waits for has
    committed starts nothing after it."""
    return query.model_copy(update={"trigger": Trigger(processing_time="24 hours")})


def _run(start: _Start, poll_seconds: float) -> _Ran:
    """The query's run from batch ``start.first``."""
    spark, query, stop, carried = start.spark, start.query, start.stop, start.carried
    if carried and start.before is None and carried.get("origin"):
        # from a state export: batch 0 is the image of the exported batch
        return _run_image_batch(
            spark, query, stop, poll_seconds, start.initial_state, carried["origin"]
        )
    if start.until_batch is None or start.until_batch >= start.first:
        return _run_stream(spark, query, stop, poll_seconds, start.until_batch, start.initial_state)
    return _Ran()  # a cutover with nothing before it: starting would read past it


def _proof_error(proof: dict[str, Any]) -> str | None:
    """Print the carry-over proof; the run's error if it failed."""
    from stateops.spark.proof import format_proof, proof_failures

    print(format_proof(proof), end="", file=sys.stderr)
    if proof["ok"]:
        return None
    return (
        f"carry-over proof failed: {proof_failures(proof)}; details in {proof['proof_file']}; "
        "move the checkpoint aside and carry the state over again"
    )


def run_start(
    target: Target,
    *,
    mode: str = "available-now",
    run_id: str | None = None,
    poll_seconds: float = 1.0,
    operation: str = "run",
    prepare: Callable[[SparkSession], dict[str, Any]] | None = None,
    cutover: datetime | None = None,
) -> dict[str, Any]:
    """Run ``target``, a registered query, under its lock; returns the run summary (also audited).

    ``prepare`` runs under the lock before the query starts (bootstrap validates its initial
    state there). While a bootstrap is pending, the initial state is passed on this start;
    the first batch after a bootstrap or a transplant is proven (:mod:`stateops.spark.proof`).
    With a ``cutover``, the run reads exactly the input files not read yet and modified before
    it, in one batch (Spark refuses ``modifiedBefore`` on streams): ``maxFilesPerTrigger`` is
    their number, the trigger a long one, and the query stops once that batch commits.
    """
    from stateops.spark.streaming import fenced, fenced_logs

    registry = target.require_registry()
    query = target.require_query("run a registered query: give its name")
    run_id = run_id or new_run_id(operation)
    with (
        target.lock(operation, run_id) as lock,
        fenced(query.name, functools.partial(lock.ensure, fresh=0)),
    ):
        start = _begin(registry, query, mode, lock, operation, prepare, cutover)
        with (
            _stopped_when_lost(lock, start.spark, query.name),
            fenced_logs(start.spark, holder_marker(query.checkpoint), lock.token),
        ):
            ran = _run_started(start, poll_seconds)
        end = _end(registry, start, ran)
        if lock.lost and not end["error"]:
            end["error"] = lock.lost_line()
        summary = _summary(start, ran, end, run_id=run_id, mode=mode, lock_lost=lock.lost)
        _audit(summary)
        _record_history(registry, query, summary)
        if summary["status"] == "succeeded":
            _end_backfill_hold(lock)
    return summary


def _end_backfill_hold(lock: QueryLock) -> None:
    """A backfill holds its query from its rollback until its reprocessing has run
    (:func:`stateops.ops.backfill.rollback_for_backfill`): this run, when it is that
    reprocessing (the backfill's run id: its task, or the run its status advises after it
    was killed), ends the hold."""
    hold = read_hold(lock.path)
    if hold is not None and hold.operation == "backfill" and hold.run_id == lock.run_id:
        release_hold(lock.path, lock.run_id)


@contextmanager
def _stopped_when_lost(lock: QueryLock, spark: SparkSession, name: str) -> Iterator[None]:
    """While this lasts, a watcher checks the run's lease every tenth of its TTL (asking the
    store) and stops the query once it may be lost: taken over, released, or past the
    holder's deadline. An idle continuous query runs no batch and would never meet the
    batch's fence; stopped, it writes nothing more and takes no stop request meant for the
    lease's new holder."""
    done = threading.Event()

    def watch() -> None:
        while not done.wait(min(lock.ttl / 10, 30.0)):
            try:
                lock.ensure(fresh=0)
            except LeaseLostError:
                print(f"{name}: {lock.lost_line()}: stopping the query", file=sys.stderr)
                for streaming in spark.streams.active:
                    if streaming.name == name:
                        streaming.stop()
                return

    watcher = threading.Thread(target=watch, name=f"lease-watch-{name}", daemon=True)
    watcher.start()
    try:
        yield
    finally:
        done.set()
        watcher.join()


@dataclass
class _Start:
    """What a start knows once it is ready to run, under the lock."""

    query: Query
    operation: str
    spark: SparkSession
    stop: Callable[[], bool] | None
    fresh: bool
    """The checkpoint was missing or empty (:func:`_discard_failed_start`)."""
    started: float
    before: int | None
    first: int
    until_batch: int | None
    pending: list[Path] | None
    """A cutover run's input files (None: not a cutover)."""
    prepared: dict[str, Any] | None
    carried: dict[str, Any] | None
    initial_state: Any
    repartitioned: dict[str, Any] | None


def _begin(
    registry: Registry,
    query: Query,
    mode: str,
    lock: QueryLock,
    operation: str,
    prepare: Callable[[SparkSession], dict[str, Any]] | None,
    cutover: datetime | None,
) -> _Start:
    """Before the run, under the lock: the refusals, the checkpoint's last batch, a cutover's
    one batch, the Spark session, ``prepare``, and the state
    carried over (repartitioned first where a transplant needs it)."""
    from stateops.spark.streaming import build_session, use_code_paths

    run_id = lock.run_id
    # Only a stop addressed to this run's lease stops it (a stale one is taken and ignored).
    stop = functools.partial(take_stop, registry, query.name, lock.token)
    stop = stop if mode == "continuous" else None
    refuse_unrunnable(registry, query, undo=True)
    fresh = not occupied(query.checkpoint)
    before, _ = checkpoint_state(query.checkpoint)
    first = 0 if before is None else before + 1
    started = time.time()
    until_batch, pending = None, None
    if cutover is not None and not all(s.kind.cuts_at_time for s in query.inputs.values()):
        # A topic has no files to pick by time: the cutover run reads it to its end (the
        # migration then refuses input left unread), and the time starts the new source.
        print(
            f"{query.name}: {query.inputs_text} read to its end (the cutover time "
            f"{cutover.isoformat()} starts the new source)",
            file=sys.stderr,
        )
        cutover = None
    if cutover is not None:
        query, pending, until_batch = _cutover_run(query, cutover, first)
        stop = None
    holder = holder_marker(query.checkpoint)
    if isinstance(holder, S3Path):  # Spark's log files are conditional creates (fenced_logs)
        require_conditional_writes(holder, CHECKPOINTS)
    spark = build_session(query, app_name=f"stateops-{operation}-{query.name}")
    use_code_paths(registry, spark)
    prepared = prepare(spark) if prepare else None
    carried, initial_state = _carried(spark, registry, query, before)
    repartitioned = None
    if carried and carried.get("partitions") and before == carried["batch"]:
        repartitioned = _repartition_carried(spark, query, carried["partitions"], run_id)
        before, first = repartitioned["batch"], repartitioned["batch"] + 1
    return _Start(
        query=query,
        operation=operation,
        spark=spark,
        stop=stop,
        fresh=fresh,
        started=started,
        before=before,
        first=first,
        until_batch=until_batch,
        pending=pending,
        prepared=prepared,
        carried=carried,
        initial_state=initial_state,
        repartitioned=repartitioned,
    )


def _run_started(start: _Start, poll_seconds: float) -> _Ran:
    """The run; where a first run fails to start, what it began is removed and said."""
    try:
        return _run(start, poll_seconds)
    except Exception as err:
        if not _discard_failed_start(start.query, start.fresh):
            raise
        if isinstance(err, StateOpsError):  # Spark refused it: say that nothing is left
            raise StateOpsError(f"{one_line(err)}{_DISCARDED}") from err
        raise


def _end(registry: Registry, start: _Start, ran: _Ran) -> dict[str, Any]:
    """After the run: the batches it committed, a cutover's check, the carried-over state
    settled and proven, and the run's error (a failed first run's checkpoint removed)."""
    query = start.query
    after, uncommitted = checkpoint_state(query.checkpoint)
    committed = [] if after is None else list(range(start.first, after + 1))
    error = ran.error
    if start.pending is not None and not error:
        error = _cutover_mismatch(query, start.pending, committed)
    bootstrap, proof, error = _settle(
        start.spark,
        registry,
        query,
        start.carried,
        start.initial_state,
        after != start.before,
        error,
    )
    if error and _discard_failed_start(query, start.fresh):
        error = f"{query_error_line(error)}{_DISCARDED}"
    return {
        "after": after,
        "uncommitted": uncommitted,
        "committed": committed,
        "error": error,
        "bootstrap": bootstrap,
        "proof": proof,
    }


def _summary(
    start: _Start, ran: _Ran, end: dict[str, Any], *, run_id: str, mode: str, lock_lost: bool
) -> dict[str, Any]:
    """The run summary (:func:`write_summary`, :func:`summary_line`)."""
    from stateops.spark.jobs import launched_with
    from stateops.spark.streaming import progress_summary

    error, committed, carried = end["error"], end["committed"], start.carried
    return {
        "query": start.query.name,
        "operation": start.operation,
        "run_id": run_id,
        "mode": mode,
        "clock_driven": ran.clock_driven,
        "drained": ran.drained,
        "master": start.spark.sparkContext.master,
        "launched_with": launched_with(start.spark, start.query.submit),
        "status": "failed" if error else "succeeded",
        "error": query_error_line(error) if error else None,
        "stopped_by_marker": ran.stopped,
        "started_at": datetime.fromtimestamp(start.started, UTC).isoformat(timespec="seconds"),
        "duration_seconds": round(time.time() - start.started, 1),
        "checkpoint": start.query.checkpoint,
        "logic": start.query.logic,
        "last_committed_batch_before": start.before,
        "last_committed_batch": end["after"],
        "uncommitted_batches": end["uncommitted"],
        "batches_run": len(committed),
        "first_batch_id": committed[0] if committed else None,
        "last_batch_id": committed[-1] if committed else None,
        "lock_lost": lock_lost,
        "bootstrap": end["bootstrap"],
        "carry_over": carried.get("road", "initial_state") if carried else None,
        "repartitioned": start.repartitioned,
        "proof": _proof_summary(end["proof"]),
        "prepared": start.prepared,
        **progress_summary(ran.progress),
    }


def summary_line(summary: dict[str, Any]) -> str:
    """A run summary in one line, as the ``record`` tasks of the DAGs and ``stateops backfill``
    say it: a bootstrap's carried-over state, else the batches run and the rows they read."""
    last = f"last committed batch {summary['last_committed_batch']}"
    if summary["operation"] == "bootstrap":
        carried = (
            f"{summary['prepared']['rows']} initial rows"
            if summary["prepared"]
            else "state files transplanted"
        )
        return f"{summary['query']}: bootstrap {summary['bootstrap']}, {carried}, {last}"
    batches = "no new input"
    if summary["batches_run"]:
        batches = (
            f"{summary['batches_run']} batches "
            f"({summary['first_batch_id']}..{summary['last_batch_id']})"
        )
    return (
        f"{summary['query']}: {summary['status']}, {batches}, {summary['input_rows']} input "
        f"rows, {last}"
    )


_DISCARDED = " (nothing was committed; the checkpoint it began is removed)"


def _discard_failed_start(query: Query, fresh: bool) -> bool:
    """Whether it removed what a failed first run (``fresh``: the checkpoint was missing or
    empty before it) left without a commit: nothing, a folder Spark refused to start in, or a
    planned batch 0 that pins the settings it failed with (Spark takes a restart's state store
    and shuffle settings from the offset log), so the corrected entry starts afresh."""
    path = location(query.checkpoint)
    if not fresh or has_entries(path / "commits") or not path.exists():
        return False
    try:
        fence.guard()  # the lease's next holder may be writing there now: not ours to remove
    except LeaseLostError as lost:
        print(f"{query.name}: what the failed first run began stays: {lost}", file=sys.stderr)
        return False
    remove_all(path)
    return True


def _carried(
    spark: SparkSession, registry: Registry, query: Query, before: int | None
) -> tuple[dict[str, Any] | None, Any]:
    """The carried-over state awaiting this start's first batch, and its initial state (a
    DataFrame, on the initialState road) or None."""
    from stateops.spark.initial_state import read_initial_state

    carried = pending_carry_over(query, before)
    if carried and "initial_state" in carried:
        return carried, read_initial_state(
            spark, query, carried["initial_state"], carried["format"]
        )
    return carried, None


def refuse_unrunnable(registry: Registry, query: Query, *, undo: bool = False) -> None:
    """Refuse a checkpoint no start may run on: one under a retirement hold (a migration's old
    checkpoint, or a failed one's new checkpoint set aside: docs/migration-on-s3.md), a
    rollback or repartition half done. Except a
    repartition that a killed start of a transplanted checkpoint left
    (:func:`stateops.ops.pending.killed_repartition`): the next start repartitions again,
    having undone it first (``undo``, under the lock)."""
    refuse_retired(query.checkpoint)
    killed = killed_repartition(query) is not None
    if killed and undo:
        undo_repartition_locked(query.checkpoint, log=_stderr)
    refuse_pending_rollback(query.checkpoint, redone=killed)


def _repartition_carried(
    spark: SparkSession, query: Query, partitions: int, run_id: str
) -> dict[str, Any]:
    """Spark's repartition of a transplanted checkpoint to the query's count, before its first
    batch (:func:`stateops.ops.pending.mark_transplant`): batch N + 1, proven, undone if it
    fails (:func:`stateops.ops.repartition.repartition_locked`; the start holds the lock)."""
    from stateops.spark.repartition import repartition_and_prove

    def submit(plan: dict[str, Any]) -> None:
        repartition_and_prove(
            spark, query.checkpoint, plan["partitions"], proof_path(query.checkpoint, run_id)
        )

    done = repartition_locked(query.checkpoint, partitions, run_id, submit=submit, log=_stderr)
    return {
        "batch": done["batch"],
        "partitions": [done["partitions_before"], partitions],
        "proof": done["proof"]["summary"],
        "seconds": done["seconds"],
    }


def _stderr(line: str) -> None:
    print(line, file=sys.stderr)


def _settle(
    spark: SparkSession,
    registry: Registry,
    query: Query,
    carried: dict[str, Any] | None,
    initial_state: Any,
    committed: bool,
    error: Any,
) -> tuple[str | None, dict[str, Any] | None, Any]:
    """(bootstrap status, proof, the run's error) once the run ended: a carry-over is complete
    once a batch committed with the carried state, and then proven unless the run failed."""
    if not carried:
        return None, None, error
    if not committed:
        return "pending", None, error
    clear_carry_over(query.checkpoint)
    if error:
        return "complete", None, error
    proof = _prove(spark, query, carried, initial_state)
    return "complete", proof, _proof_error(proof)


def _audit(summary: dict[str, Any]) -> None:
    """The run's line in its checkpoint's audit log."""
    proof = summary["proof"]
    append_audit(
        summary["checkpoint"],
        summary["operation"],
        run_id=summary["run_id"],
        result=summary["status"],
        batch_before=summary["last_committed_batch_before"],
        batch_after=summary["last_committed_batch"],
        mode=summary["mode"],
        batches_run=summary["batches_run"],
        bootstrap=summary["bootstrap"],
        proof=None if proof is None else proof["ok"],
        logic=summary.get("logic"),
    )


def _record_history(registry: Registry, query: Query, summary: dict[str, Any]) -> None:
    """The run's figures in the query's history (:mod:`stateops.control.history`). Figures
    that cannot be written are said; the run's outcome stands."""
    from stateops.control.history import record, run_point

    try:
        record(registry, query.name, run_point(summary))
    except (StateOpsError, OSError) as err:
        said = f"warning: {query.name}: the run's figures were not recorded: {one_line(err)}"
        print(said, file=sys.stderr)


def _cutover_mismatch(query: Query, pending: list[Path], committed: list[int]) -> str | None:
    """Why a cutover run did not read exactly ``pending`` in one batch (None if it did):
    Spark may skip files (``maxFileAge``) or list others than the folder's own files."""
    read = set()
    if committed:
        read = {
            unquote(urlparse(f["path"]).path)
            for b in committed
            for f in load_checkpoint(query.checkpoint).input_files(b)
        }
    if len(committed) == (1 if pending else 0) and read == {str(p) for p in pending}:
        return None
    return (
        f"the cutover run read {len(read)} files in {len(committed)} batches, not the "
        f"{len(pending)} files modified before the cutover in one batch; inspect the source "
        "log (stateops inspect) before going on"
    )


@dataclass
class _Ran:
    """What a run of the stream did."""

    stopped: bool = False
    """Stopped by a stop request (continuous mode)."""
    error: Any = None
    progress: list = field(default_factory=list)
    clock_driven: str | None = None
    """What makes the clock drive its batches (:func:`stateops.spark.streaming.clock_driven`)."""
    drained: bool | None = None
    """An available-now run of a clock-driven query: its input drained (False: stopped at its
    ``trigger.drain_limit``)."""

    def then(self, more: _Ran) -> _Ran:
        """This run followed by ``more``."""
        return _Ran(
            more.stopped,
            more.error,
            self.progress + more.progress,
            self.clock_driven or more.clock_driven,
            more.drained,
        )


# Spark gives a Python worker it starts on its own (not forked by its daemon: the driver-side
# worker of a transformWithStateInPandas query, among others) a fixed 10 s to connect back; on a
# machine busy enough that the new Python process gets too little CPU, the batch fails with this
# and nothing of it committed. A restart runs the batch again (Spark's own recovery); a second
# such failure in a row is the run's error.
TRANSIENT_SPARK_ERRORS = ("Python worker failed to connect back",)


def _run_stream(spark: SparkSession, query: Query, *args: Any) -> _Ran:
    """:func:`_run_stream_once` (same arguments), run again once after a transient failure of
    Spark's (not after a stop request was taken: the operator asked for the query to stop)."""
    ran = _run_stream_once(spark, query, *args)
    if ran.stopped or not is_transient(ran.error):
        return ran
    print(
        f"{query.name}: {str(ran.error).splitlines()[0]} (Spark gives a Python worker it "
        "starts itself a fixed 10 s to connect back; a busy machine can miss it): restarting "
        "the query once",
        file=sys.stderr,
    )
    return ran.then(_run_stream_once(spark, query, *args))


def is_transient(error: Any) -> bool:
    """Whether a query's failure is one of :data:`TRANSIENT_SPARK_ERRORS`."""
    return error is not None and any(e in str(error) for e in TRANSIENT_SPARK_ERRORS)


def _run_stream_once(
    spark: SparkSession,
    query: Query,
    stop: Callable[[], bool] | None,
    poll_seconds: float,
    until_batch: int | None,
    initial_state: Any,
) -> _Ran:
    """Start the query and wait for its end.

    Available-now, unless the clock drives its batches: Spark then runs a batch that reads
    nothing on every trigger and an available-now run never ends. Such a run goes on a short
    processing-time trigger until a trigger finds no new input (the batch that read nothing
    fired the timeouts due) or its ``trigger.drain_limit`` passes (:func:`await_drained`).
    """
    from stateops.spark.streaming import clock_driven, query_frame

    available_now = stop is None and until_batch is None
    with _spark_refusal(query):
        frame = query_frame(spark, query, initial_state)
    clock = clock_driven(frame)
    if not (available_now and clock):
        streaming = _start(spark, query, frame, available_now=available_now)
        stopped, error, progress = _watch(
            streaming, lambda: await_run(streaming, stop, poll_seconds, until_batch)
        )
        return _Ran(stopped, error, progress, clock)
    limit = query.trigger.drain_limit_seconds
    streaming = _start(spark, query, frame, processing_time=DRAIN_TRIGGER)
    drained, error, progress = _watch(streaming, lambda: await_drained(streaming, query, limit))
    ran = _Ran(False, error, progress, clock, None if error else drained)  # failed: neither
    if not error:
        finished = _finish_planned(spark, query, poll_seconds, initial_state)
        ran.error, ran.progress = finished.error, ran.progress + finished.progress
        ran.drained = None if ran.error else ran.drained  # failed: neither
    if ran.drained is False:
        print(
            f"{query.name}: input not drained within trigger.drain_limit "
            f"{query.trigger.drain_limit} ({clock}): stopped after a committed batch; the "
            "next run goes on from there",
            file=sys.stderr,
        )
    return ran


def _finish_planned(
    spark: SparkSession, query: Query, poll_seconds: float, initial_state: Any = None
) -> _Ran:
    """Finish the batch a stop left planned (none: an empty run): Spark runs a planned batch
    first on a restart, and on a day-long trigger nothing after it."""
    _, planned = checkpoint_state(query.checkpoint)
    if not planned:
        return _Ran()
    print(f"{query.name}: the stop fell inside batch {planned[-1]}: finishing it", file=sys.stderr)
    # Once: the run that drained is itself restarted after a transient failure (_run_stream).
    return _run_stream_once(
        spark, _one_batch(query), None, poll_seconds, planned[-1], initial_state
    )


@contextmanager
def _spark_refusal(query: Query) -> Iterator[None]:
    """Spark's refusal to build or start the query, as one line."""
    from pyspark.errors import AnalysisException

    try:
        yield
    except AnalysisException as err:
        raise StateOpsError(
            f"query {query.name}: Spark cannot start it: {str(err).splitlines()[0]}"
        ) from err


def _start(
    spark: SparkSession,
    query: Query,
    frame: DataFrame,
    *,
    available_now: bool = False,
    processing_time: str | None = None,
) -> StreamingQuery:
    from stateops.spark.streaming import start_query

    with _spark_refusal(query):
        return start_query(
            spark, query, available_now=available_now, frame=frame, processing_time=processing_time
        )


def _watch(streaming: StreamingQuery, wait: Callable[[], Any]) -> tuple[Any, Any, list]:
    """(what ``wait()`` returned, the query's exception, its progress), the query stopped."""
    from pyspark.errors import StreamingQueryException

    waited = None
    try:
        waited = wait()
    except StreamingQueryException:
        pass  # recorded from streaming.exception()
    finally:
        error = streaming.exception()
        progress = streaming.recentProgress
        if streaming.isActive:
            streaming.stop()
    return waited, error, progress


def _run_image_batch(
    spark: SparkSession,
    query: Query,
    stop: Callable[[], bool] | None,
    poll_seconds: float,
    initial_state: Any,
    origin: dict[str, Any],
) -> _Ran:
    """Plan the image batch 0 (:mod:`stateops.ops.carry`), run it, then the query.

    Where the exported batch handed on a later watermark than it ran with, or batch 0 takes
    the old query's source positions (a code upgrade), batch 0 runs alone (on a long trigger,
    so nothing follows it) and is finished before the query goes on; otherwise Spark runs
    batch 0 and goes on by itself.
    """
    from stateops.ops.carry import finish_image_batch, write_image_batch

    watermark = origin["watermark"]
    write_image_batch(spark, query.checkpoint, watermark)
    alone = origin.get("positions") or (
        watermark["next_batch_watermark_ms"] > watermark["batch_watermark_ms"]
    )
    if not alone:
        return _run_stream(spark, query, stop, poll_seconds, None, initial_state)
    ran = _run_stream(spark, _one_batch(query), None, poll_seconds, 0, initial_state)
    if ran.error:
        return ran
    if not finish_image_batch(query.checkpoint, origin):
        last, _ = checkpoint_state(query.checkpoint)
        if last is None:
            ran.error = "the image batch 0 did not commit"
            return ran
    return ran.then(_run_stream(spark, query, stop, poll_seconds, None, None))


def _prove(
    spark: SparkSession, query: Query, carried: dict[str, Any], initial_state: Any
) -> dict[str, Any]:
    """The carry-over proof for the road ``carried`` took (:mod:`stateops.spark.proof`),
    with the seconds it took."""
    from stateops.ops.carry import is_image_batch
    from stateops.spark.proof import prove_carried_state, prove_carry_over, prove_first_batch

    started = time.time()
    origin = carried.get("origin")
    if carried.get("road") == "transplant":
        first = carried.get("first", carried["batch"] + 1)
        old = {"checkpoint": carried["from_checkpoint"], "batch": carried["batch"]}
        proof = (
            prove_carried_state(spark, query, old, first - 1)
            if query.transform is not None
            else prove_carry_over(
                spark, query, old, first=first, image=False, until_caught_up=False
            )
        )
    else:
        image = bool(origin) and is_image_batch(query.checkpoint, origin)
        proof = (
            prove_carry_over(spark, query, origin, first=0, image=image, until_caught_up=True)
            if origin and not carried.get("differences")
            # data files, or an accepted change of the processor's state: no old query
            else prove_first_batch(spark, query, initial_state, image=image)
        )
    proof["seconds"] = round(time.time() - started, 1)
    return proof


def _proof_summary(proof: dict[str, Any] | None) -> dict[str, Any] | None:
    if proof is None:
        return None
    last = proof["batches"][-1]
    return {
        "ok": proof["ok"],
        "sample": proof["sample"],
        "seconds": proof["seconds"],
        "batches": proof["batches"],
        "reference": proof["reference"],
        "variables": {
            v["variable"]: v["actual_rows"] for v in proof["variables"] if v["batch"] == last
        },
        "proof_file": proof["proof_file"],
    }


KEPT_SUMMARIES = 20
"""Run summaries kept per query by run id (the latest one is kept besides, for the status)."""


def write_summary(
    registry: Registry, summary: dict[str, Any], path: str | None = None
) -> Path | S3Path:
    """The run's summary, where a task on any host reads it by run id (:func:`read_summary`),
    and as the query's latest (``stateops status``); or at ``path`` alone. The summaries of
    the runs before the last :data:`KEPT_SUMMARIES` are removed (the index lists them). A run
    that lost its lease (``lock_lost``) is not the query's latest: its failure says nothing of
    the query's code, and another holder runs the query now (its runs are the latest)."""
    text = json.dumps(summary, indent=2) + "\n"
    if path:
        write_file(Path(path), text)
        return Path(path)
    name, run_id = summary["query"], summary["run_id"]
    target = registry.run_summary_path(name, run_id)
    write_file(target, text)
    index = _summary_index(registry, name)
    try:
        runs = json.loads(index.read_text(encoding="utf-8"))["runs"]
    except (FileNotFoundError, ValueError, KeyError, TypeError):
        runs = []  # none yet, or unreadable: it is rebuilt from this run on
    runs = [run_id, *(r for r in runs if r != run_id)]
    for gone in runs[KEPT_SUMMARIES:]:
        registry.run_summary_path(name, gone).unlink(missing_ok=True)
    write_file(index, json.dumps({"runs": runs[:KEPT_SUMMARIES]}))
    if not summary.get("lock_lost"):
        write_file(registry.run_summary_path(name), text)
    return target


def _summary_index(registry: Registry, name: str) -> Path | S3Path:
    """The run ids of query ``name``'s kept summaries, newest first, beside them."""
    return registry.run_summary_path(name).with_name("index.json")


def failed_in_a_row(registry: Registry, query: str, limit: int) -> int:
    """How many of the query's last runs failed, newest first, counted up to ``limit`` (and
    :data:`KEPT_SUMMARIES`): the index :func:`write_summary` keeps, the summaries it names. A
    run that lost its lease is passed over: a coordination failure, not one of the query's."""
    try:
        runs = json.loads(_summary_index(registry, query).read_text(encoding="utf-8"))["runs"]
    except (FileNotFoundError, ValueError, KeyError, TypeError):
        return 0
    failed = 0
    for run_id in runs[:limit]:
        try:
            summary = json.loads(registry.run_summary_path(query, run_id).read_text())
        except (FileNotFoundError, ValueError):
            break
        if summary.get("lock_lost"):
            continue
        if summary.get("status") != "failed":
            break
        failed += 1
    return failed


def read_summary(registry: Registry, query: str, run_id: str) -> dict[str, Any]:
    """The summary the Spark job of run ``run_id`` wrote (:func:`write_summary`)."""
    path = registry.run_summary_path(query, run_id)
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise StateOpsError(
            f"{path}: no summary of run {run_id!r}: the Spark job did not write its summary; "
            "read the spark-submit task's log"
        ) from None
