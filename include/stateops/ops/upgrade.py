"""Code upgrade: a query's new code checked against its checkpoint's state before any restart,
and the state rewritten into a new checkpoint where Spark cannot evolve it.

Spark compares a restarted query's state schemas with its checkpoint's only when it plans the
first batch, and fails there on a change it cannot evolve. :func:`check_code_change` says it
before: per operator, state variable and key, one :class:`Change` each, **unchanged**,
**Spark evolves it** (the rule and the setting it needs) or **needs a state rewrite** (why
Spark would refuse it); ``stateops run`` refuses the last (:func:`refuse_incompatible_code`).
The verdicts follow what Spark 4.2 did on checkpoints it wrote (tests/spark/test_upgrade.py
restarts Spark on each change and asserts the check agrees).

The rewrite (:func:`run_upgrade`) goes the migration's way, with the query's own sources: stop,
back up, export the state at the last committed batch, apply the registry's
``initial_state.mapping`` (or ``from_export``) to it and bootstrap a new checkpoint with the
new code (batch 0 is an image of the old last batch: its watermark and its source positions,
:mod:`stateops.ops.carry`), prove the new state against the mapping run through the new
processor's ``handleInitialState``, validate it, switch. Any failure rolls back
(:func:`stateops.ops.migration.roll_back_migration`): the old checkpoint, untouched, runs the
old code as before.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from stateops.control.lock import refuse_unholdable
from stateops.control.target import Target
from stateops.core.checkpoint import Checkpoint, load_checkpoint
from stateops.core.errors import OperationFailed, StateOpsError, one_line
from stateops.core.plans import BackupFirst, plan_head, plan_tail
from stateops.core.registry import Query
from stateops.core.staging import has_entries
from stateops.core.steps import UPGRADE_STEPS
from stateops.ops import migration
from stateops.ops.state_schema import (
    KINDS,
    OPERATOR,
    TIME_MODES,
    declared_state,
    grouping_key,
    operator_state,
    show,
    split_key,
    user_variables,
)

__all__ = [
    "EVOLVES",
    "REWRITE",
    "UNCHANGED",
    "Change",
    "backup_for_upgrade",
    "blocking",
    "check_code_change",
    "first_of",
    "format_upgrade_plan",
    "format_upgraded",
    "job_fields",
    "kept_by_mapping",
    "losses",
    "plan_command",
    "plan_upgrade",
    "refuse_incompatible_code",
    "refuse_what_a_run_refuses",
    "rewrites",
    "run_upgrade",
]

OPERATION = "upgrade"
UNCHANGED, EVOLVES, REWRITE = "unchanged", "Spark evolves it", "needs a state rewrite"
ENCODING = "spark.sql.streaming.stateStore.encodingFormat"
# What a change that drops state adds to its line (a rewrite keeps what the mapping maps).
LOST = "; a rewrite through initial_state.mapping keeps it"
# Type widenings Spark's Avro schema evolution accepts: Avro's own promotions (int to long
# restarted by tests/spark/test_upgrade.py).
_WIDENINGS = {
    ("integer", "long"),
    ("integer", "float"),
    ("integer", "double"),
    ("long", "float"),
    ("long", "double"),
    ("float", "double"),
}


@dataclass(frozen=True)
class Change:
    """One part of the state (``what``: the operator, a state variable, the key) and what a
    restart of the new code on the checkpoint does to it."""

    what: str
    verdict: str
    detail: str
    drops: bool = False  # Spark accepts it by dropping state (the detail ends with LOST)

    def line(self) -> str:
        return f"{self.what}: {self.verdict} ({self.detail})"


def check_code_change(cp: Checkpoint, query: Query, batch: int | None = None) -> list[Change]:
    """How ``query`` (the code as deployed now) fits ``cp``'s state at ``batch`` (default: its
    last committed batch): one :class:`Change` per operator, state variable and key; empty
    where there is no state yet."""
    batch = cp.last_committed_batch if batch is None else batch
    if batch is None or not cp.operators:
        return []
    old = [op.operator_name for op in cp.operators]
    tws = len(old) == 1 and old[0].startswith("transformWithState")
    if query.processor is None:
        if tws:
            return [
                Change(
                    "operator 0",
                    REWRITE,
                    f"the checkpoint holds a {old[0]} state, the new code is a transform: "
                    "Spark refuses a changed stateful operator",
                )
            ]
        return [
            Change(
                "operators",
                "checked by Spark",
                f"{', '.join(old)}: a transform's built-in operators are planned by Spark, "
                "which checks their state schemas when the query starts",
            )
        ]
    if not tws or old[0] != OPERATOR:
        return [
            Change(
                "operator 0",
                REWRITE,
                f"the checkpoint holds {' and '.join(old)} state, the new code a "
                "transformWithStateInPandas processor: Spark refuses a changed stateful operator",
            )
        ]
    props, families = operator_state(cp, batch)
    avro = cp.offsets[batch].conf.get(ENCODING) == "avro"
    return _processor_changes(query, props, families, declared_state(query), avro)


def _processor_changes(
    query: Query,
    props: dict[str, Any],
    families: dict[str, Any],
    declared: dict[str, dict[str, Any]],
    avro: bool,
) -> list[Change]:
    assert query.processor is not None
    changes = []
    modes = [
        ("time mode", props.get("timeMode"), TIME_MODES[query.processor.time_mode]),
        ("output mode", props.get("outputMode"), query.processor.output_mode),
    ]
    for what, was, now in modes:
        if was != now:
            changes.append(Change(what, REWRITE, f"{was} in the checkpoint, {now} in the new code"))
    old = user_variables(props)
    key = grouping_key(query)
    # The key matters for the variables that stay: one that is added starts empty.
    keys = [split_key(families[n]["key"])[0] for n in old if n in families and n in declared]
    if keys:
        changes.append(_key_change(keys[0], key))
    for name in sorted(set(old) | set(declared)):
        change = _variable_change(name, old.get(name), declared.get(name), families, avro)
        changes.append(_map_key_change(name, key, declared.get(name), families) or change)
    return changes


def _key_change(old_key: list[tuple[str, str]], key: list[tuple[str, str]]) -> Change:
    """The grouping key (``old_key``: that of a variable the new code keeps)."""
    if old_key == key:
        return Change("key", UNCHANGED, show(key))
    if [t for _, t in old_key] == [t for _, t in key]:
        return Change("key", UNCHANGED, f"{show(old_key)} renamed {show(key)}: same types")
    return Change(
        "key",
        REWRITE,
        f"{show(old_key)} in the checkpoint, {show(key)} in the new code: Spark keeps state "
        "by its key's schema and never changes it",
    )


def _variable_change(
    name: str,
    was: dict[str, Any] | None,
    now: dict[str, Any] | None,
    families: dict[str, Any],
    avro: bool,
) -> Change:
    what = f"state {name!r}"
    if was is None:
        assert now is not None
        return Change(what, EVOLVES, "added: Spark starts it empty")
    if now is None:
        return Change(what, EVOLVES, f"removed: Spark drops its state{LOST}", drops=True)
    kind = KINDS[now["kind"]]
    if was["stateVariableType"] != kind:
        return Change(
            what,
            REWRITE,
            f"{was['stateVariableType']} in the checkpoint, {kind} in the new code: Spark "
            "refuses a variable of another kind under the same name",
        )
    if bool(was.get("ttlEnabled")) != now["ttl"]:
        return Change(
            what,
            REWRITE,
            f"TTL {'on' if was.get('ttlEnabled') else 'off'} in the checkpoint, "
            f"{'on' if now['ttl'] else 'off'} in the new code: Spark refuses it",
        )
    family = families.get(name)
    if family is None:
        return Change(what, REWRITE, "the checkpoint has no schema for it")
    old_value, new_value = family["value"], now["value"]
    if old_value == new_value:
        return Change(what, UNCHANGED, show(new_value))
    shown = f"{show(old_value)} in the checkpoint, {show(new_value)} in the new code"
    if [t for _, t in old_value] == [t for _, t in new_value] and not avro:
        return Change(what, UNCHANGED, f"{shown}: fields renamed, the same types in order")
    if avro:
        refused = _avro_refusal(old_value, new_value)
        if refused is not None:
            return Change(what, REWRITE, f"{shown}: {refused}")
        # Avro matches fields by name: a new (or renamed) field reads null for every key the
        # state holds, and a field the new code no longer has is dropped with its values.
        added = [n for n, _ in new_value if n not in dict(old_value)]
        dropped = [n for n, _ in old_value if n not in dict(new_value)]
        detail = f"{shown}: Avro schema evolution ({ENCODING}=avro)"
        if added:
            detail += f"; {', '.join(added)} read null for the keys it holds"
        if dropped:
            detail += f"; Spark drops {', '.join(dropped)}{LOST}"
        return Change(what, EVOLVES, detail, drops=bool(dropped))
    return Change(
        what,
        REWRITE,
        f"{shown}: Spark evolves a value schema only with {ENCODING}=avro, which this "
        "checkpoint was not written with",
    )


def _map_key_change(
    name: str, key: list[tuple[str, str]], now: dict[str, Any] | None, families: dict[str, Any]
) -> Change | None:
    """A map state whose user key's types changed (Spark refuses it with either encoding)."""
    family = families.get(name)
    if now is None or now["user_key"] is None or family is None:
        return None
    was = split_key(family["key"])[1] or family["key"][len(key) :]
    if [t for _, t in was] == [t for _, t in now["user_key"]]:
        return None
    return Change(
        f"state {name!r}",
        REWRITE,
        f"its map key is {show(was)} in the checkpoint, {show(now['user_key'])} in the new "
        "code: Spark never changes a key's schema",
    )


