"""State transplant: a new checkpoint made of an old one's state files, for a new source.

The fast road to carry state over (the other is ``initialState``, see
:mod:`stateops.ops.bootstrap`): the state files of the old checkpoint already hold what the query
needs. The new checkpoint gets the restart set of the old one at its last committed batch N (state
files, operator metadata and schema files), a new query id, and the offsets of batches N-1 and N
(Spark reads both on restart) with each moved source's offset replaced by a starting position;
the commit of batch N carries the watermark. The new query's first batch is N + 1.

Which sources moved: the old checkpoint's logs name the files each of its sources read; a
source whose files lie under one of the new query's source folders is kept (its offset and log
are copied, it goes on where it was), any other starts anew. Spark numbers a query's sources in
the order its plan reads them, which the same code on the same inputs keeps.

It applies only where Spark would read those files as its own: the same stateful operator,
state variables and schemas, time and output mode, state store provider and format settings.
Where only the partition count differs, the transplant keeps the old one and Spark's repartition
(:mod:`stateops.ops.repartition`) gives the new checkpoint the query's count in a batch N + 1
that reads no input, before the query's first batch, N + 2 (RocksDB state in format v1:
what Spark repartitions). For a ``transform`` (Spark's built-in operators) the same function
on a source of the same columns plans the same operators, so only the settings are checked
here and Spark checks the state schemas when the new query starts. :func:`transplant_refusals`
says why not, before anything is written; the migration then takes the ``initialState`` road
(a processor's) or is refused (a transform's). The old checkpoint is only read.

Pure Python, no Spark.
"""

from __future__ import annotations

import filecmp
import json
import os
import re
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from stateops.core import faults
from stateops.core.checkpoint import Checkpoint, interrupted_batch, load_checkpoint
from stateops.core.errors import StateOpsError
from stateops.core.files import relocate_checkpoint, relocated_metadata
from stateops.core.formats import crc_sidecar, hadoop_crc
from stateops.core.plans import plan_head, plan_tail
from stateops.core.registry import Query, Source
from stateops.core.report import format_bytes
from stateops.core.staging import Staging, occupied, remove_stale_staging
from stateops.core.steps import ROADS
from stateops.core.storage import S3Path, copy_to_local, list_files, location, publish
from stateops.kinds import SOURCE_KINDS, kind_at
from stateops.kinds.base import start_at
from stateops.ops.repartition import repartition_unsupported
from stateops.ops.state_schema import (
    KINDS,
    OPERATOR,
    TIME_MODES,
    declared_state,
    grouping_key,
    operator_properties,
    operator_state,
    show,
    split_key,
    user_variables,
)

if TYPE_CHECKING:
    from stateops.control.target import Target

__all__ = [
    "carry_differences",
    "fresh_sources",
    "refuse_differences",
    "ROADS",
    "TransplantRefused",
    "choose_road",
    "repartition_from",
    "run_transplant",
    "start_at",
    "state_differences",
    "transplant_checkpoint",
    "transplant_refusals",
]

STAGING = "transplanting"


class TransplantRefused(StateOpsError):
    """The transplant does not apply; the message lists every reason."""


