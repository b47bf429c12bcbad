"""On-call backfill: roll a query back and reprocess, with the same logic or a changed one.

One plan (:func:`plan_backfill`: the rollback point, from a batch or an input time, what the
rollback deletes and moves aside, the registry the reprocessing runs with), then its steps:
:func:`rollback_for_backfill` (backup, then the rollback under the query's lock, refused if the
checkpoint changed since the plan), the reprocessing (:data:`stateops.core.steps.BACKFILL_STEPS`),
its run summary (:func:`stateops.ops.start.summary_line`), :func:`report_backfill` (what changed
in the output), and the integrity checks. Each takes the :class:`~stateops.control.target.Target`
(a registered query). The ``stream_backfill`` DAG runs each step as a task; :func:`run_backfill`
runs them in one process (``stateops backfill``).
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from stateops.control.audit import append_audit
from stateops.control.lock import hold_query, new_run_id, release_hold
from stateops.core.checkpoint import Checkpoint, load_checkpoint
from stateops.core.errors import (
    CheckpointError,
    OperationFailed,
    RegistryError,
    StateOpsError,
    about,
    one_line,
)
from stateops.core.registry import Query, Registry, Source, derived_registry, load_registry
from stateops.core.steps import BACKFILL_STEPS, OVERRIDABLE, fill
from stateops.core.storage import location, write_file
from stateops.core.times import parse_past_time, parse_time  # re-exported: older callers
from stateops.core.verify import require_sound
from stateops.kinds import kind_at, source_at
from stateops.ops.deletion import plan_digest
from stateops.ops.rollback import (
    format_rollback_plan,
    plan_rollback,
    refuse_unconfirmed_rewrite,
    run_rollback,
)
from stateops.ops.start import read_summary, summary_line
from stateops.ops.upgrade import refuse_what_a_run_refuses

if TYPE_CHECKING:
    from stateops.control.target import Target
    from stateops.core.plans import BackupFirst

__all__ = [
    "OVERRIDABLE",
    "backfill_point",
    "check_backfill_form",
    "last_batch_before",
    "logic_changes",
    "parse_past_time",
    "parse_time",
    "plan_backfill",
    "registry_with_overrides",
    "report_backfill",
    "rollback_for_backfill",
    "run_backfill",
]


def backfill_point(
    registry: Registry, name: str, to_batch: int | None, input_before: str | None
) -> int:
    """The batch a backfill of ``name`` rolls back to: ``to_batch``, or the last batch whose
    input is older than ``input_before`` (one of the two), a committed batch; a refusal
    names the form's field."""
    query = registry.query(name)
    before = (input_before or "").strip()
    if (to_batch is None) == (not before):
        raise StateOpsError(
            "to_batch, input_before: give one of them, the last batch to keep or a time (the "
            "last batch whose input is older), not " + ("both" if before else "neither")
        )
    if to_batch is None:
        with about("input_before"):
            when = parse_time(before, "input_before")
            return last_batch_before(query.checkpoint, when, list(query.inputs.values()))
    with about("to_batch"):
        committed = sorted(load_checkpoint(query.checkpoint).commits)
        if to_batch not in committed:
            kept = f"{committed[0]}..{committed[-1]}" if committed else "none yet"
            raise StateOpsError(
                f"{to_batch} is not a committed batch of {name} (committed and kept: {kept}); "
                f"pick one of them (stateops inspect {name})"
            )
    return to_batch


_REGISTERED = "a backfill reprocesses a registered query: give its name"


def check_backfill_form(registry: Registry, conf: dict[str, Any]) -> None:
    """The backfill form's rules that need no Spark, before a run is created: the rollback
    point and the overrides (known keys, a valid registry entry once merged)."""
    overrides = conf.get("overrides") or {}
    if overrides:
        with tempfile.TemporaryDirectory() as scratch:
            registry_with_overrides(
                registry, conf["query"], overrides, Path(scratch) / "registry.yaml"
            )
    backfill_point(registry, conf["query"], conf.get("to_batch"), conf.get("input_before"))