def _avro_refusal(old: list[tuple[str, str]], new: list[tuple[str, str]]) -> str | None:
    """Why Avro schema evolution refuses ``old`` -> ``new`` (None: it evolves it): fields are
    matched by name; added and removed fields, reordering and widening are allowed."""
    before = dict(old)
    for field, kind in new:
        was = before.get(field)
        if was is not None and was != kind and (was, kind) not in _WIDENINGS:
            return f"field {field!r} changes from {was} to {kind}, which Avro cannot widen"
    return None


def rewrites(changes: list[Change]) -> list[Change]:
    """The changes Spark refuses: the state must be rewritten."""
    return [c for c in changes if c.verdict == REWRITE]


def losses(changes: list[Change]) -> list[Change]:
    """The changes Spark accepts by dropping state (a removed variable)."""
    return [c for c in changes if c.drops]


def kept_by_mapping(query: Query, changes: list[Change]) -> list[Change]:
    """The state Spark would drop that the registry's ``initial_state.mapping`` keeps: a
    rewrite is then what the registry asks for, though Spark would start the new code."""
    spec = query.initial_state
    return losses(changes) if spec is not None and spec.mapping is not None else []


def blocking(query: Query, changes: list[Change]) -> list[Change]:
    """What a plain restart of ``query``'s code must not do: a change Spark refuses, or state
    Spark would drop that the registry's mapping keeps. ``stateops run`` refuses them; the
    upgrade rewrites the state."""
    return rewrites(changes) + kept_by_mapping(query, changes)