def transplant_refusals(cp: Checkpoint, query: Query, batch: int | None = None) -> list[str]:
    """Why ``query`` cannot run on ``cp``'s state files as its own (empty: it can).

    ``query`` is the query as it will run: its new source, processor, partitions and settings.
    """
    batch = cp.last_committed_batch if batch is None else batch
    if batch is None:
        return [f"{cp.root} has no committed batch: there is no state to transplant"]
    if batch not in cp.commits or batch not in cp.offsets:
        return [f"batch {batch} is not a committed batch of {cp.root}"]
    reasons = []
    if cp.uncommitted_batches:
        reasons.append(
            f"{interrupted_batch(cp.uncommitted_batches[0])}: a run of its query finishes it, "
            f"or stateops rollback {cp.root} "
            f"--to-batch {cp.last_committed_batch} drops it"
        )
    reasons += fresh_sources(cp, query, batch)[1]
    expected = query.spark_conf_for_query()
    for key, old in sorted(cp.offsets[batch].conf.items()):
        new = expected.get(key)
        if new is not None and new != old and key != "spark.sql.shuffle.partitions":
            short = key.removeprefix("spark.sql.")
            reasons.append(f"{short} is {old} in the old checkpoint, {new} for the new query")
    ops = cp.operators
    if query.processor is not None and (len(ops) != 1 or ops[0].operator_name != OPERATOR):
        names = [op.operator_name for op in ops]
        return reasons + [f"stateful operators {names}: expected one {OPERATOR}"]
    for provider in sorted({op.provider for op in ops} - {query.state_store.provider}):
        reasons.append(f"state files are {provider}, the query uses {query.state_store.provider}")
    if ops and cp.format_version != query.state_store.checkpoint_format:
        # The offsets log does not record the setting; Spark would read the files in the
        # query's format.
        reasons.append(
            f"the old checkpoint is in format v{cp.format_version}, the query writes format "
            f"v{query.state_store.checkpoint_format} (state_store.checkpoint_format)"
        )
    old_partitions = repartition_from(cp, query, batch)
    unsupported = old_partitions and repartition_unsupported(cp, query)
    if unsupported:
        reasons.append(
            f"the old state has {old_partitions} partitions, the query "
            f"{query.shuffle_partitions} (shuffle_partitions), and {unsupported}"
        )
    if query.transform is not None:
        # Spark's built-in operators: the same function plans the same operators and state
        # schemas on any source of the same columns, and Spark checks the schemas on restart.
        return reasons
    if ops[0].store_names != ["default"]:
        reasons.append(f"state stores {ops[0].store_names}, expected ['default']")
    return reasons + state_differences(cp, query, batch)


def repartition_from(cp: Checkpoint, query: Query, batch: int) -> int | None:
    """The old state's partition count where ``query`` runs with another (None: the same).
    The transplant keeps the old count; Spark's repartition then gives the query its own
    before its first batch (:func:`stateops.ops.pending.mark_transplant`)."""
    old = cp.partitions(batch) or max((op.num_partitions for op in cp.operators), default=None)
    return old if old not in (None, query.shuffle_partitions) else None


def fresh_sources(cp: Checkpoint, query: Query, batch: int) -> tuple[dict[int, str], list[str]]:
    """The old checkpoint's sources (their offsets index) that ``query`` reads anew, each with
    the name of the input that replaces it, and why its sources cannot be matched with the old
    ones (empty: they can).

    A file source is kept when every file it logged lies under the folder of one of
    ``query``'s file inputs, a Kafka source when one of its Kafka inputs subscribes exactly its
    topics (:func:`stateops.core.sources.goes_on`): that input goes on where it was. Any other
    (moved, or nothing read yet) starts anew; ``query`` reads as many sources as the old query
    did. Where a Kafka input starts anew, which old source it replaces must be clear: one moved
    source at a time.
    """
    offsets = cp.offsets[batch].source_offsets
    inputs = query.inputs
    if len(offsets) != len(inputs):
        return {}, [f"the old query read {len(offsets)} sources, the query reads {len(inputs)}"]
    reasons: list[str] = []
    fresh: list[int] = []
    kept: dict[str, list[int]] = {}
    for i in range(len(offsets)):
        owners = _owners(cp, query, batch, i, reasons)
        if owners is None:
            continue
        if len(owners) > 1:
            reasons.append(f"source {i} read from the places of {' and '.join(owners)}")
        elif owners:
            kept.setdefault(owners[0], []).append(i)
        else:
            fresh.append(i)
    reasons += [
        f"sources {' and '.join(map(str, ix))} both read {name}'s input"
        for name, ix in kept.items()
        if len(ix) > 1
    ]
    anew = [name for name in inputs if name not in kept]
    if len(fresh) == len(anew) == 1:
        return {fresh[0]: anew[0]}, reasons
    told = [name for name in anew if inputs[name].kind.positioned]
    if told:
        reasons.append(
            f"input {', '.join(told)} ({inputs[told[0]].where}) starts anew along with other "
            "sources where it is told, and which old source each replaces is unknown: move "
            "one source at a time"
        )
    return {i: "" for i in fresh}, reasons


