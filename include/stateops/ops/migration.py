"""Source migration with state carry-over: the library behind ``stream_source_migration``.

The DAG runs one task per step: preflight (this module's plan, then the query's hold), stop
the running query, drain the old source, back up, carry the state into a new checkpoint for
the new source, prove the carry-over, switch. Two roads carry the state: a transplant of the
old checkpoint's state files (:mod:`stateops.ops.transplant`, a file copy) where Spark can read
them as the new query's own, else export, validate and bootstrap with ``initialState``.
The hold (see :mod:`stateops.control.lock`) keeps every other lifecycle operation out from preflight
to the switch or the roll back; each step takes the query's lock with the migration's run id
for its own work.

A failure after preflight rolls back: the new checkpoint is set aside, a switch already
written is undone, the old checkpoint is writable again and the hold is released, so the old
query can start again and a new trigger of the DAG can do the migration again.

Either checkpoint may be local or in S3 (``s3://``; Spark writes it as ``s3a://``). S3 has no
rename and no file modes, so two steps differ there (docs/migration-on-s3.md): the switch
retires the old checkpoint with a hold object beside it (``<checkpoint>.audit/retired.json``,
which starts and every lifecycle operation refuse; on local disk its files are read-only as
well), and a roll back sets a failed new checkpoint aside in place under the same kind of hold
(locally it is renamed ``<checkpoint>.failed-<run>``). ``stateops unretire`` lifts a hold.
"""

from __future__ import annotations

import json
import os
import re
import stat
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from stateops.control.audit import append_audit, audit_dir
from stateops.control.lock import (
    QueryLock,
    hold_query,
    live_lock,
    refuse_unholdable,
    release_hold,
    safe_run_id,
)
from stateops.control.markers import (
    clear_carry_over,
    clear_retired,
    read_retired,
    request_stop,
    withdraw_stop,
    write_retired,
)
from stateops.control.target import Target, query_target
from stateops.core.checkpoint import Checkpoint, load_checkpoint
from stateops.core.errors import (
    CheckpointError,
    LockHeldError,
    OperationFailed,
    RegistryError,
    StateOpsError,
    about,
    one_line,
)
from stateops.core.faults import fail_after
from stateops.core.plans import BackupFirst, plan_head, plan_tail
from stateops.core.registry import (
    Query,
    Registry,
    Source,
    derived_registry,
    load_registry,
    placement,
    schema_fields,
    write_switch,
)
from stateops.core.staging import occupied
from stateops.core.steps import MIGRATION_STEPS, fill
from stateops.core.storage import S3Path, location, write_file
from stateops.core.times import parse_past_time
from stateops.core.verify import error_summary, verify_checkpoint
from stateops.kinds import SOURCE_KINDS
from stateops.kinds.base import check_start, start_at
from stateops.ops.rollback import set_aside
from stateops.ops.start import read_summary
from stateops.ops.transplant import (
    carry_differences,
    choose_road,
    refuse_differences,
    repartition_from,
    transplant_checkpoint,
    transplant_refusals,
)

__all__ = [
    "OPERATION",
    "Steps",
    "backup_for_migration",
    "check_carry_over",
    "check_migration_form",
    "derive_registry",
    "format_migrated",
    "format_migration_plan",
    "plan_migration",
    "prepare_migration",
    "prove_migration",
    "roll_back_migration",
    "run_migration",
    "settle_migration",
    "stop_running_query",
    "switch_migration",
    "switch_query",
    "transplant_for_migration",
    "undo_recipe",
    "unmoved_query",
    "unretire",
]

OPERATION = "migration"
# What a migration refuses a target without a registered query with (the CLI takes a path too).
_REGISTERED = "the migration moves a registered query: give its name"
# How an operator accepts an initialState road that changes results (the DAG's form field).
_ACCEPT = "trigger again with accept_differences on"

# The initialState road's steps (the transplant road's: transplant, first_batch).
INITIAL_STATE_ROAD = ("export", "validate_export", "bootstrap")


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def default_checkpoint(query: Query) -> Path | S3Path:
    """``<checkpoint>.v2`` beside the old one (``.v3`` after that, ...): the first free one
    (in S3, a prefix beside the old one)."""
    current = location(query.checkpoint)
    stem = re.sub(r"\.v\d+$", "", current.name)
    n = 2
    while True:
        candidate = current.with_name(f"{stem}.v{n}")
        if candidate != current and not occupied(candidate):
            return candidate
        n += 1