def plan_backfill(
    target: Target,
    run_id: str,
    *,
    to_batch: int | None = None,
    input_before: str | None = None,
    overrides: dict[str, Any] | None = None,
    rewrite_output: int | None = None,
    dry_run: bool,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """The backfill's plan, printed: the rollback point (``to_batch``, or the last batch whose
    input is older than ``input_before``: one of the two), what the rollback deletes and moves
    aside, where each Kafka source rewinds to (refused, changing nothing, where the broker no
    longer holds those records), and the registry the reprocessing runs with (with
    ``overrides``: the query's entry with them merged in, validated and written under the state
    folder). Its ``digest`` is what :func:`rollback_for_backfill` holds the rollback to. With a
    Kafka sink, a plan made to run is refused unless ``rewrite_output`` is the count of records
    the reprocessing writes again. ``dry_run`` has no default: a plan made to run must say so,
    or its overrides' registry is not written."""
    query, registry = target.require_query(_REGISTERED), target.require_registry()
    given = to_batch
    to_batch = backfill_point(registry, query.name, to_batch, input_before)
    if given is None:
        log(f"the last batch whose input is older than {input_before.strip()}: {to_batch}")
    plan = plan_rollback(target, to_batch)
    plan.update(
        sink=query.sink.kind.undo_plan(query.sink, to_batch), backup_to=target.backup_location()
    )
    if not dry_run:
        refuse_unconfirmed_rewrite(plan, rewrite_output)
    path, reprocessed, text = str(registry.path), query, None
    if overrides:
        path = str(registry.run_registry_path(query.name, "backfill", run_id))
        with tempfile.TemporaryDirectory() as scratch:  # moved where it belongs once it holds
            written = registry_with_overrides(registry, query.name, overrides, f"{scratch}/r.yaml")
            reprocessed, text = load_registry(written).query(query.name), written.read_text()
    changes = logic_changes(query, reprocessed) if overrides else []
    refuse_what_a_run_refuses(reprocessed)  # before the rollback, not after it
    if text is not None and not dry_run:
        write_file(location(path), text)
    then = (
        f"reprocess {query.name} after batch {to_batch} with available-now "
        f"(registry {path}; {'; '.join(changes) or 'the same logic'}), "
        "check the state and compare the reprocessed output with the old one"
    )
    text = format_rollback_plan(plan, dry_run=dry_run, then=then)
    log(text)
    return {
        "query": query.name,
        "run_id": run_id,
        "checkpoint": query.checkpoint,
        "to_batch": to_batch,
        "last_committed_batch": plan["last_committed_batch"],
        "registry": path,
        "delete": plan["delete"],
        "digest": plan_digest(plan),
        "changes": changes,
        "logic": reprocessed.logic,
        "backup_to": plan["backup_to"],
        "rewinds": plan["rewinds"],
        "rewrites": plan["rewrites"],
        "rewrite_output": rewrite_output,
        "text": text,
    }


def rollback_for_backfill(
    target: Target,
    plan: dict[str, Any],
    *,
    backup: BackupFirst,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """``backup`` (:func:`stateops.ops.backup.backup_first`), then the planned rollback under
    the query's lock; refused, changing nothing, if the checkpoint changed since
    :func:`plan_backfill`."""
    query = target.require_query(_REGISTERED)
    done = run_rollback(
        target,
        plan["to_batch"],
        run_id=new_run_id("rollback"),
        operation="backfill",
        backup=backup,
        log=log,
        planned=plan.get("digest"),
        rewrite_output=plan.get("rewrite_output"),
    )
    # Until its reprocessing has run, only the backfill's own run (its run id) may take the
    # query: a scheduled start in between would reprocess with the old logic. The run that
    # reprocesses ends the hold (stateops.ops.start); a failed backfill ends it here.
    hold_query(target.lock_file, query.name, "backfill", plan["run_id"])
    log(f"{query.name}: held for the backfill's reprocessing (run {plan['run_id']})")
    # The backfill's steps are recorded as each completes, so a backfill killed between them
    # (its reprocessing is a long Spark job) leaves a record of how far it got, which
    # `stateops status` reads (stateops.status.unfinished_backfill).
    _record(
        plan,
        "rolled back",
        batch_after=plan["to_batch"],
        backup_id=done["backup_id"],
        rollback_run_id=done["run_id"],
        registry=plan["registry"],
        changes=plan.get("changes", []),
        logic=plan.get("logic"),
    )
    rolled = {
        "run_id": done["run_id"],
        "backup_id": done["backup_id"],
        "to_batch": plan["to_batch"],
    }
    mark = query.sink.kind.mark(query.sink)  # where the reprocessing's output starts
    if mark is not None:
        rolled["sink_end"] = mark
    return rolled


def _record(plan: dict[str, Any], result: str, **details: Any) -> None:
    """The backfill's audit record of a step (its run id: the plan's)."""
    append_audit(
        plan["checkpoint"],
        "backfill",
        run_id=plan.get("run_id") or "unknown",
        result=result,
        batch_before=plan["last_committed_batch"],
        to_batch=plan["to_batch"],
        **details,
    )


def report_backfill(
    target: Target,
    plan: dict[str, Any],
    rollback: dict[str, Any],
    *,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """What the reprocessing changed in the output of the batches after the rollback point."""
    query = target.require_query(_REGISTERED)
    lines, output, found = query.sink.kind.compare(
        query.sink,
        run_id=rollback["run_id"],
        after_batch=plan["to_batch"],
        key_columns=query.key_columns,
        mark=rollback.get("sink_end"),
        before=plan.get("rewrites"),
    )
    log(f"{query.name}: {lines[0]}")
    for line in lines[1:]:
        log(line)
    for change in plan.get("changes", []):
        log(f"  reprocessed with {change}")
    _record(
        plan,
        "succeeded",
        batch_after=load_checkpoint(query.checkpoint).last_committed_batch,
        backup_id=rollback["backup_id"],
        output=output,
    )
    return {**found, "changes": plan.get("changes", [])}


def run_backfill(
    target: Target,
    plan: dict[str, Any],
    *,
    run_id: str,
    backup: BackupFirst,
    run_job: Callable[[str, str, list[str]], None],
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """The ``stream_backfill`` DAG's steps after its plan, in one process (``stateops
    backfill``): rollback, reprocess, record, report, verify, validate. ``run_job(job,
    registry_file, args)`` runs a Spark job and raises when it fails."""
    fields = {"query": plan["query"], "run_id": run_id}

    def spark(step: str) -> None:
        job, _, args = fill(BACKFILL_STEPS[step], fields)
        run_job(job, plan["registry"], args)

    rolled = rollback_for_backfill(target, plan, backup=backup, log=log)
    try:
        spark("reprocess")
        summary = read_summary(load_registry(plan["registry"]), plan["query"], run_id)
        log(summary_line(summary))
        report = report_backfill(target, plan, rolled, log=log)
    except StateOpsError as err:  # rolled back, not reprocessed: said by `stateops status`
        release_hold(target.lock_file, plan["run_id"])  # the operator's run goes on from here
        _record(
            plan,
            "failed",
            batch_after=plan["to_batch"],
            backup_id=rolled["backup_id"],
            error=one_line(err),
        )
        raise OperationFailed(
            f"the backfill of {plan['query']} failed after its rollback ({one_line(err)}): "
            f"batch {plan['to_batch']} is the last committed batch (backup "
            f"{rolled['backup_id']}); fix the cause, then stateops run {plan['query']}"
            + (f" --registry {plan['registry']}" if plan.get("changes") else "")
            + " reprocesses from there"
        ) from err
    require_sound(plan["checkpoint"], log)
    spark("validate_state")
    return {"rollback": rolled, "summary": summary, "report": report}


def last_batch_before(
    checkpoint: str | os.PathLike[str], before: datetime, sources: list[Source] | None = None
) -> int:
    """The last committed batch whose input, and all earlier batches' input, is older than
    ``before``: the batch before the first one that read a file modified at or after it (file
    times as the file source logged them) or a record stamped at or after it (a Kafka source:
    its offsets went past the broker's first offset stamped at or after ``before``).
    ``sources``: the query's inputs (a Kafka source's brokers; default: the connection's)."""
    cp = load_checkpoint(checkpoint)
    committed = sorted(cp.commits)
    if not committed:
        raise CheckpointError(f"{cp.root}: no committed batch yet: nothing to reprocess")
    limit_ms = before.timestamp() * 1000
    limits: dict[int, Any] = {}  # per Kafka source: the first offsets at or after ``before``
    previous = None
    for batch in committed:
        if not _older(cp, batch, limit_ms, sources or [], limits):
            if previous is None:
                raise CheckpointError(
                    f"{cp.root}: batch {batch}, the oldest one kept, already read input from "
                    f"{before.isoformat()} or later; restore an older backup to go further back"
                )
            return previous
        previous = batch
    raise StateOpsError(
        f"{cp.root}: every committed batch (up to {committed[-1]}) read only input older than "
        f"{before.isoformat()}: nothing to reprocess"
    )


def _older(
    cp: Checkpoint, batch: int, limit_ms: float, sources: list[Source], limits: dict[int, Any]
) -> bool:
    """Whether every source's input up to ``batch`` is older than ``limit_ms``: each source's
    kind says how (``limits``: what it keeps across batches, by source)."""
    if batch not in cp.offsets:
        raise CheckpointError(f"{cp.root}: offsets/{batch} is gone: its input is unknown")
    for index, raw in enumerate(cp.offsets[batch].source_offsets):
        if raw is None:  # "-": the source read nothing yet
            continue
        kind = kind_at(raw)
        if kind is None:
            raise StateOpsError(
                f"{cp.root}: source {index} is of no kind stateops knows, so its input has no "
                "times; roll back to a batch id instead"
            )
        source = source_at(raw, sources)
        if not kind.older(cp, batch, index, source, limit_ms, limits.setdefault(index, {})):
            return False
    return True


def registry_with_overrides(
    registry: Registry, query: str, overrides: dict[str, Any], dest: str | os.PathLike[str]
) -> Path:
    """Write a registry for reprocessing ``query`` with ``overrides`` merged into its entry
    (only its logic and checks change: the same checkpoint, sink, lock and run summary)."""
    current = registry.query(query).model_dump(by_alias=True)  # refuses an unknown name
    unknown = sorted(set(overrides) - set(OVERRIDABLE))
    if unknown:
        raise RegistryError(
            f"overrides: {', '.join(unknown)} cannot be changed by a backfill (only "
            f"{', '.join(OVERRIDABLE)}): the checkpoint, source and sink stay where they are"
        )
    changes = {k: _merged(current[k], v) for k, v in overrides.items()}
    try:
        return derived_registry(registry, query, changes, dest)
    except RegistryError as err:
        raise RegistryError(f"overrides: {err}") from None


def logic_changes(before: Query, after: Query) -> list[str]:
    """What a backfill's overrides change, one ``field.path: old -> new`` each."""
    changes: list[str] = []

    def walk(path: str, old: Any, new: Any) -> None:
        if isinstance(old, dict) and isinstance(new, dict):
            for key in sorted(set(old) | set(new)):
                walk(f"{path}.{key}", old.get(key), new.get(key))
        elif old != new:
            changes.append(f"{path}: {json.dumps(old)} -> {json.dumps(new)}")

    old, new = before.model_dump(by_alias=True), after.model_dump(by_alias=True)
    for field in OVERRIDABLE:
        walk(field, old[field], new[field])
    return changes


def _merged(base: Any, override: Any) -> Any:
    if isinstance(base, dict) and isinstance(override, dict):
        return {**base, **{k: _merged(base.get(k), v) for k, v in override.items()}}
    return override