def _owners(
    cp: Checkpoint, query: Query, batch: int, i: int, reasons: list[str]
) -> list[str] | None:
    """The inputs of ``query`` that go on from old source ``i``, as their kinds say (None: the
    old source is of no kind stateops knows, said in ``reasons``)."""
    if kind_at(cp.entry(batch, i)) is None and cp.file_log_offset(batch, i) is None:
        reasons.append(f"source {i} of the old checkpoint is of no kind stateops knows")
        return None
    return [
        name for name, source in query.inputs.items() if source.kind.goes_on(source, cp, batch, i)
    ]


def _starts(query: Query, fresh: dict[int, str], start: str | None) -> dict[int, str]:
    """Each source read anew -> the entry it starts at: a source whose kind is told where it
    starts (a topic) at ``start`` (:meth:`SourceKind.start_entry`), any other at its
    beginning (a folder: before its first file). An unnamed one (several moved at once:
    refused unless none is told where) starts as the query's sources that are not."""
    starts = {}
    for i, name in fresh.items():
        source = query.inputs.get(name) or next(
            (s for s in query.inputs.values() if not s.kind.positioned), None
        )
        if source is None:
            continue
        if source.kind.positioned:
            if not start:
                raise TransplantRefused(
                    f"say where the new checkpoint starts {source.where}: a cutover time, its "
                    "end (latest) or its beginning (earliest)"
                )
            starts[i] = start
        else:
            starts[i] = source.kind.start_entry(source, None)
    return starts


def state_differences(cp: Checkpoint, query: Query, batch: int) -> list[str]:
    """How the state ``query``'s processor declares differs from ``cp``'s one
    ``transformWithState`` operator at ``batch`` (variables, kinds, TTLs, value and key
    schemas, time and output mode); empty: the same."""
    try:
        props, families = operator_state(cp, batch)
        declared = declared_state(query)
    except (StateOpsError, ValueError, KeyError, TypeError, AttributeError) as err:
        return [f"the state schemas cannot be compared: {str(err).splitlines()[0]}"]
    return _state_differences(query, props, families, declared)


def _state_differences(
    query: Query, props: dict, families: dict[str, Any], declared: dict[str, dict[str, Any]]
) -> list[str]:
    reasons = []
    if props.get("timeMode") != TIME_MODES[query.processor.time_mode]:
        reasons.append(
            f"time mode {props.get('timeMode')} in the old checkpoint, "
            f"{query.processor.time_mode} for the query"
        )
    if props.get("outputMode") != query.processor.output_mode:
        reasons.append(
            f"output mode {props.get('outputMode')} in the old checkpoint, "
            f"{query.processor.output_mode} for the query"
        )
    old = user_variables(props)
    if set(old) != set(declared):
        reasons.append(
            f"state variables {sorted(old)} in the old checkpoint, {sorted(declared)} declared "
            "by the processor"
        )
    key = grouping_key(query)
    for name in sorted(set(old) & set(declared)):
        var, was = declared[name], old[name]
        if was["stateVariableType"] != KINDS[var["kind"]] or bool(was["ttlEnabled"]) != var["ttl"]:
            reasons.append(
                f"state {name!r} is {was['stateVariableType']} (ttl {was['ttlEnabled']}) in the "
                f"old checkpoint, {KINDS[var['kind']]} (ttl {var['ttl']}) for the processor"
            )
            continue
        family = families.get(name)
        if family is None:
            reasons.append(f"state {name!r}: no schema in the old checkpoint")
            continue
        if family["value"] != var["value"]:
            reasons.append(
                f"state {name!r} holds {show(family['value'])} in the old checkpoint, the "
                f"processor declares {show(var['value'])}"
            )
        grouping, user_key = split_key(family["key"])
        if grouping[: len(key)] != key:
            reasons.append(f"state {name!r} is keyed by {show(grouping)}, the query by {show(key)}")
        if var["user_key"] is not None and (user_key or grouping[len(key) :]) != var["user_key"]:
            reasons.append(f"map state {name!r}: its user key schema changed")
    return reasons