def plan_migration(
    target: Target,
    source_spec: dict[str, Any],
    new_checkpoint: str = "",
    run_id: str = "",
    cutover: str = "drain",
    carry_over: str = "auto",
    accept_differences: bool = False,
    moved_source: str = "",
) -> dict[str, Any]:
    """Preflight: everything a migration of ``target`` (a registered query) needs, checked
    without changing anything.

    ``source_spec``: the new source as the form gives it; ``new_checkpoint``: a local folder
    (:meth:`Registry.data_path`; empty: :func:`default_checkpoint`). ``moved_source``: which
    of the query's sources moves (empty: its only one); the others stay where they are.
    ``cutover``: ``drain`` (the old source is read to its end) or a time: the old source
    reads only the input files modified before it (see ``start.files_before``; one-source
    queries).
    ``carry_over``: ``auto``, ``transplant`` or ``initial_state``; the plan says which road
    the state would take now (the backup step decides, on the drained checkpoint), and where
    the initialState road would change what the query computes
    (:func:`stateops.ops.transplant.carry_differences`): it is then refused unless
    ``accept_differences``.

    Raises a one-line StateOpsError naming what is wrong: an unknown query or one without
    ``initial_state.from_export``, an unknown source name, an invalid or missing new source
    (or one in the folder of another of its sources), a new schema without the
    columns (and types) the query reads, an old checkpoint without a committed batch or that
    fails verification, a non-empty new checkpoint, another operation holding the query.
    """
    query, source_name, source, cutover, files, new = _form_checks(
        target, source_spec, new_checkpoint, cutover, carry_over, moved_source
    )
    registry, name = target.require_registry(), query.name
    cp = _sound_checkpoint(query)
    old = query.checkpoint
    runs_as = _runs_as(query, source_name, source, new)
    last = cp.last_committed_batch
    refusals = transplant_refusals(cp, runs_as, last)
    road = _carry_road(query, carry_over, refusals, lambda line: None)
    differences = carry_differences(cp, runs_as) if road == "initial_state" else []
    repartition = repartition_from(cp, runs_as, last) if road == "transplant" else None
    refuse_differences(name, differences, accept_differences, _ACCEPT)
    lock = refuse_unholdable(_lock_file(target, run_id), name, run_id)
    work = registry.work_path(name, OPERATION, run_id or "plan")
    return {
        "query": name,
        "run_id": run_id,
        "source_name": source_name,
        "old": {
            "source": query.inputs[source_name].model_dump(by_alias=True),
            "checkpoint": str(old),
            "query_id": cp.query_id,
            "last_committed_batch": cp.last_committed_batch,
            "sink_batch_offset": query.sink.batch_offset,
        },
        "new": {
            "source": source.model_dump(by_alias=True),
            "start": _start(source, source_spec),
            "checkpoint": str(new),
            "registry": str(registry.run_registry_path(name, OPERATION, run_id or "plan")),
        },
        "export": str(work / "export"),
        "backup_to": target.backup_location(),
        "switch_file": str(registry.switch_path(name)),
        "switch_before": registry.switch_before(name, run_id),
        "cutover": cutover,
        "carry_over": {
            "choice": carry_over,
            "road": road,
            "repartition": repartition and [repartition, runs_as.shuffle_partitions],
            "transplant_refusals": refusals,
            "differences": differences,
            "accepted": accept_differences,
        },
        "running": None if lock is None else lock.run_id,
        "new_source_files": files,
    }


def _start(source: Source, spec: dict[str, Any]) -> str | None:
    """Where a new source that is told where it starts begins (the form's
    ``new_source_start``); None for one that is not (a folder)."""
    return str(spec.get("start") or "cutover") if source.kind.positioned else None


def check_migration_form(target: Target, conf: dict[str, Any]) -> None:
    """The migration form's rules that need no Spark and no look at the old checkpoint, before
    a run is created (the preflight checks them again, then the rest); ``target``: the form's
    query."""
    source = {
        "format": conf.get("new_source_format"),
        "path": conf.get("new_source_path", ""),
        "topic": conf.get("new_source_topic") or "",
        "bootstrap_servers": conf.get("new_source_bootstrap_servers") or "",
        "start": conf.get("new_source_start") or "",
        "schema": conf.get("new_source_schema") or "",
        "options": conf.get("new_source_options") or {},
    }
    _form_checks(
        target,
        source,
        conf.get("new_checkpoint") or "",
        conf.get("cutover", "drain"),
        conf.get("carry_over", "auto"),
        conf.get("source") or "",
    )


def _form_checks(
    target: Target,
    source_spec: dict[str, Any],
    new_checkpoint: str,
    cutover: str,
    carry_over: str,
    moved_source: str,
) -> tuple[Query, str, Source, str, int, Path | S3Path]:
    """What the form (or the CLI's options) says, checked field by field: a refusal names the
    field. The query, the moved source's name, the new source, the cutover, the number of
    files in the new source, the new checkpoint's folder."""
    query = target.require_query(_REGISTERED)
    registry = target.require_registry()
    with about("carry_over"):
        _refuse_immovable(query, carry_over)
    with about("source"):
        source_name = query.input_name(moved_source)
    start = str(source_spec.get("start") or "cutover")
    source, inputs = _new_source(
        registry, query.inputs[source_name], {k: v for k, v in source_spec.items() if k != "start"}
    )
    if cutover != "drain":
        with about("cutover"):
            cutover = parse_past_time(cutover, "cutover").isoformat()
            if len(query.inputs) > 1:
                raise StateOpsError(
                    f"a cutover time reads one source up to it; {query.name} reads "
                    f"{len(query.inputs)}: choose cutover drain"
                )
    current = query.inputs[source_name]
    kind = source.kind
    with about(f"new_source_{kind.place}"):
        if kind is current.kind and kind.same_place(current, source):
            raise StateOpsError(
                f"the new source is {query.name}'s current source: nothing to migrate"
            )
        others = {n: s for n, s in query.inputs.items() if n != source_name}
        files = kind.check_new(source, query=query.name, others=others, inputs=inputs)
        if kind.positioned:  # where it starts: a start it still holds
            check_start(source, start, cutover)
    with about("new_source_schema"):
        _check_schema(query, current, source)
    source.kind.check_input(source, inputs)
    try:
        Query.model_validate(query.with_input(source_name, source).model_dump(by_alias=True))
    except ValidationError as err:
        message = str(err.errors()[0]["msg"]).removeprefix("Value error, ")
        raise StateOpsError(f"new source: {message}") from None
    with about("new_checkpoint"):
        new = _new_checkpoint(registry, query, new_checkpoint)
    return query, source_name, source, cutover, files, new


_NO_EXPORT = (
    "no initial_state.from_export in the registry, so its processor cannot take carried-over "
    "state by initialState; add one (docs/carry-over.md) and trigger again"
)


def _carry_road(query: Query, choice: str, refusals: list[str], log: Callable[[str], None]) -> str:
    """The road the state takes (:func:`stateops.ops.transplant.choose_road`), refused where
    it is ``initial_state`` and the processor takes no carried-over state."""
    road = choose_road(choice, refusals, log, transform=query.transform is not None)
    if road == "initial_state" and not query.movable:
        why = f"the transplant does not apply ({'; '.join(refusals)}) and " if refusals else ""
        raise RegistryError(f"query {query.name}: {why}{_NO_EXPORT}")
    return road