def first_of(changes: list[Change]) -> str:
    """The first of ``changes`` in one line, and how many more there are."""
    more = f" (and {len(changes) - 1} more)" if len(changes) > 1 else ""
    return f"{changes[0].line()}{more}"


def plan_command(name: str) -> str:
    """The command that plans ``name``'s code upgrade (shown wherever a change is found)."""
    return f"`stateops upgrade {name} --dry-run`"


def refuse_what_a_run_refuses(query: Query) -> None:
    """What a run refuses of ``query`` itself before Spark, whatever its checkpoint's batches:
    its code that does not load, a topic that does not exist or a broker that does not answer,
    code that does not fit its state. A plan that changes the checkpoint for a run to follow
    (a backfill's) refuses them before its first change."""
    from stateops.core.sources import require_inputs
    from stateops.spark.streaming import check_code

    check_code(query)
    require_inputs(query)
    refuse_incompatible_code(query)


def refuse_incompatible_code(query: Query) -> None:
    """Refuse to start ``query`` on its checkpoint where its code needs a state rewrite
    (:func:`blocking`): one line naming the first such change and the command that plans the
    rewrite."""
    if not has_entries(query.checkpoint):
        return
    cp = load_checkpoint(query.checkpoint)
    try:
        needed = blocking(query, check_code_change(cp, query))
    except (StateOpsError, ValueError, KeyError, TypeError):
        return  # state metadata this check cannot read: verify names it, Spark decides
    if needed:
        raise StateOpsError(
            f"{query.name}: its code does not fit the state in {cp.root}: {first_of(needed)}; "
            f"nothing was started: plan the rewrite with {plan_command(query.name)}"
        )