def carry_differences(cp: Checkpoint, query: Query, batch: int | None = None) -> list[str]:
    """Why carrying ``cp``'s state to ``query`` by the initialState road would not give what
    the old query computes (empty: it gives the same): a processor whose state variables,
    schemas, time or output mode differ from the old checkpoint's (``handleInitialState``
    converts the state, and the query computes something else from then on), state with a
    TTL (its expiry starts again at the new checkpoint's first batch)."""
    batch = cp.last_committed_batch if batch is None else batch
    ops = cp.operators
    if len(ops) != 1 or not re.fullmatch(r"transformWithState\w*Exec", ops[0].operator_name):
        names = [op.operator_name for op in ops]
        return [f"stateful operators {names}: the carry-over takes one transformWithState"]
    reasons = state_differences(cp, query, batch)
    try:
        props, _ = operator_properties(cp, batch)
    except (StateOpsError, ValueError, KeyError, TypeError) as err:
        return [*reasons, f"the old operator metadata is unreadable: {str(err).splitlines()[0]}"]
    ttl = sorted(name for name, v in user_variables(props).items() if v.get("ttlEnabled"))
    if ttl:
        reasons.append(
            f"state {', '.join(map(repr, ttl))} has a TTL: the initialState road starts each "
            "entry's TTL again at the new checkpoint's first batch"
        )
    return reasons


def refuse_differences(name: str, differences: list[str], accepted: bool, how: str) -> None:
    """Refuse an initialState road that would change what query ``name`` computes
    (``differences``), unless the operator accepted it; ``how`` says how to accept it."""
    if differences and not accepted:
        raise StateOpsError(
            f"carrying {name}'s state by the initialState road would change what it computes: "
            f"{'; '.join(differences)}; to go on anyway, {how}"
        )


def choose_road(
    choice: str, reasons: list[str], log: Callable[[str], None] = print, *, transform: bool = False
) -> str:
    """``transplant`` or ``initial_state`` for a ``carry_over`` choice; ``auto`` falls back to
    ``initial_state`` (saying why) where the transplant does not apply. A ``transform``'s
    state (Spark's built-in operators take no initial state) takes the transplant only."""
    if choice not in ROADS:
        raise StateOpsError(f"carry_over {choice!r}: choose one of {', '.join(ROADS)}")
    if transform and choice == "initial_state":
        raise StateOpsError("carry_over initial_state is for processors: choose auto or transplant")
    if choice == "initial_state":
        return choice
    if not reasons:
        return "transplant"
    why = "; ".join(reasons)
    if transform:
        raise TransplantRefused(
            f"the transplant does not apply: {why}; a transform's state moves to a new source "
            "by transplant only"
        )
    if choice == "transplant":
        raise TransplantRefused(
            f"the transplant does not apply: {why}; choose carry_over auto or initial_state"
        )
    log(f"transplant does not apply ({why}): falling back to the initialState road")
    return "initial_state"