def _refuse_immovable(query: Query, carry_over: str) -> None:
    """Refuse, before anything else is checked, a road the query cannot take, saying why (the
    transplant needs no ``initial_state.from_export``: :func:`_carry_road` refuses the
    initialState road where it is chosen for want of the transplant)."""
    if carry_over == "initial_state" and not query.movable:
        raise RegistryError(f"query {query.name}: {_NO_EXPORT}")
    if query.transform is not None and carry_over == "initial_state":
        raise StateOpsError(
            f"carry_over initial_state is for processors (handleInitialState); {query.name} "
            "is a transform, whose state moves by transplant: choose auto or transplant"
        )


def _new_checkpoint(registry: Registry, query: Query, new_checkpoint: str) -> Path | S3Path:
    """The new checkpoint's folder or S3 prefix (``s3://BUCKET/PREFIX``; default: beside the
    old one): new or empty, apart from it."""
    given = registry.data_path(new_checkpoint) if new_checkpoint else None
    new = location(given) if given is not None else default_checkpoint(query)
    new = new.resolve()
    old = location(query.checkpoint)
    if _overlaps(new, old):
        raise StateOpsError(f"new checkpoint {new} overlaps the current checkpoint {old}")
    if occupied(new):
        held = read_retired(new)
        if held is not None:
            raise StateOpsError(
                f"new checkpoint {new} holds the checkpoint of failed migration run "
                f"{held.get('run_id')}, set aside: name another (or leave the field empty for "
                f"the next free one beside the old checkpoint), or delete that one first"
            )
        raise StateOpsError(
            f"new checkpoint {new} is not empty: name a new or empty folder (or leave the field "
            "empty for the default beside the old checkpoint)"
        )
    return new


def _overlaps(new: Path | S3Path, old: Path | S3Path) -> bool:
    """Whether one location is the other or holds it (local or S3 alike, by their names)."""
    a, b = str(new).rstrip("/"), str(old).rstrip("/")
    return a == b or a.startswith(b + "/") or b.startswith(a + "/")


def _sound_checkpoint(query: Query) -> Checkpoint:
    """The old checkpoint, refused without a committed batch or when it fails verification."""
    old = query.checkpoint
    cp = load_checkpoint(old)
    if cp.last_committed_batch is None:
        raise CheckpointError(
            f"{old} has no committed batch: there is no state to carry over; start "
            f"{query.name} on the new source instead"
        )
    findings = verify_checkpoint(old)
    if not findings["ok"]:
        raise CheckpointError(
            f"{old} fails verification ({error_summary(findings)}); repair or restore it "
            "before migrating"
        )
    return cp


def _runs_as(
    query: Query, source_name: str, source: Source | dict[str, Any], checkpoint: str | Path
) -> Query:
    """The query as it will run after the migration (for the transplant's checks)."""
    source = Source.model_validate(source) if isinstance(source, dict) else source
    return query.with_input(source_name, source).model_copy(update={"checkpoint": str(checkpoint)})


def _planned_query(query: Query, plan: dict[str, Any]) -> Query:
    """The query as ``plan`` will run it: its new source and checkpoint."""
    return _runs_as(query, plan["source_name"], plan["new"]["source"], plan["new"]["checkpoint"])


def _new_source(
    registry: Registry, current: Source, spec: dict[str, Any]
) -> tuple[Source, list[tuple[Path, str | None]]]:
    """The new source as the form (or the CLI) gives it, and its input (its kind's
    :meth:`SourceKind.inputs`, read once: a folder's files); without a format (or ``auto``),
    the kind whose place is given (a folder: the format of its files)."""
    spec = {k: v for k, v in spec.items() if v not in (None, "")}
    spec.setdefault("schema", current.schema_)
    given = spec.pop("options", None) or {}
    if str(spec.get("path") or "").strip():  # a folder or table, by the registry's rules
        spec["path"] = registry.data_path(str(spec["path"]))
    kinds = list(dict.fromkeys(SOURCE_KINDS.values()))
    placed = [k for k in kinds if spec.get(k.place)]
    fmt = spec.get("format", "auto")
    known = next((k for k in placed if k.recognizes(spec)), placed[0] if placed else kinds[0])
    kind = SOURCE_KINDS.get(fmt) or known
    inputs = kind.inputs(spec, given)
    if fmt == "auto":
        spec["format"] = fmt = kind.auto_format(spec, inputs)
    for other in placed:
        if other.place != kind.place:
            raise StateOpsError(
                f"new_source_{other.place}: a {fmt} source reads a {kind.noun}, not a "
                f"{other.noun}: give new_source_{kind.place} (--new-source-{kind.place}) and "
                f"leave the {other.noun} empty"
            )
    if not str(spec.get(kind.place) or "").strip():
        raise StateOpsError(
            f"new_source_{kind.place}: empty: a {fmt} source reads a {kind.noun}: give the "
            f"new source's {kind.noun} (--new-source-{kind.place})"
        )
    if kind is current.kind:  # a new place of the same kind reads as the old one did
        for field in kind.kept:
            spec.setdefault(field, getattr(current, field))
    spec["options"] = carried_options(current, spec["format"]) | given
    if inputs and spec["options"] != given:  # a glob carried from the old source
        inputs = kind.inputs(spec, spec["options"])
    try:
        return Source.model_validate(spec), inputs
    except ValidationError as err:
        first = err.errors()[0]
        field = ".".join(str(p) for p in first["loc"])  # format, path, schema, options...
        message = str(first["msg"]).removeprefix("Value error, ")
        raise StateOpsError(f"new_source{'_' * bool(field)}{field}: {message}") from None


