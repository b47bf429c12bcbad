"""Bootstrap: start a registered query on a new checkpoint with an initial state.

Spark applies ``initialState`` only to the first batch of a new checkpoint and ignores it,
silently, once a batch has committed; and an available-now start on an empty source commits
nothing. So a bootstrap is *pending* until batch 0 commits: a marker beside the checkpoint
(``<checkpoint>.audit/carry_over.json``, so a start on any host sees it) names the initial
state, and every start of the query passes it again until then. The
same marker names a transplanted checkpoint (:mod:`stateops.ops.transplant`) until its first batch
commits, so that batch's state is proven against the old checkpoint's.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from stateops.control.markers import write_carry_over
from stateops.control.target import Target, query_target
from stateops.core.checkpoint import load_checkpoint
from stateops.core.errors import CheckpointError, RegistryError, StateOpsError
from stateops.core.plans import plan_head, plan_tail
from stateops.core.registry import Query, Registry
from stateops.core.staging import has_entries
from stateops.core.steps import INITIAL_STATE_FORMATS
from stateops.core.storage import S3Path, location
from stateops.ops.pending import mark_transplant, refuse_pending_rollback
from stateops.ops.transplant import (
    carry_differences,
    choose_road,
    fresh_sources,
    refuse_differences,
    transplant_checkpoint,
    transplant_refusals,
)
from stateops.spark.export import MANIFEST, read_manifest
from stateops.spark.initial_state import (
    check_initial_types,
    read_raw_initial_state,
    typed_initial_state,
    validate_initial_state,
)

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

__all__ = [
    "FORMATS",
    "check_processor_fit",
    "format_bootstrap_plan",
    "initial_state_differences",
    "plan_bootstrap",
    "preflight_bootstrap",
    "prepare_bootstrap",
    "run_bootstrap",
]

FORMATS = INITIAL_STATE_FORMATS
# What a bootstrap acts on: a registered query (its entry says how it takes an initial state).
WHICH_QUERY = "bootstrap a registered query (--query NAME)"


def plan_bootstrap(
    target: Target,
    initial_state: str,
    fmt: str | None,
    carry_over: str = "auto",
    accept_differences: bool = False,
) -> dict[str, Any]:
    """What a bootstrap of ``target``'s query from ``initial_state`` would do, checked without
    Spark; refuses a used checkpoint.

    From another checkpoint, the state takes a road (``carry_over``, see
    :func:`stateops.ops.transplant.choose_road`): a transplant of its state files where the query
    can read them as its own, else an export of it as the initial state. Where that road
    would not give what the old query computes (:func:`initial_state_differences`), it is
    refused unless ``accept_differences``. A transform (Spark's built-in operators take no
    initial state) bootstraps from a checkpoint of the same query shape, by transplant only.
    """
    registry, query = target.require_registry(), target.require_query(WHICH_QUERY)
    if query.transform is None and query.initial_state is None:
        raise RegistryError(
            f"query {query.name}: no initial_state in the registry, so its processor takes none"
        )
    path = location(query.checkpoint)
    planned = _batch_0_planned(path)
    src = location(initial_state)  # a checkpoint to carry over may be in S3
    fmt = _initial_format(src, fmt)
    road, note = _road(query, src, fmt, carry_over)
    differences = _differences(query, src, fmt, road)
    refuse_differences(
        query.name,
        differences,
        accept_differences,
        "run it again with --accept-differences (the DAG: accept_differences on)",
    )
    work = registry.work_path(query.name, "bootstrap", uuid.uuid4().hex[:8])
    return {
        "query": query.name,
        "checkpoint": str(path),
        "initial_state": str(src.resolve()),
        "format": fmt,
        "schema": query.initial_state and query.initial_state.schema_,
        "batch_0_already_planned": planned,
        "source": query.inputs_text,
        "road": road,
        "road_note": note,
        "differences": differences,
        "export": str(work / "export"),
    }


def _batch_0_planned(path: Path | S3Path) -> bool:
    """Whether batch 0 of the new checkpoint ``path`` is planned (a start that failed before it
    committed); refuses a checkpoint with a committed batch."""
    if not has_entries(path):
        return False
    cp = load_checkpoint(path)
    if cp.last_committed_batch is not None:
        raise CheckpointError(
            f"{path} has committed batch {cp.last_committed_batch}: Spark would ignore the "
            "initial state; bootstrap into a new checkpoint (set the query's checkpoint)"
        )
    return bool(cp.offsets)


def _road(
    query: Query, src: Path | S3Path, fmt: str, carry_over: str
) -> tuple[str | None, str | None]:
    """The road from a checkpoint (None from an export or data files) and why ``auto`` fell
    back to the initialState road (else None); refuses what cannot seed the query."""
    transform = query.transform is not None
    if transform and fmt != "checkpoint":
        raise StateOpsError(
            f"query {query.name} is a transform: Spark's built-in operators take no initial "
            f"state, so {src} ({fmt}) cannot seed it; bootstrap it from a checkpoint of the same "
            "query shape (its state files are transplanted)"
        )
    road, said = None, []
    if fmt == "checkpoint":
        cp = load_checkpoint(src)
        if cp.last_committed_batch is None:
            raise CheckpointError(
                f"{src}: no committed batch yet: there is no state to carry over; run that "
                "query first, or bootstrap from another state"
            )
        reasons = transplant_refusals(cp, query)
        road = choose_road(carry_over, reasons, log=said.append, transform=transform)
    spec = query.initial_state
    if (fmt == "export" or road == "initial_state") and not (spec.from_export or spec.mapping):
        raise RegistryError(
            f"query {query.name}: neither initial_state.from_export nor initial_state.mapping "
            "is set in the registry"
        )
    return road, said[0] if said else None


def _differences(query: Query, src: Path | S3Path, fmt: str, road: str | None) -> list[str]:
    """What the initialState road would change in what the query computes (empty: nothing,
    or the transplant road)."""
    if fmt == "export":
        _check_export(src, query)
        return initial_state_differences(src, query)
    if road == "initial_state":
        return carry_differences(load_checkpoint(src), query)
    return []


def format_bootstrap_plan(plan: dict[str, Any], dry_run: bool) -> str:
    """:func:`plan_bootstrap`'s plan for a person (the CLI, the task log)."""
    lines = [plan_head(dry_run, f"bootstrap of {plan['query']} into {plan['checkpoint']}")]
    if plan["road"] == "transplant":
        lines += [
            f"  transplant the state files of {plan['initial_state']}, then start "
            f"{plan['query']} on {plan['source']}",
            "  and prove its first batch against that state",
        ]
    else:
        if plan["road_note"]:
            lines.append(f"  ({plan['road_note']})")
        lines += [
            f"  read the initial state {plan['initial_state']} ({plan['format']})",
            f"  validate it against {plan['schema']} (null keys, repeated keys)",
            f"  start {plan['query']} on {plan['source']}",
            "  and be complete once batch 0 commits (every start passes it until then)",
        ]
    lines += [f"  ACCEPTED, it changes what the query computes: {d}" for d in plan["differences"]]
    lines += plan_tail(
        irreversible=f"nothing: {plan['initial_state']} is only read",
        backup="none: nothing that exists changes (the checkpoint is new)",
        undo=f"stop {plan['query']}, then remove {plan['checkpoint']} and its .audit folder "
        "and the output it wrote",
    )
    return "\n".join(lines)