def run_transplant(
    target: Target,
    new: str | os.PathLike[str],
    *,
    query: str | None = None,
    source: str | None = None,
    source_format: str | None = None,
    source_path: str | None = None,
    source_topic: str | None = None,
    source_bootstrap_servers: str | None = None,
    source_start: str | None = None,
    cutover: str | None = None,
    batch: int | None = None,
    run_id: str,
    dry_run: bool = False,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Transplant ``target``'s checkpoint into ``new`` for registered query ``query`` (default:
    the one that owns it) with its input ``source`` (default: its only one) moved to
    ``source_format``/``source_path`` (default: as registered), under the lock of the
    checkpoint's owner; the transplanted checkpoint then awaits its first batch's proof
    (:func:`stateops.ops.pending.mark_transplant`). A dry run checks and prints the plan.
    A Kafka source (``source_format`` kafka, ``source_topic``) starts at ``source_start``:
    ``cutover`` (the offsets at time ``cutover``), ``earliest`` or ``latest``."""
    from stateops.ops.pending import mark_transplant  # pending -> carry -> this module

    registry = target.require_registry()
    if query and target.query is not None and target.query.name != query:
        # Nothing but Spark's restart would catch it for a transform, after a batch is planned.
        raise StateOpsError(
            f"{target.checkpoint} is query {target.query.name}'s checkpoint, not {query}'s: a "
            f"transplant carries a query's own state; give --query {target.query.name}"
        )
    owner = (
        registry.query(query)
        if query
        else target.require_query(
            "name the query whose processor will run on the transplanted state (--query NAME)"
        )
    )
    moved = owner.input_name(source)
    moved_source = _moved_source(
        owner.inputs[moved],
        {
            "format": source_format,
            "path": source_path and registry.data_path(source_path),
            "topic": source_topic,
            "bootstrap_servers": source_bootstrap_servers,
        },
    )
    # A topic the query goes on reading (unchanged) needs no start: its offsets are copied.
    goes_on_reading = moved_source == owner.inputs[moved] and not (source_start or cutover)
    start = (
        moved_source.kind.start_entry(moved_source, start_at(moved_source, source_start, cutover))
        if moved_source.kind.positioned and not goes_on_reading
        else None
    )
    new = str(location(new).resolve())
    runs_as = owner.with_input(moved, moved_source).model_copy(update={"checkpoint": new})
    if dry_run:
        return transplant_checkpoint(
            target.checkpoint, new, runs_as, batch, start=start, dry_run=True, log=log
        )
    with target.lock("transplant", run_id):
        result = transplant_checkpoint(target.checkpoint, new, runs_as, batch, start=start, log=log)
        mark_transplant(result)
    log(
        f"next: run {owner.name} on {new} ({runs_as.inputs_text}); its first "
        f"batch, {result['first']}, is proven against the state of {target.checkpoint}"
        + (" (the start first has Spark repartition it)" if result["repartition"] else "")
    )
    return result


def _moved_source(current: Source, changes: dict[str, str | None]) -> Source:
    """``current`` with the given changes; a move between a folder and a topic drops what
    belongs to the other kind (its path, or its topics)."""
    given = {k: v for k, v in changes.items() if v}
    raw = current.model_dump(by_alias=True) | given
    if "format" in given and given["format"] in SOURCE_KINDS:
        new = SOURCE_KINDS[given["format"]]
        if new is not current.kind:  # the old kind's own fields go; an encoding is a topic's
            drop = {*current.kind.fields, "encoding"} - set(new.fields)
            raw = {k: v for k, v in raw.items() if k not in drop or k in given}
    try:
        return Source.model_validate(raw)
    except ValidationError as err:
        message = str(err.errors()[0]["msg"]).removeprefix("Value error, ")
        raise StateOpsError(f"new source: {message}") from None


def transplant_checkpoint(
    old: str | os.PathLike[str],
    new: str | os.PathLike[str],
    query: Query,
    batch: int | None = None,
    *,
    start: str | None = None,
    dry_run: bool = False,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Build ``new`` from ``old``'s state at committed ``batch`` (default: the last), for
    ``query`` (as it will run: new source and settings). Refuses with every reason, before
    writing anything, where the transplant does not apply; a dry run stops after the checks
    and the plan. ``old`` is only read; ``new`` is built in a staging folder beside it
    (``<new>.transplanting-<time>``) and renamed into place, so it is either complete or
    absent. Run again after a kill, it removes the staging folders of killed runs, and finds a
    ``new`` that already holds exactly this transplant (killed after its rename, or run twice)
    complete: ``already_transplanted``, and its query id is kept. ``start``: the offsets entry a
    Kafka input read anew starts at (:meth:`SourceKind.start_entry`), written into
    ``offsets/`` and its ``sources/<i>/0``."""
    started = time.monotonic()
    cp, new, batch, fresh, done = _check_transplant(old, new, query, batch, start)
    files = _state_files(cp, batch, fresh)
    size = sum(cp.sizes[rel] for rel in files)
    before = repartition_from(cp, query, batch)
    result = {
        "old": str(cp.root),
        "new": str(new),
        "batch": batch,
        "old_query_id": cp.query_id,
        "files": len(files),
        "bytes": size,
        "repartition": before and [before, query.shuffle_partitions],
        "first": batch + (2 if before else 1),
    }
    if done is not None:
        removed = [] if dry_run else remove_stale_staging(new, STAGING)
        log(
            f"{'DRY RUN: ' if dry_run else ''}already transplanted: {new} holds the state of "
            f"{cp.root} at batch {batch} (query id {done}); nothing to do"
        )
        return result | {
            "query_id": done,
            "already_transplanted": True,
            "removed_staging": removed,
            "dry_run": dry_run,
        }
    log(_transplant_plan(cp, new, query, result, fresh, dry_run))
    if dry_run:
        return result | {"dry_run": True}
    query_id, removed = _build_transplant(cp, new, files, _log_entries(cp, batch, fresh), log)
    seconds = time.monotonic() - started
    log(
        f"transplant done: {new} (query id {query_id}), {len(files)} files, "
        f"{format_bytes(size)} copied, {seconds:.1f} s"
    )
    return result | {
        "query_id": query_id,
        "already_transplanted": False,
        "removed_staging": removed,
        "seconds": round(seconds, 2),
    }