def _check_schema(query: Query, current: Source, source: Source) -> None:
    """The new schema has every column of the source it replaces, with the same type."""
    new = dict(schema_fields(source.schema_))
    for column, kind in schema_fields(current.schema_):
        if column not in new:
            raise StateOpsError(
                f"new source schema has no column {column!r}, which {query.name} reads "
                f"(its current schema: {current.schema_})"
            )
        if new[column] != kind:
            raise StateOpsError(
                f"new source column {column!r} is {new[column]}, but {query.name} reads it as "
                f"{kind}: convert it, or declare it {kind}"
            )


def format_migration_plan(plan: dict[str, Any], dry_run: bool) -> str:
    """The preflight's plan for a person (the task log, the CLI)."""
    old, new = plan["old"], plan["new"]
    running = f", running as {plan['running']}: will be stopped" if plan["running"] else ""
    which = "" if plan["source_name"] == "source" else f"source {plan['source_name']}, "
    tail = plan_tail(
        irreversible="nothing: the old checkpoint stays (retired: held against any start or "
        "change) and a failed step rolls the whole run back",
        backup=f"to {plan['backup_to']}, after the drain and before the carry-over",
        undo=f"after the switch: {undo_recipe(plan)}",
    )
    return "\n".join(
        [
            plan_head(
                dry_run,
                f"migration of {plan['query']}: {which}{_where(old['source'])} -> "
                f"{_where(new['source'])} ({_new_input(plan)})",
            ),
            f"  old checkpoint {old['checkpoint']} (last committed batch "
            f"{old['last_committed_batch']}, verifies clean){running}",
            f"  new checkpoint {new['checkpoint']}",
            f"  new source options: {_options(plan)}",
            f"  cutover: {plan['cutover']}",
            f"  carry-over: {_road(plan['carry_over'])}",
            "  then: drain the old source, back up, carry the state over, prove, switch",
            *tail,
        ]
    )


def carried_options(current: Source, new_format: str) -> dict[str, Any]:
    """The current source's options the new source of ``new_format`` keeps (the form's own
    options are added over them): all of them in the same format, but where a topic starts
    (the migration sets that: a ``startingTimestamp`` would win over it); for files of
    another format, the limits of a batch only (a glob or a parser's option is the old
    format's)."""
    if new_format == current.format:
        return {k: v for k, v in current.options.items() if not k.startswith("starting")}
    if SOURCE_KINDS.get(new_format) is not current.kind:
        return {}
    return {k: v for k, v in current.options.items() if k in current.kind.carried}


def _where(source: dict[str, Any]) -> str:
    """A source of a plan as a person reads it: ``json /data/in`` or ``kafka topic t``."""
    return Source.model_validate(source).text


def _options(plan: dict[str, Any]) -> str:
    """The new source's options, each said where it comes from (the old source's carried)."""
    old, new = plan["old"]["source"].get("options") or {}, plan["new"]["source"]["options"]
    shown = [
        f"{k}={v}" + (" (the old source's)" if old.get(k) == v else "") for k, v in new.items()
    ]
    dropped = sorted(set(old) - set(new))
    if dropped:
        starts = " (the migration starts the new topic)" if plan["new"].get("start") else ""
        shown.append(f"not carried: {', '.join(dropped)}{starts}")
    return "; ".join(shown) or "none"


def _new_input(plan: dict[str, Any]) -> str:
    """What the new source holds now, and (Kafka) where the new checkpoint starts it."""
    if plan["new"].get("start") is None:
        return f"{plan['new_source_files']} files there now"
    start = plan["new"]["start"]
    at = (
        f"the offsets at the cutover ({plan['cutover']})"
        if start == "cutover" and plan["cutover"] != "drain"
        else "the offsets at the drain's end"
        if start == "cutover"
        else f"its {start} offsets"
    )
    return f"{plan['new_source_files']} partitions; the new checkpoint starts it at {at}"


def undo_recipe(plan: dict[str, Any]) -> str:
    """How a person undoes ``plan``'s migration after its switch (the plan's ``undo`` line and
    the DAG's last step say it)."""
    before = plan.get("switch_before")  # the switch an earlier migration or upgrade wrote
    put_back = (
        f"move {before} over {plan['switch_file']}" if before else (f"remove {plan['switch_file']}")
    )
    return (
        f"stop {plan['query']}, {put_back}, run stateops unretire "
        f"{plan['old']['checkpoint']}, and move the new checkpoint's output aside"
    )


def format_migrated(plan: dict[str, Any]) -> str:
    """What a migration that switched did, and how to undo it (the DAG's last step)."""
    new = plan["new"]
    return (
        f"{plan['query']} migrated: it runs on {new['checkpoint']} ({_where(new['source'])}); "
        f"the old checkpoint {plan['old']['checkpoint']} stays, "
        f"retired; to undo, {undo_recipe(plan)}"
    )


def _road(carry_over: dict[str, Any]) -> str:
    if carry_over["road"] == "transplant" and carry_over.get("repartition"):
        before, after = carry_over["repartition"]
        road = (
            f"transplant, then Spark's repartition of the state, {before} -> {after} partitions "
            "(batch N + 1, no input; the new query starts at batch N + 2)"
        )
    elif carry_over["road"] == "transplant":
        road = "transplant (the new query can run on the old state files)"
    elif carry_over["choice"] == "initial_state":
        road = "initial_state (chosen)"
    else:
        why = "; ".join(carry_over["transplant_refusals"])
        road = f"initial_state (transplant does not apply: {why})"
    for difference in carry_over.get("differences", []):
        road += f"\n  WARNING (accepted): the initialState road changes results: {difference}"
    return road