def plan_upgrade(target: Target, new_checkpoint: str = "", run_id: str = "") -> dict[str, Any]:
    """Preflight of a code upgrade of ``target``'s query (its registry entry holds the new
    code): the check's changes, and, where one needs a rewrite, everything the rewrite needs,
    checked without changing anything."""
    registry = target.require_registry()
    query = target.require_query("upgrade a registered query: give its name")
    cp = migration._sound_checkpoint(query)
    changes = check_code_change(cp, query)
    spec = query.initial_state
    plan: dict[str, Any] = {
        "query": query.name,
        "run_id": run_id,
        "checkpoint": str(query.checkpoint),
        "changes": [asdict(c) for c in changes],
        # Spark refuses a change, or drops state the registry says how to keep.
        "rewrite": bool(blocking(query, changes)),
    }
    if not plan["rewrite"]:
        return plan
    if query.processor is None:
        raise StateOpsError(
            f"query {query.name}: its new code is a transform, and Spark's built-in operators "
            "take no initial state: the state cannot be rewritten into it"
        )
    if spec is None or not (spec.mapping or spec.from_export):
        raise StateOpsError(
            f"query {query.name}: set initial_state.mapping (module:function(spark, "
            "old_state, **options)) in the registry: it maps the old state to the new code's "
            "initial state"
        )
    with_ttl = sorted(n for n, v in declared_state(query).items() if v["ttl"])
    if with_ttl:  # what the rewrite's proof refuses, after the stop, backup and export
        raise StateOpsError(
            f"query {query.name}: state {', '.join(map(repr, with_ttl))} has a TTL, and the "
            "rewrite's proof cannot simulate expiry by processing time: a rewrite into state "
            "with a TTL is not supported; nothing was changed"
        )
    new = migration._new_checkpoint(registry, query, new_checkpoint)
    lock = refuse_unholdable(target.lock_file, query.name, run_id)
    work = registry.work_path(query.name, OPERATION, run_id or "plan")
    name = next(iter(query.inputs))
    source = query.inputs[name].model_dump(by_alias=True)
    return plan | {
        "operation": OPERATION,
        "source_name": name,
        "old": {
            "source": source,
            "checkpoint": str(query.checkpoint),
            "query_id": cp.query_id,
            "last_committed_batch": cp.last_committed_batch,
            "sink_batch_offset": query.sink.batch_offset,
        },
        "new": {
            "source": source,
            "start": None,
            "checkpoint": str(new),
            "registry": str(registry.run_registry_path(query.name, OPERATION, run_id or "plan")),
        },
        "export": str(work / "export"),
        "mapping": spec.mapping or "initial_state.from_export",
        "backup_to": target.backup_location(),
        "switch_file": str(registry.switch_path(query.name)),
        "switch_before": registry.switch_before(query.name, run_id),
        "cutover": "drain",
        "carry_over": {"choice": "initial_state", "road": "rewrite", "accepted": True},
        "running": None if lock is None else lock.run_id,
    }


def format_upgrade_plan(plan: dict[str, Any], dry_run: bool) -> str:
    """:func:`plan_upgrade`'s plan for a person (the CLI, the DAG's task log)."""
    lines = [plan_head(dry_run, f"code upgrade of {plan['query']} on {plan['checkpoint']}")]
    lines += [f"  {Change(**c).line()}" for c in plan["changes"]]
    if not plan["rewrite"]:
        lines.append("  no state rewrite needed: start the query with its new code")
        lines += plan_tail(
            irreversible="nothing", backup="none: nothing changes", undo="nothing to undo"
        )
        return "\n".join(lines)
    running = f" (run {plan['running']})" if plan["running"] else ""
    lines += [
        f"  stop {plan['query']}{running} after its current batch; back up its checkpoint",
        f"  export its state at batch {plan['old']['last_committed_batch']} to {plan['export']}",
        f"  map it with {plan['mapping']} and bootstrap {plan['new']['checkpoint']} with the "
        "new code, going on from the old checkpoint's watermark and source positions",
        "  prove the new state against the mapping, validate it, switch the query to it",
    ]
    lines += plan_tail(
        irreversible=f"nothing: {plan['old']['checkpoint']} is kept (retired)",
        backup=plan["backup_to"],
        undo=migration.undo_recipe(plan),
    )
    return "\n".join(lines)