def _check_transplant(
    old: str | os.PathLike[str],
    new: str | os.PathLike[str],
    query: Query,
    batch: int | None,
    start: str | None,
) -> tuple[Checkpoint, Path | S3Path, int, dict[int, str], str | None]:
    """The old checkpoint, ``new`` resolved, the batch, the sources read anew, and the query
    id of a ``new`` that already holds this transplant (else None); refuses a ``new`` inside
    the old checkpoint or not empty, and a transplant that does not apply (every reason)."""
    new = location(new).resolve()
    cp = load_checkpoint(old)
    batch = cp.last_committed_batch if batch is None else batch
    if new == cp.root.resolve() or str(new).startswith(str(cp.root.resolve()) + "/"):
        raise StateOpsError(f"{new} is inside the old checkpoint {cp.root}")
    fresh = _starts(query, fresh_sources(cp, query, batch)[0] if batch in cp.offsets else {}, start)
    done = None
    if occupied(new):
        done = _transplanted(cp, batch, new, fresh)
        if done is None:
            raise StateOpsError(f"{new}: not empty; transplant into a new or empty folder")
    reasons = transplant_refusals(cp, query, batch)
    if reasons:
        raise TransplantRefused(f"transplant of {cp.root} refused: {'; '.join(reasons)}")
    return cp, new, batch, fresh, done


def _transplant_plan(
    cp: Checkpoint,
    new: Path | S3Path,
    query: Query,
    result: dict[str, Any],
    fresh: dict[int, str],
    dry_run: bool,
) -> str:
    """The transplant's plan for a person (the CLI, the task log)."""
    batch, before = result["batch"], result["repartition"] and result["repartition"][0]
    then = f"the new query starts at batch {result['first']}"
    if before:
        then = (
            f"then Spark's repartition writes batch {batch + 1}, the state in "
            f"{query.shuffle_partitions} partitions (it has {before}), and {then}"
        )
    tail = plan_tail(
        irreversible=f"nothing: {cp.root} is only read",
        backup="none: nothing that exists changes",
        undo=f"remove {new}",
    )
    return "\n".join(
        [
            plan_head(dry_run, f"transplant of {cp.root} at batch {batch} -> {new}"),
            f"  {result['files']} files ({format_bytes(result['bytes'])}); {then} on "
            f"{query.inputs_text} ({_anew(cp, batch, fresh)})",
            *tail,
        ]
    )


def _build_transplant(
    cp: Checkpoint,
    new: Path | S3Path,
    files: list[str],
    entries: dict[str, str],
    log: Callable[[str], None],
) -> tuple[str, list]:
    """Copy ``files`` and write the new query id and the log ``entries`` in a staging folder
    beside ``new``, then rename it into place; returns the new query id and the staging
    folders of killed runs it removed."""
    with Staging(new, STAGING) as staging:
        for folder in staging.removed:
            log(f"removed {folder}: the staging folder of a killed transplant")
        for rel in files:
            copied = staging.path / rel
            copied.parent.mkdir(parents=True, exist_ok=True)
            copy_to_local(cp.root / rel, copied)
            faults.point("copy")
        query_id = str(uuid.uuid4())
        _write(staging.path, "metadata", json.dumps({"id": query_id}, separators=(",", ":")))
        for rel, data in entries.items():
            _write(staging.path, rel, data)
        relocate_checkpoint(staging.path, location=new)
        if isinstance(new, S3Path):
            publish(staging.path, new)
        else:
            if new.exists():
                new.rmdir()
            os.replace(staging.path, new)
    faults.point("renamed")
    return query_id, staging.removed


def _anew(cp: Checkpoint, batch: int, fresh: dict[int, str]) -> str:
    kept = len(cp.offsets[batch].source_offsets) - len(fresh)
    return f"{len(fresh)} source{'s' * (len(fresh) != 1)} read anew, {kept} kept"