def job_fields(plan: dict[str, Any], settled: dict[str, Any] | None = None) -> dict[str, str]:
    """This run's values of the fields of :data:`stateops.core.steps.MIGRATION_STEPS`
    (``settled``: the backup step's result, once it ran)."""
    return {
        "query": plan["query"],
        "run_id": plan["run_id"],
        "cutover": plan["cutover"],
        "old_checkpoint": plan["old"]["checkpoint"],
        "export": plan["export"],
        "last_committed_batch": str((settled or {}).get("last_committed_batch", "")),
        "accept": "yes" if plan["carry_over"].get("accepted") else "no",
    }


def _lock_file(target: Target, run_id: str) -> Path:
    """The query's lifecycle lock (:meth:`stateops.control.target.Target.lock`): a running
    query holds it, and the migration's hold lives beside it."""
    return target.lock_file


def _step_lock(target: Target, plan: dict[str, Any], step: str) -> QueryLock:
    """The query's lease for one step of the run that holds it (its hold admits the run's
    id): a switch and its roll back, started at once on two hosts (Airflow failed the switch
    task while its process lived on), exclude each other, and the one that lost the lease
    writes nothing more (:mod:`stateops.core.fence`)."""
    registry = target.require_registry()
    return QueryLock(
        _lock_file(target, plan["run_id"]),
        plan["query"],
        step,
        plan["run_id"],
        ttl_seconds=registry.lease_seconds,
    )


def prepare_migration(target: Target, plan: dict[str, Any]) -> dict[str, Any]:
    """Hold the query for the run: until the switch or the roll back, only its steps run.
    Every later step calls it again: the hold is renewed, and a hold lost (expired and taken
    by another run) fails the step instead of going on unprotected."""
    operation = plan.get("operation", OPERATION)
    hold_query(_lock_file(target, plan["run_id"]), plan["query"], operation, plan["run_id"])
    return plan


def settle_migration(
    target: Target, plan: dict[str, Any], log: Callable[[str], None] = print
) -> dict[str, Any]:
    """After the drain: the old checkpoint's final batch, the road the state takes (see
    :func:`stateops.ops.transplant.choose_road`), and the registry the new query runs with (new
    source and checkpoint; its output continues the old numbering after that batch, from the
    ``batch_id=`` folder ``output_from``).
    """
    registry = target.require_registry()
    query = unmoved_query(registry, plan)
    cp = load_checkpoint(query.checkpoint)
    last = cp.last_committed_batch
    _refuse_unread(query.inputs[plan["source_name"]], cp, last)
    runs_as, start = _started(_planned_query(query, plan), plan)
    road = _carry_road(
        query, plan["carry_over"]["choice"], transplant_refusals(cp, runs_as, last), log
    )
    if road == "initial_state":
        refuse_differences(
            query.name,
            carry_differences(cp, runs_as, last),
            plan["carry_over"].get("accepted", False),
            _ACCEPT,
        )
    # A transplanted checkpoint goes on from batch last + 1 (its first batch is last + 2 after
    # Spark's repartition batch, which writes no output), a bootstrapped one from batch 0.
    if road == "transplant":
        offset = query.sink.batch_offset
        first = last + 1 + (repartition_from(cp, runs_as, last) is not None)
    else:
        offset, first = query.sink.folder_batch(last) + 1, 0
    derive_registry(registry, plan, runs_as, offset)
    return {
        "start": start,
        "last_committed_batch": last,
        "sink_batch_offset": offset,
        "road": road,
        "output_from": offset + first,
    }


def unmoved_query(registry: Registry, plan: dict[str, Any]) -> Query:
    """The plan's query, refused where it moved to another checkpoint since the preflight."""
    query = registry.query(plan["query"])
    if query.checkpoint != plan["old"]["checkpoint"]:
        raise StateOpsError(f"{query.name} moved to {query.checkpoint} since the preflight")
    return query


def derive_registry(registry: Registry, plan: dict[str, Any], runs_as: Query, offset: int) -> None:
    """The registry the new query runs with (the plan's ``new.registry``): ``runs_as``'s
    sources and checkpoint, its output going on at the sink's ``batch_id=offset``."""
    changes = placement(runs_as) | {"sink": runs_as.sink.model_dump() | {"batch_offset": offset}}
    derived_registry(registry, runs_as.name, changes, plan["new"]["registry"])


def _refuse_unread(old: Source, cp: Checkpoint, last: int | None) -> None:
    """Refuse, after the drain, an old source its checkpoint has not read to its end (its
    kind's :meth:`SourceKind.unread`: records left on a topic), which would be lost."""
    if last is None:
        return
    entries = cp.offsets[last].source_offsets
    raw = next((o for o in entries if old.kind.claims(o) and old.kind.matches(old, o)), None)
    unread = old.kind.unread(old, raw)
    if unread:
        raise StateOpsError(f"{cp.root}: {unread}")


def _started(runs_as: Query, plan: dict[str, Any]) -> tuple[Query, str | None]:
    """The new query with its new Kafka source's start (None for a file source): the offsets
    entry at the plan's start (:meth:`SourceKind.start_entry`; the topic's end
    at the drain's end where the cutover is ``drain``), also as the source's
    ``startingOffsets``, which Spark reads on the first start of the initialState road's
    empty checkpoint (the transplant writes the entry into the checkpoint itself)."""
    name, start = plan["source_name"], plan["new"].get("start")
    source = runs_as.inputs[name]
    if not source.kind.positioned:
        return runs_as, None
    cutover = plan["cutover"]
    if start in (None, "cutover") and cutover == "drain":
        # The drain's end is now: the topic's end (not a time, which a topic that retention
        # emptied would refuse as no longer retained).
        at: str | int = "latest"
    else:
        at = start_at(source, start, cutover)
    entry = source.kind.start_entry(source, at)
    return runs_as.with_input(name, source.kind.starting(source, entry)), entry