def _initial_format(src: Path | S3Path, fmt: str | None) -> str:
    """The initial state's format: ``fmt``, else what the folder is (a state export, a
    checkpoint, else data files named by their suffix, Parquet by default)."""
    if not src.exists():
        raise StateOpsError(f"{src}: no such initial state (a state export, or data files)")
    if fmt is None:
        checkpoint = (src / "metadata").exists() and (src / "offsets").is_dir()
        fmt = "export" if (src / MANIFEST).exists() else "checkpoint" if checkpoint else None
        fmt = fmt or Path(src.name).suffix.lstrip(".") or "parquet"
    if fmt not in FORMATS:
        raise StateOpsError(f"{src}: unknown initial state format {fmt!r} ({', '.join(FORMATS)})")
    return fmt


def _check_export(source: Path | S3Path, query: Query) -> None:
    """What Spark would refuse later, checked before it starts: a readable manifest that
    lists the variable ``initial_state.from_export`` reads, and that variable's folder."""
    assert query.initial_state is not None
    manifest_path = source / MANIFEST
    try:
        manifest = read_manifest(source)
        entries = manifest["entries"]
        variables = {e["variable"]: e["path"] for e in entries}
    except FileNotFoundError:
        raise StateOpsError(
            f"{source}: no {MANIFEST}, so not a state export (an incomplete one?); export "
            "again with `stateops export`, or give --format"
        ) from None
    except (ValueError, KeyError, TypeError):
        raise StateOpsError(
            f"{manifest_path}: not a state export manifest; export again with `stateops export`"
        ) from None
    if query.initial_state.mapping:
        return  # the mapping reads what it needs (its failure is refused in one line)
    variable = query.initial_state.from_export.get("variable")
    if variable not in variables:
        raise StateOpsError(
            f"{source}: the export has no state variable {variable!r} (it has "
            f"{', '.join(map(str, variables)) or 'none'}); export the query whose state this is"
        )
    if not isinstance(variables[variable], str) or not (source / variables[variable]).is_dir():
        raise StateOpsError(
            f"{source}: the folder of state variable {variable!r} is missing; export again"
        )