def _state_files(cp: Checkpoint, batch: int, fresh: dict[int, str]) -> list[str]:
    """What a transplant copies: the restart set of ``batch`` but its offsets, commits and
    query id, and the logs of the sources read anew."""
    anew = tuple(f"sources/{i}/" for i in fresh)
    return [
        rel
        for rel in cp.restart_files(batch)
        if not rel.startswith(("offsets/", "commits/", *anew))
        and rel not in ("metadata", crc_sidecar("metadata"))
    ]


def _log_entries(cp: Checkpoint, batch: int, fresh: dict[int, str]) -> dict[str, str]:
    """The offsets (fresh sources' offsets replaced by their starts) and commits of batches
    ``batch - 1`` and ``batch``, and a fresh Kafka source's initial offsets."""
    entries = {}
    for b in (batch - 1, batch):
        if b in cp.offsets:
            entries[f"offsets/{b}"] = _offsets_for(cp, b, fresh)
        if b in cp.commits:
            entries[f"commits/{b}"] = (cp.root / f"commits/{b}").read_text("utf-8")
    for i, entry in fresh.items():
        kind = kind_at(json.loads(entry))
        initial = kind.initial_log(entry) if kind is not None else None
        if initial is not None:  # Spark reads startingOffsets only where this is absent
            entries[f"sources/{i}/0"] = initial
    return entries


def _transplanted(
    cp: Checkpoint, batch: int | None, new: Path | S3Path, fresh: dict[int, str]
) -> str | None:
    """The query id of ``new`` when it holds exactly what a transplant of ``cp`` at ``batch``
    with sources ``fresh`` read anew writes (any query id but the old one), else None."""
    if batch not in cp.commits or batch not in cp.offsets:
        return None
    try:
        # Copied files as they are; what the transplant writes or rewrites, with its sidecar.
        expected: dict[str, bytes | Path] = {
            rel: cp.root / rel for rel in _state_files(cp, batch, fresh)
        }
        written: dict[str, bytes] = {}
        for op in cp.operators:  # operator metadata v2 names its schema files under ``new``
            for key, rel in op.metadata_files.items():
                if key is not None and rel in expected:
                    text = (cp.root / rel).read_text(encoding="utf-8")
                    written[rel] = relocated_metadata(text, op.operator_id, new)
                    if crc_sidecar(rel) in expected:
                        written[crc_sidecar(rel)] = hadoop_crc(written[rel])
        for rel, text in _log_entries(cp, batch, fresh).items():
            written[rel] = text.encode("utf-8")
            written[crc_sidecar(rel)] = hadoop_crc(written[rel])
        expected.update(written)
        metadata = (new / "metadata").read_bytes()
        query_id = json.loads(metadata)["id"]
        present = set(list_files(new))
        if (
            not isinstance(query_id, str)
            or query_id == cp.query_id
            or present != set(expected) | {"metadata", crc_sidecar("metadata")}
            or (new / crc_sidecar("metadata")).read_bytes() != hadoop_crc(metadata)
        ):
            return None
        for rel, want in expected.items():
            path = new / rel
            if isinstance(want, bytes):
                if path.read_bytes() != want:
                    return None
            elif not _same_content(path, want):
                return None
    except (OSError, ValueError, KeyError, TypeError, StateOpsError):
        return None
    return query_id


def _same_content(a: Path | S3Path, b: Path | S3Path) -> bool:
    if isinstance(a, Path) and isinstance(b, Path):
        return filecmp.cmp(a, b, shallow=False)
    return a.read_bytes() == b.read_bytes()


def _offsets_for(cp: Checkpoint, batch: int, fresh: dict[int, str]) -> str:
    """``offsets/<batch>`` with its batch metadata kept and the offsets of the sources read
    anew replaced by a starting offset."""
    header, meta, *lines = (cp.root / f"offsets/{batch}").read_text("utf-8").split("\n")
    sources = [line for line in lines if line.strip()]
    sources = [fresh.get(i, line) for i, line in enumerate(sources)]
    return "\n".join([header, meta, *sources])


def _write(root: Path, rel: str, text: str) -> None:
    """A checkpoint file and the ``.crc`` sidecar Hadoop's local file system checks."""
    data = text.encode("utf-8")
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    (root / crc_sidecar(rel)).write_bytes(hadoop_crc(data))