def backup_for_migration(
    target: Target,
    plan: dict[str, Any],
    backup: BackupFirst,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """The backup step: the drained old checkpoint settled (:func:`settle_migration`), then
    backed up (``backup``: :func:`stateops.ops.backup.backup_first`, to the registry's
    ``backups.url``, the plan's ``backup_to``); the settlement plus the ``backup_id``."""
    prepare_migration(target, plan)
    settled = settle_migration(target, plan, log)
    log(
        f"{plan['query']}: drained to batch {settled['last_committed_batch']}; the new "
        f"checkpoint's output continues at batch_id={settled['output_from']}"
    )
    # Held since the drain, the checkpoint's last committed batch is the settled one.
    return settled | {"backup_id": backup()}


def transplant_for_migration(
    target: Target,
    plan: dict[str, Any],
    settled: dict[str, Any],
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """The transplant road: the new checkpoint from the old one's state at the drained batch;
    the new query's first batch is then proven against that state."""
    from stateops.ops.pending import mark_transplant

    prepare_migration(target, plan)
    new_registry = load_registry(plan["new"]["registry"])
    query = new_registry.query(plan["query"])
    result = transplant_checkpoint(
        plan["old"]["checkpoint"],
        query.checkpoint,
        query,
        settled["last_committed_batch"],
        start=settled.get("start"),
        log=log,
    )
    mark_transplant(result)
    return result


def stop_running_query(
    target: Target,
    run_id: str,
    log: Callable[[str], None] = print,
    timeout_seconds: float = 600,
) -> str | None:
    """Stop ``target``'s running query gracefully (its stop marker) and wait until its run
    ends; ``run_id``: the migration's.

    Returns the stopped run's id (None when nothing ran). A run on an ``available-now``
    trigger ignores the marker and ends by itself; it is waited for just the same.
    """
    registry, name = target.require_registry(), target.require_query(_REGISTERED).name
    path = _lock_file(target, run_id)
    held = live_lock(path)
    if held is None:
        log(f"{name}: not running")
        return None
    if held.operation != "run":
        raise LockHeldError(f"query {name!r} is locked by {held.operation} (run {held.run_id})")
    marker = request_stop(registry, name, held)
    log(f"{name}: stopping run {held.run_id} after its current batch ({marker})")
    deadline = time.monotonic() + timeout_seconds
    while (current := live_lock(path)) is not None and current.token == held.token:
        if time.monotonic() > deadline:
            withdraw_stop(registry, name)  # a later stop would surprise whoever runs it then
            raise StateOpsError(
                f"{name}: run {held.run_id} did not stop within {timeout_seconds:.0f} s; stop it "
                f"(stateops stop {name}), then trigger the migration again"
            )
        time.sleep(1)
    marker.unlink(missing_ok=True)
    log(f"{name}: run {held.run_id} stopped")
    return held.run_id


def check_carry_over(plan: dict[str, Any], run_id: str) -> dict[str, Any]:
    """The new query's first batch on the new checkpoint (after a bootstrap or a transplant):
    its proof, and file-level integrity."""
    summary = read_summary(load_registry(plan["new"]["registry"]), plan["query"], run_id)
    if summary["status"] != "succeeded":
        raise StateOpsError(f"{plan['query']} on the new source failed: {summary['error']}")
    proof = summary.get("proof")
    if summary["bootstrap"] != "complete":
        raise StateOpsError(
            f"carry-over of {plan['query']} is {summary['bootstrap']}: no batch committed on "
            "the new source, so it is not proven"
        )
    if not (proof and proof["ok"]):
        raise StateOpsError(f"carry-over of {plan['query']} not proven: {proof}")
    findings = verify_checkpoint(plan["new"]["checkpoint"])
    if not findings["ok"]:
        raise CheckpointError(f"new checkpoint fails verification: {error_summary(findings)}")
    return {
        "bootstrap": summary["bootstrap"],
        "proof": proof,
        "last_committed_batch": summary["last_committed_batch"],
    }


def prove_migration(
    target: Target, plan: dict[str, Any], log: Callable[[str], None] = print
) -> dict[str, Any]:
    """The prove step: :func:`check_carry_over` on the new checkpoint's first batch."""
    prepare_migration(target, plan)
    result = check_carry_over(plan, plan["run_id"])
    proof = result["proof"]
    log(f"{plan['query']}: carry-over proven ({proof['variables']}; {proof['proof_file']})")
    return result


def switch_migration(
    target: Target,
    plan: dict[str, Any],
    settled: dict[str, Any],
    carry_over: dict[str, Any],
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """The switch step: :func:`switch_query`, said."""
    prepare_migration(target, plan)
    lineage = switch_query(target, plan, settled, carry_over)
    log(
        f"{plan['query']}: switched to {_where(plan['new']['source'])} and "
        f"{plan['new']['checkpoint']}; {plan['old']['checkpoint']} kept, retired "
        f"(backup {settled['backup_id']}); lineage in "
        f"{audit_dir(plan['new']['checkpoint']) / 'lineage.json'}"
    )
    return lineage


class Steps:
    """An operation's steps run in one process as the DAG runs them as tasks (the CLI's
    ``stateops migrate`` and ``stateops upgrade``): which step runs (named when one fails),
    ``STATEOPS_FAIL_AFTER`` after each, and its Spark steps (``table``: the step -> its job,
    registry and arguments) with the run's ``fields`` on the user's registry (``old``) or the
    one the plan derives (``plan["new"]["registry"]``), through ``run_job``."""

    def __init__(
        self,
        table: dict[str, Any],
        target: Target,
        plan: dict[str, Any],
        run_job: Callable[[str, str, list[str]], None],
        fields: dict[str, str],
    ) -> None:
        self.table, self.plan, self.run_job, self.fields = table, plan, run_job, fields
        self.registry = str(target.require_registry().path)
        self.step = "preflight"

    def run(self, name: str, action: Callable[[], Any]) -> Any:
        self.step = name
        result = action()
        fail_after(name)  # STATEOPS_FAIL_AFTER, as the DAG's tasks
        return result

    def spark(self, name: str) -> None:
        job, which, args = fill(self.table[name], self.fields)
        self.run_job(job, self.registry if which == "old" else self.plan["new"]["registry"], args)


def run_migration(
    target: Target,
    plan: dict[str, Any],
    *,
    backup: BackupFirst,
    run_job: Callable[[str, str, list[str]], None],
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Every step of ``stream_source_migration`` after its preflight (``plan``, which carries
    the run id), in one process (the CLI's ``stateops migrate``), with the same step functions
    and Spark jobs; a failure rolls the run back (:func:`roll_back_migration`) and raises,
    naming the step. The run holds the query itself (:func:`prepare_migration`).

    ``backup``: :func:`stateops.ops.backup.backup_first`, taken after the drain.
    ``run_job(job, registry_file, args)`` runs one Spark job (``spark-submit`` for the CLI) and
    raises when it fails. Returns the lineage the switch recorded.
    """
    steps = Steps(MIGRATION_STEPS, target, plan, run_job, job_fields(plan))
    run, spark = steps.run, steps.spark
    prepare_migration(target, plan)  # refused: nothing changed yet, nothing to roll back
    try:
        run("stop_query", lambda: stop_running_query(target, plan["run_id"], log))
        run("drain", lambda: spark("drain"))
        settled = run("backup", lambda: backup_for_migration(target, plan, backup, log))
        steps.fields = job_fields(plan, settled)
        run("carry_over", lambda: log(f"carry-over road: {settled['road']}"))
        if settled["road"] == "transplant":
            run("transplant", lambda: transplant_for_migration(target, plan, settled, log))
            run("first_batch", lambda: spark("first_batch"))
        else:
            for name in INITIAL_STATE_ROAD:
                run(name, lambda name=name: spark(name))
        carried = run("prove", lambda: prove_migration(target, plan, log))
        run("validate_new_state", lambda: spark("validate_new_state"))
        lineage = run("switch", lambda: switch_migration(target, plan, settled, carried, log))
    except Exception as err:
        log(f"{plan['query']}: {steps.step} failed: {one_line(err)}")
        roll_back_migration(target, plan, log)
        raise OperationFailed(
            f"the migration of {plan['query']} failed at {steps.step} ({one_line(err)}); it was "
            f"rolled back and the query runs on {plan['old']['checkpoint']}: fix the cause "
            "and migrate again"
        ) from err
    return lineage


def switch_query(
    target: Target,
    plan: dict[str, Any],
    settled: dict[str, Any],
    carry_over: dict[str, Any],
) -> dict[str, Any]:
    """Point the query at the new source and checkpoint, record the lineage, retire the old
    checkpoint (:func:`_retire`), and release the hold. ``settled`` is
    :func:`settle_migration`'s result plus the ``backup_id``."""
    with _step_lock(target, plan, "switch"):
        return _switch(target, plan, settled, carry_over)


def _switch(
    target: Target,
    plan: dict[str, Any],
    settled: dict[str, Any],
    carry_over: dict[str, Any],
) -> dict[str, Any]:
    """:func:`switch_query`'s work, under the step's lease."""
    registry, name, old, new = target.require_registry(), plan["query"], plan["old"], plan["new"]
    backup_id = settled["backup_id"]
    last = load_checkpoint(old["checkpoint"]).last_committed_batch
    if last != settled["last_committed_batch"]:
        raise StateOpsError(
            f"{old['checkpoint']} moved on to batch {last} after the drain (batch "
            f"{settled['last_committed_batch']}): its later input is not in the export"
        )
    operation = plan.get("operation", OPERATION)  # a code upgrade switches the same way
    lineage = {
        "operation": operation,
        "run_id": plan["run_id"],
        "time": _now(),
        "source_name": plan["source_name"],
        "from": {
            "checkpoint": old["checkpoint"],
            "query_id": old["query_id"],
            "last_committed_batch": settled["last_committed_batch"],
            "source": old["source"],
            "sink_batch_offset": old["sink_batch_offset"],
        },
        "to": {
            "checkpoint": new["checkpoint"],
            "source": new["source"],
            "sink_batch_offset": settled["sink_batch_offset"],
            # its carried-over batches: what its own runs commit comes after them
            "last_committed_batch": load_checkpoint(new["checkpoint"]).last_committed_batch,
        },
        "backup_id": backup_id,
        "export": plan["export"],
        "carry_over": settled["road"],
        "bootstrap": carry_over["bootstrap"],
        "proof": (carry_over["proof"] or {}).get("proof_file"),
    }
    lineage_file = audit_dir(new["checkpoint"]) / "lineage.json"
    write_file(lineage_file, json.dumps(lineage, indent=2) + "\n")
    common = {"run_id": plan["run_id"], "batch_before": settled["last_committed_batch"]}
    append_audit(
        new["checkpoint"],
        operation,
        result="derived",
        derived_from=old["checkpoint"],
        backup_id=backup_id,
        **common,
    )
    write_switch(
        registry,
        name,
        new["source"],
        new["checkpoint"],
        lineage,
        sink_batch_offset=settled["sink_batch_offset"],
        input_name=plan["source_name"],
    )
    _retire(plan, new["checkpoint"])
    append_audit(
        old["checkpoint"],
        operation,
        result="retired",
        migrated_to=new["checkpoint"],
        backup_id=backup_id,
        **common,
    )
    release_hold(_lock_file(target, plan["run_id"]), plan["run_id"])
    return lineage


def roll_back_migration(
    target: Target,
    plan: dict[str, Any],
    log: Callable[[str], None] = print,
    reason: str | None = None,
) -> dict[str, Any]:
    """Undo what a failed migration run did; the old query can start again afterwards.
    ``reason``: why a switch that was done is undone (its readiness window,
    :mod:`stateops.ops.readiness`), kept in the switch's history and the audit."""
    name, old, new = plan["query"], plan["old"], location(plan["new"]["checkpoint"])
    operation = plan.get("operation", OPERATION)  # a code upgrade rolls back the same way
    done: dict[str, Any] = {"switch_undone": False, "moved_aside": []}
    # As it is now: a switch may have been written.
    target = query_target(target.require_registry().path, name)
    registry = target.require_registry()
    prepare_migration(target, plan)  # held again (a switch releases it) while undoing
    stop_running_query(target, plan["run_id"], log)  # e.g. started on the new checkpoint
    with _step_lock(target, plan, "roll back"):  # a stale switch's writes fail from here on
        if registry.query(name).checkpoint == str(new):
            undo = {
                "operation": f"{operation} rolled back",
                "run_id": plan["run_id"],
                "time": _now(),
            }
            if reason:
                undo["reason"] = reason
            write_switch(
                registry,
                name,
                old["source"],
                old["checkpoint"],
                undo,
                sink_batch_offset=old["sink_batch_offset"],
                input_name=plan["source_name"],
            )
            done["switch_undone"] = True
            log(f"{name}: switch undone: back on {old['checkpoint']}")
        _unretire(old["checkpoint"])
        done["moved_aside"] = _set_aside(plan, new, log)
        query = load_registry(registry.path).query(name)  # on the old checkpoint again
        old_last = load_checkpoint(old["checkpoint"]).last_committed_batch
        # The output after the old checkpoint's last commit: the new checkpoint's batches, or the
        # old one's batch in flight when a step was lost (its next run writes it again).
        undo = query.sink.kind.undo_plan(query.sink, old_last)
        if undo is not None:
            set_aside(undo, f"migration-{safe_run_id(plan['run_id'])}")
            for line in query.sink.kind.plan_lines(undo):
                log(f"{name}: the output after batch {old_last} set aside:{line[1:]}")
        clear_carry_over(new)  # it belonged to the moved checkpoint
        if release_hold(_lock_file(target, plan["run_id"]), plan["run_id"]):
            log(f"{name}: hold of run {plan['run_id']} released")
        if old["checkpoint"]:
            why = {"reason": reason, "moved_aside": done["moved_aside"]} if reason else {}
            append_audit(
                old["checkpoint"], operation, run_id=plan["run_id"], result="rolled back", **why
            )
    log(f"{name}: {operation} rolled back; the query runs on {old['checkpoint']} as before")
    return done


def _retire(plan: dict[str, Any], migrated_to: str) -> None:
    """The old checkpoint, retired: the hold every start and lifecycle operation refuse
    (:func:`stateops.control.markers.refuse_retired`); on local disk its files read-only too."""
    old = location(plan["old"]["checkpoint"])
    write_retired(
        old,
        {
            "state": "retired",
            "query": plan["query"],
            "run_id": plan["run_id"],
            "time": _now(),
            "migrated_to": migrated_to,
        },
    )
    if isinstance(old, Path):
        _set_read_only(old, True)


def _unretire(checkpoint: str | Path | S3Path) -> bool:
    """Lift a retirement hold (local: the files writable again); True if there was one."""
    root = location(checkpoint)
    if isinstance(root, Path) and root.is_dir():
        _set_read_only(root, False)
    return clear_retired(root)


def _set_aside(plan: dict[str, Any], new: Path | S3Path, log: Callable[[str], None]) -> list[str]:
    """A failed run's new checkpoint, out of the way of the old query and the next run: on
    local disk renamed (with its audit folder) ``<checkpoint>.failed-<run>``; in S3, which has
    no rename, kept in place under a hold (one put: :func:`stateops.control.markers.
    write_retired`, ``set aside``), so nothing starts on it and the next run's default
    checkpoint is the next free name. Where it is now."""
    if isinstance(new, S3Path):
        if not occupied(new):
            return []
        write_retired(
            new,
            {
                "state": "set aside",
                "query": plan["query"],
                "run_id": plan["run_id"],
                "time": _now(),
                "old_checkpoint": plan["old"]["checkpoint"],
            },
        )
        log(
            f"set {new} aside in place (S3 has no rename): held against any start; "
            f"stateops unretire {new} lifts the hold"
        )
        return [str(new)]
    moved = []
    aside = new.with_name(f"{new.name}.failed-{safe_run_id(plan['run_id'])}")
    for here, there in ((new, aside), (audit_dir(new), audit_dir(aside))):
        if here.exists():
            os.replace(here, there)
            moved.append(str(there))
            log(f"moved {here} aside to {there}")
    return moved


def unretire(checkpoint: str, log: Callable[[str], None] = print) -> dict[str, Any] | None:
    """``stateops unretire``: lift the hold of a migration's retired old checkpoint or of a
    failed one's new checkpoint set aside (and locally make its files writable again); the
    hold it lifted, or None where there was none (nothing changed: it can be run again)."""
    held = read_retired(checkpoint)
    if held is None:
        log(f"{checkpoint}: not retired nor set aside: nothing to lift")
        return None
    _unretire(checkpoint)
    append_audit(checkpoint, OPERATION, run_id=str(held.get("run_id")), result="unretired")
    log(f"{checkpoint}: the hold ({held.get('state')}, run {held.get('run_id')}) is lifted")
    return held


def _set_read_only(root: Path, read_only: bool) -> None:
    """Files of a retired checkpoint are read-only (folders stay writable: a roll back can
    make the files writable again and the old query can restart)."""
    write = stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH
    for folder, _, files in os.walk(root):
        for name in files:
            path = Path(folder, name)
            mode = path.stat().st_mode
            path.chmod(mode & ~write if read_only else mode | stat.S_IWUSR)