def initial_state_differences(export: str | Path | S3Path, query: Query) -> list[str]:
    """Why bootstrapping ``query`` from state export ``export`` would not go on as the
    exported query would have (empty: it would): an export that does not record its list
    order or watermarks (made by an older version), and the differences between the
    exported checkpoint's state and the processor's, while that checkpoint is readable."""
    manifest = read_manifest(export)
    reasons = []
    if "watermark" not in manifest:
        reasons.append(
            f"{export} records no watermark: late input and timers after the carry-over "
            "would not follow the old query's; export it again"
        )
    lists = [
        e["variable"]
        for e in manifest["entries"]
        if e.get("kind") == "list" and "position" not in e
    ]
    if lists:
        reasons.append(
            f"{export} records no order for list state {', '.join(map(repr, lists))}: its "
            "elements would be carried in another order; export it again"
        )
    try:
        old = load_checkpoint(manifest["checkpoint"])
        old.restart_files(int(manifest["batch_id"]))
    except (StateOpsError, OSError, KeyError, TypeError, ValueError):
        return reasons  # gone or moved on: the proof compares with the export's own data
    return reasons + carry_differences(old, query, int(manifest["batch_id"]))


def check_processor_fit(
    spark: SparkSession, query: Query, df: DataFrame, sample_keys: int = 1000
) -> int:
    """Run the processor's ``handleInitialState`` on the initial state of some keys, in memory,
    and check that what it stores fits the state schemas it declares. Returns keys checked."""
    from stateops.spark.proof import simulate_query

    keys = query.key_columns
    sample = df.join(df.select(*keys).distinct().limit(sample_keys), keys).toPandas()
    try:
        state = simulate_query(query, None, sample)
    except StateOpsError as err:
        raise StateOpsError(f"initial state refused: {err}") from err
    except Exception as err:  # the user's processor: any failure is a misfit, named
        raise StateOpsError(
            f"initial state refused: {query.processor.class_}.handleInitialState "
            f"fails on it: {type(err).__name__}: {err}"
        ) from err
    for name, variable in state.variables.items():
        rows = variable.rows()
        for column, schema in variable.declared().items():
            try:
                spark.createDataFrame([r[column] for r in rows], schema=schema, verifySchema=True)
            except (TypeError, ValueError) as err:
                raise StateOpsError(
                    f"initial state refused: it does not fit the processor's state {name!r} "
                    f"({schema}): {str(err).splitlines()[0]}"
                ) from err
    return int(sample[keys].drop_duplicates().shape[0]) if len(sample) else 0


