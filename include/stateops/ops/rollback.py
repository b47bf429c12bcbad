"""Rollback to batch N: batch N becomes the last committed batch, and everything after it goes.

Commits and offsets after N, source-log entries after N's, state versions after N + 1,
operator metadata and schema files written after N, then the RocksDB files and sidecars left
unreferenced (the deletion engine: :mod:`stateops.ops.deletion`); the sink's batch folders
after N are moved aside. A Kafka source rewinds to its offsets in ``offsets/N``: the preflight
refuses, changing nothing, a rollback whose records the broker no longer holds (or a broker
that does not answer); with a Kafka sink (at least once) the plan counts the records the
reprocessing writes again, and the rollback waits for that count to be confirmed
(``rewrite_output``). A rollback leaves a marker (``<checkpoint>.audit/rollback.json``)
while it runs; the query refuses to start until a rollback run has finished it, and a rerun
after a kill resumes.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from stateops.control.markers import (
    clear_repartition,
    clear_rollback,
    write_rollback,
)
from stateops.core.checkpoint import Checkpoint, load_checkpoint
from stateops.core.errors import CheckpointError, StateOpsError, Unreachable
from stateops.core.plans import BackupFirst
from stateops.core.report import format_bytes
from stateops.kinds import SINK_KINDS, Sink, source_at
from stateops.ops.deletion import (
    audit_plan,
    deletion_plan,
    execute_plan,
    format_plan,
    plan_digest,
    refuse_gaps,
    refuse_unwritable_plan,
    restart_set,
)
from stateops.ops.pending import refuse_pending_rollback
from stateops.ops.repartition import record_partitions
from stateops.spark.jobs import run_local_job

if TYPE_CHECKING:
    from stateops.control.target import Target

__all__ = [
    "REWRITE_FLAG",
    "format_rollback_plan",
    "source_rewinds",
    "plan_rollback",
    "refuse_unconfirmed_rewrite",
    "run_rollback",
    "set_aside",
    "sink_rewrites",
]


def plan_rollback(target: Target, to_batch: int) -> dict[str, Any]:
    """What a rollback of ``target``'s checkpoint to committed batch ``to_batch`` deletes (it
    becomes the last one)."""
    if to_batch < 0:
        raise StateOpsError(
            f"batch {to_batch}: batch ids start at 0; pick a committed batch listed by "
            "`stateops inspect`"
        )
    cp = load_checkpoint(target.checkpoint)
    pending = refuse_pending_rollback(cp.root, to_batch)
    refuse_gaps(cp)
    last = cp.last_committed_batch
    cp.require_committed(to_batch, "roll back to a later batch, or restore an older backup")
    keep = set(restart_set(cp, to_batch, "roll back to a later batch, or restore an older backup"))
    delete: dict[str, str] = {}
    for log, batches in (("commits", cp.commits), ("offsets", cp.offsets)):
        delete.update({f"{log}/{b}": "after-rollback-point" for b in batches if b > to_batch})
    for name, log in cp.sources.items():
        upper = cp.file_log_offset(to_batch, int(name)) if name.isdigit() else None
        upper = to_batch if upper is None else upper  # other sources' logs go by batch id
        for i, rel in log.items():
            if i > upper:
                delete[rel] = "after-rollback-point"
    for op in cp.operators:
        for b, rel in op.metadata_files.items():
            if b is not None and b > to_batch:
                delete[rel] = "after-rollback-point"
        for rel, written_by in op.schema_files.items():
            if written_by > to_batch and rel not in keep:
                delete[rel] = "after-rollback-point"
        for store in op.stores:
            for v in store.versions:
                if v > to_batch + 1:
                    delete.update(dict.fromkeys(store.version_files(v), "after-rollback-point"))
    partitions = [cp.partitions(last), cp.partitions(to_batch)]  # differ across a repartition
    changed = partitions if partitions[0] != partitions[1] else None
    plan = deletion_plan(
        cp, "rollback", delete, keep, to_batch=to_batch, resumes=pending, partitions=changed
    )
    if pending:  # decided and half done: what the broker holds now cannot stop its finish
        plan.update(rewinds=source_rewinds(cp, target, to_batch, refuse=False), rewrites=None)
    else:
        plan.update(
            rewinds=source_rewinds(cp, target, to_batch),
            rewrites=sink_rewrites(cp, target, to_batch),
        )
    return plan


def _refused(cp: Checkpoint, to_batch: int) -> str:
    return f"{cp.root}: rollback to batch {to_batch} refused, nothing changed"


def source_rewinds(
    cp: Checkpoint, target: Target, to_batch: int, *, refuse: bool = True
) -> list[dict[str, Any]]:
    """Per source of the checkpoint whose kind has something to say of it: where a rollback to
    ``to_batch`` rewinds it (``offsets/<to_batch>``, where the next batch starts reading) and
    what the batches after it read (read again). Refused in one line, changing nothing, where
    its input from there on is gone (a topic's retention: the restart would fail, or skip
    it), or its servers do not answer. Without ``refuse`` (a rollback a kill interrupted: its
    marker holds the query until it finishes) that is said in ``missing`` instead."""
    entry = cp.offsets.get(to_batch)
    if entry is None:
        return []
    inputs = list(target.query.inputs.values()) if target.query is not None else []
    newest = cp.offsets[max(cp.offsets)].source_offsets
    rewinds = []
    for index, raw in enumerate(entry.source_offsets):
        source = source_at(raw, inputs)
        if source is None:
            continue
        try:
            then = newest[index] if index < len(newest) else None
            rewind = source.kind.rewind(source, raw, then)
            missing = source.kind.unreadable(source, raw) if rewind is not None else ""
        except Unreachable as err:
            if not refuse:
                missing = f"not checked: {err}"
            else:
                raise type(err)(
                    f"{_refused(cp, to_batch)}: cannot check that {source.where} still holds "
                    f"what the query would read again from batch {to_batch}'s offsets on: {err}"
                ) from None
            rewind = {"where": source.where, "line": "not read: its servers did not answer"}
        if rewind is None:
            continue
        if missing and refuse:
            raise CheckpointError(
                f"{_refused(cp, to_batch)}: {source.where} no longer holds what the query would "
                f"read again: {missing}; roll back to a later batch"
            )
        rewinds.append({"source": index, **rewind, "missing": missing})
    return rewinds


def sink_rewrites(cp: Checkpoint, target: Target, to_batch: int) -> dict[str, Any] | None:
    """What reprocessing the batches after ``to_batch`` writes again that the sink's readers
    already got (its kind's :meth:`rewrites`: a Kafka sink is at least once), from the first
    rolled-back batch's start (``batchTimestampMs`` of ``offsets/<to_batch + 1>``, taken once
    batch ``to_batch`` had committed, so after its last output). None: nothing (a folder
    sink's batches are moved aside and written anew)."""
    query = target.query
    if query is None:
        return None
    first = to_batch + 1
    since = cp.offsets[first].timestamp_ms if first in cp.offsets else None
    try:
        return query.sink.kind.rewrites(query.sink, first, since)
    except Unreachable as err:
        raise type(err)(
            f"{_refused(cp, to_batch)}: cannot count the output the rolled-back batches wrote "
            f"to {query.sink.where}: {err}"
        ) from None


REWRITE_FLAG = "--rewrite-output"


def refuse_unconfirmed_rewrite(plan: dict[str, Any], confirmed: int | None) -> None:
    """Refuse, in one line, a rollback whose reprocessing writes records to a Kafka sink again
    unless ``confirmed`` is that count (``--rewrite-output N``, the backfill form's
    ``rewrite_output``): duplicates the topic's readers will see, agreed to knowingly."""
    rewrites = plan.get("rewrites")
    if not rewrites or not rewrites["records"] or confirmed == rewrites["records"]:
        return
    n = rewrites["records"]
    given = "" if confirmed is None else f"{REWRITE_FLAG} {confirmed} does not match: "
    raise StateOpsError(
        f"{plan['checkpoint']}: {given}reprocessing writes again the {n} records batches "
        f"{rewrites['first_batch']} on wrote to {rewrites['sink']} (at least once: its "
        f"readers get them twice); confirm with {REWRITE_FLAG} {n} (the backfill form: "
        f"rewrite_output {n}); nothing changed"
    )


def _rewind_lines(plan: dict[str, Any]) -> list[str]:
    lines = [
        f"  source {r['source']} ({r['where']}): {r['line']}" for r in plan.get("rewinds") or []
    ]
    rewrites = plan.get("rewrites")
    if rewrites:
        n, first = rewrites["records"], rewrites["first_batch"]
        lines.append(
            f"  sink {rewrites['sink']} (at least once): reprocessing writes again the {n} "
            f"records batches {first} on wrote (those stamped from batch {first}'s start on)"
            + (f"; confirm with {REWRITE_FLAG} {n}" if n else "")
        )
    return lines


def format_rollback_plan(plan: dict[str, Any], dry_run: bool, then: str | None = None) -> str:
    """:func:`stateops.ops.deletion.format_plan` with, after the rollback point, where each
    Kafka source rewinds to and what a Kafka sink gets again."""
    lines = format_plan(plan, dry_run=dry_run, then=then).split("\n")
    return "\n".join(lines[:2] + _rewind_lines(plan) + lines[2:])


def run_rollback(
    target: Target,
    to_batch: int,
    *,
    run_id: str,
    backup: BackupFirst | None = None,
    dry_run: bool = False,
    log: Callable[[str], None] = print,
    sink: Sink | None = None,
    planned: str | None = None,
    operation: str = "rollback",
    rewrite_output: int | None = None,
) -> dict[str, Any]:
    """Make ``to_batch`` the last committed batch, under the query's lock: backup (``backup()``
    returns its id; the plan shows where it goes), marker, checkpoint deletions, sink, audit,
    marker removed; then a registered query's ``shuffle_partitions`` follows the checkpoint
    (back to before a repartition). A rerun after a kill resumes.
    ``sink``: the sink made consistent (default: the registered query's; its kind's
    :meth:`undo_plan`). The plan it returns names the ``run_id`` (the sink's
    ``_rolled_back/<run_id>/``) and the ``backup_id``. ``planned``: the :func:`plan_digest` of
    the plan the operator saw (a backfill's); the rollback refuses, changing nothing, if the
    plan made under the lock differs from it. ``rewrite_output``: the count of records a Kafka
    sink gets again that the operator confirmed (:func:`refuse_unconfirmed_rewrite`)."""
    if sink is None and target.query is not None:
        sink = target.query.sink
    lock = target.lock(operation, run_id)

    def plan_all() -> dict[str, Any]:
        plan = plan_rollback(target, to_batch)
        plan["sink"] = sink.kind.undo_plan(sink, to_batch) if sink else None
        plan["backup_to"] = backup.to if backup else None
        return plan

    plan = plan_all()  # before the lock, the backup and the marker: see run_cleanup
    if dry_run:
        log(format_rollback_plan(plan, dry_run=True))
        return plan
    refuse_unconfirmed_rewrite(plan, rewrite_output)
    refuse_unwritable_plan(plan, lock)
    with lock:
        started = time.time()
        plan = plan_all()
        if planned is not None and plan_digest(plan) != planned:
            raise CheckpointError(
                f"{plan['checkpoint']} changed since the plan was made (last committed batch now "
                f"{plan['last_committed_batch']}): nothing was rolled back; plan again"
            )
        refuse_unconfirmed_rewrite(plan, rewrite_output)
        refuse_unwritable_plan(plan, lock)
        log(format_rollback_plan(plan, dry_run=False))
        if pending := plan["resumes"]:  # an interrupted run already backed up and marked
            run_id, backup_id = pending["run_id"], pending.get("backup_id")
            log(f"resuming the interrupted rollback {run_id}")
        else:
            run_id, backup_id = lock.run_id, backup() if backup else None
            marker = {"to_batch": to_batch, "run_id": run_id, "backup_id": backup_id}
            write_rollback(target.checkpoint, marker)
        execute_plan(plan, log)
        if plan["sink"]:
            set_aside(plan["sink"], run_id)
        seconds = round(time.time() - started, 1)
        audit_plan(plan, run_id, "succeeded", backup_id=backup_id, seconds=seconds)
        clear_repartition(target.checkpoint)  # a rollback to before an interrupted one finishes it
        clear_rollback(target.checkpoint)
        if target.query is not None and target.registry is not None:
            record_partitions(target.registry, target.query.name, run_id)
    plan.update(run_id=run_id, backup_id=backup_id)
    log(
        f"rollback {run_id} of {plan['checkpoint']}: batch {to_batch} is the last committed "
        "batch; deleted "
        f"{plan['delete']['files']} files, {format_bytes(plan['delete']['bytes'])}"
        + (f"; backup {backup_id}" if backup_id else "; no backup")
        + f"; {seconds} s"
    )
    return plan


def set_aside(undo: dict[str, Any], run_id: str) -> None:
    """Carry out a sink's undo plan (its kind's :meth:`undo_plan`): its output after the
    rollback point set aside under ``run_id``."""
    SINK_KINDS[undo["format"]].set_aside(undo, run_id, run_local_job)