def format_upgraded(plan: dict[str, Any]) -> str:
    """What an upgrade that switched did, and how to undo it (its last step)."""
    return (
        f"{plan['query']} upgraded: it runs its new code on {plan['new']['checkpoint']}; the "
        f"old checkpoint {plan['old']['checkpoint']} stays, retired; to undo, "
        f"{migration.undo_recipe(plan)}"
    )


def backup_for_upgrade(
    target: Target, plan: dict[str, Any], backup: BackupFirst, log: Callable[[str], None] = print
) -> dict[str, Any]:
    """The backup step, once the query stopped: the old checkpoint's last batch, the new
    query's registry (the new checkpoint; its output continues the old numbering), and the
    backup (``backup``: :func:`stateops.ops.backup.backup_first`) with its id."""
    migration.prepare_migration(target, plan)
    registry = target.require_registry()
    query = migration.unmoved_query(registry, plan)
    last = load_checkpoint(query.checkpoint).last_committed_batch
    offset = query.sink.folder_batch(last) + 1
    runs_as = query.model_copy(update={"checkpoint": plan["new"]["checkpoint"]})
    migration.derive_registry(registry, plan, runs_as, offset)
    log(
        f"{query.name}: stopped at batch {last}; the new checkpoint's output starts at "
        f"batch_id={offset}"
    )
    return {
        "last_committed_batch": last,
        "sink_batch_offset": offset,
        "road": "rewrite",
        "output_from": offset,
        "backup_id": backup(),
    }


def job_fields(plan: dict[str, Any], settled: dict[str, Any] | None = None) -> dict[str, str]:
    """This run's values of the fields of :data:`stateops.core.steps.UPGRADE_STEPS`
    (``settled``: the backup step's result, once it ran)."""
    return {
        "query": plan["query"],
        "run_id": plan["run_id"],
        "old_checkpoint": plan["old"]["checkpoint"],
        "export": plan["export"],
        "last_committed_batch": str((settled or {}).get("last_committed_batch", "")),
        "accept": "yes",  # the changes the rewrite makes are the upgrade itself
    }


def run_upgrade(
    target: Target,
    plan: dict[str, Any],
    *,
    backup: BackupFirst,
    run_job: Callable[[str, str, list[str]], None],
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Every step of the rewrite after its preflight (``plan``), in one process, with the
    migration's step functions and Spark jobs; a failure rolls the run back and raises,
    naming the step. Returns the lineage the switch recorded."""
    if not plan["rewrite"]:
        raise StateOpsError(f"{plan['query']}: no state rewrite needed; start it")
    steps = migration.Steps(UPGRADE_STEPS, target, plan, run_job, job_fields(plan))
    run, spark = steps.run, steps.spark
    migration.prepare_migration(target, plan)
    try:
        run("stop_query", lambda: migration.stop_running_query(target, plan["run_id"], log))
        settled = run("backup", lambda: backup_for_upgrade(target, plan, backup, log))
        steps.fields = job_fields(plan, settled)
        # The rewrite's job runs the image batch 0 and the new code's first batches on input
        # the old query had not read (none where it was stopped caught up), and proves them.
        for name in ("export", "rewrite"):
            run(name, lambda name=name: spark(name))
        carried = run("prove", lambda: migration.prove_migration(target, plan, log))
        run("validate_new_state", lambda: spark("validate_new_state"))
        lineage = run("switch", lambda: migration.switch_query(target, plan, settled, carried))
    except Exception as err:
        log(f"{plan['query']}: {steps.step} failed: {one_line(err)}")
        migration.roll_back_migration(target, plan, log)
        raise OperationFailed(
            f"the code upgrade of {plan['query']} failed at {steps.step} ({one_line(err)}); "
            f"it was rolled back and {plan['old']['checkpoint']} is as it was: fix the cause, "
            "then upgrade again (the old code runs on it meanwhile)"
        ) from err
    log(f"{format_upgraded(plan)} (backup {settled['backup_id']})")
    return lineage