def prepare_bootstrap(
    spark: SparkSession, registry: Registry, plan: dict[str, Any]
) -> dict[str, Any]:
    """Validate the initial state (types, keys, fit with the processor's state), then mark the
    bootstrap pending (until batch 0 commits). A checkpoint is exported first."""
    if plan["format"] == "checkpoint":
        from stateops.spark.export import export_state

        export_state(spark, plan["initial_state"], plan["export"])
        plan = plan | {"initial_state": plan["export"], "format": "export"}
    query = registry.query(plan["query"])
    raw = read_raw_initial_state(spark, query, plan["initial_state"], plan["format"])
    check_initial_types(raw, query)
    df = typed_initial_state(raw, query)
    rows = validate_initial_state(df, query)
    fit_keys = check_processor_fit(spark, query, df)
    record = {k: plan[k] for k in ("initial_state", "format", "checkpoint")} | {"rows": rows}
    marker = {"road": "initial_state", **record}
    if plan["format"] == "export":
        manifest = read_manifest(plan["initial_state"])
        if "watermark" in manifest:  # the new checkpoint continues from the exported batch
            marker["origin"] = {
                "checkpoint": manifest["checkpoint"],
                "batch": manifest["batch_id"],
                "export": plan["initial_state"],
                "watermark": manifest["watermark"],
                "positions": _same_sources(manifest, query),
            }
    if plan.get("differences"):
        marker["differences"] = plan["differences"]  # accepted by the operator
    write_carry_over(query.checkpoint, marker)
    return record | {"processor_fit_keys": fit_keys}


def _same_sources(manifest: dict[str, Any], query: Query) -> bool:
    """Whether ``query`` reads every source of the exported checkpoint where it read it (a
    code upgrade): it then goes on from the exported batch's positions, not from the start of
    its sources (:func:`stateops.ops.carry.finish_image_batch`)."""
    try:
        old = load_checkpoint(manifest["checkpoint"])
        fresh, reasons = fresh_sources(old, query, int(manifest["batch_id"]))
    except (StateOpsError, OSError, KeyError, TypeError, ValueError):
        return False
    return not fresh and not reasons


def preflight_bootstrap(
    registry_file: str | None,
    name: str,
    initial_state: str,
    fmt: str | None,
    carry_over: str = "auto",
    accept_differences: bool = False,
) -> tuple[Target, dict[str, Any]]:
    """Registered query ``name`` and its bootstrap's plan: every refusal that needs no Spark
    (``bootstrap_state.py`` runs it, and the CLI and the Airflow operator before
    spark-submit): the query, a used checkpoint, the initial state's path, format and
    manifest, the road, a pending rollback."""
    target = query_target(registry_file, name)
    plan = plan_bootstrap(target, initial_state, fmt, carry_over, accept_differences)
    refuse_pending_rollback(plan["checkpoint"])
    return target, plan


def _told_start(query: Query) -> str | None:
    """Where the transplant starts an input read anew that must be told where (a topic):
    where Spark would start it on a new checkpoint, by its registered options (a topic's
    ``startingOffsets``), as the entry written into the checkpoint (Spark reads those options
    only without one: :meth:`SourceKind.start_of`). None: no such input."""
    told = [s for s in query.inputs.values() if s.kind.positioned]
    if len(told) != 1:
        return None
    return told[0].kind.start_of(told[0], query.name)


def run_bootstrap(
    target: Target, plan: dict[str, Any], *, run_id: str, log: Callable[[str], None] = print
) -> dict[str, Any]:
    """Carry :func:`plan_bootstrap`'s state into ``target``'s new checkpoint and start the
    query (:func:`stateops.ops.start.run_start`); returns its run summary. The
    transplant road copies the state files under the query's lock (the start proves the first
    batch); the initialState road validates the state and marks the bootstrap pending
    (:func:`prepare_bootstrap`, under the start's lock, before the query starts)."""
    from stateops.ops.start import run_start

    registry, query = target.require_registry(), target.require_query(WHICH_QUERY)
    if plan["road_note"]:
        log(plan["road_note"])
    prepare = None
    if plan["road"] == "transplant":
        with target.lock("bootstrap", run_id):
            old, new = plan["initial_state"], plan["checkpoint"]
            result = transplant_checkpoint(old, new, query, start=_told_start(query), log=log)
            mark_transplant(result)
    else:
        prepare = partial(prepare_bootstrap, registry=registry, plan=plan)
    return run_start(target, run_id=run_id, operation="bootstrap", prepare=prepare)
