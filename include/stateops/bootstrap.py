"""Bootstrap: start a registered query on a new checkpoint with an initial state.

Spark applies ``initialState`` only to the first batch of a new checkpoint and ignores it,
silently, once a batch has committed; and an available-now start on an empty source commits
nothing. So a bootstrap is *pending* until batch 0 commits: a marker in the registry's state
folder names the initial state, and every start of the query passes it again until then.
"""

from __future__ import annotations

import json
import operator
from functools import reduce
from pathlib import Path
from typing import TYPE_CHECKING, Any

from stateops.checkpoint import load_checkpoint
from stateops.errors import CheckpointError, RegistryError, StateOpsError
from stateops.export import MANIFEST
from stateops.registry import Query, Registry

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

__all__ = [
    "FORMATS",
    "pending_initial_state",
    "plan_bootstrap",
    "prepare_bootstrap",
    "read_initial_state",
    "validate_initial_state",
]

FORMATS = ("export", "parquet", "json", "csv")


def plan_bootstrap(registry: Registry, name: str, source: str, fmt: str | None) -> dict[str, Any]:
    """What a bootstrap would do, checked without Spark; refuses a used checkpoint."""
    query = registry.query(name)
    if query.initial_state is None:
        raise RegistryError(
            f"query {name}: no initial_state in the registry, so its processor takes none"
        )
    path = Path(query.checkpoint)
    planned = False
    if path.is_dir() and any(path.iterdir()):
        cp = load_checkpoint(path)
        if cp.last_committed_batch is not None:
            raise CheckpointError(
                f"{path} has committed batch {cp.last_committed_batch}: Spark would ignore the "
                "initial state; bootstrap into a new checkpoint (set the query's checkpoint)"
            )
        planned = bool(cp.offsets)
    src = Path(source)
    if not src.exists():
        raise StateOpsError(f"{source}: no such initial state (a state export, or data files)")
    fmt = fmt or ("export" if (src / MANIFEST).exists() else src.suffix.lstrip(".") or "parquet")
    if fmt not in FORMATS:
        raise StateOpsError(
            f"{source}: unknown initial state format {fmt!r} ({', '.join(FORMATS)})"
        )
    if fmt == "export" and not query.initial_state.from_export:
        raise RegistryError(f"query {name}: initial_state.from_export is not set in the registry")
    return {
        "query": name,
        "checkpoint": str(path),
        "initial_state": str(src.resolve()),
        "format": fmt,
        "schema": query.initial_state.schema_,
        "batch_0_already_planned": planned,
        "source": query.source.path,
    }


def read_initial_state(spark: SparkSession, query: Query, source: str, fmt: str) -> DataFrame:
    """The initial state as a DataFrame of ``initial_state.schema`` (columns cast to it)."""
    from pyspark.errors import AnalysisException
    from pyspark.sql import functions as F
    from pyspark.sql.types import StructType

    spec = query.initial_state
    assert spec is not None
    schema = StructType.fromDDL(spec.schema_)
    try:
        if fmt == "export":
            manifest = json.loads((Path(source) / MANIFEST).read_text(encoding="utf-8"))
            variable = spec.from_export["variable"]
            entry = next((e for e in manifest["entries"] if e["variable"] == variable), None)
            if entry is None:
                raise StateOpsError(f"{source}: the export has no state variable {variable!r}")
            df = spark.read.parquet(str(Path(source) / entry["path"]))
            df = df.select(*[F.expr(spec.from_export[f.name]).alias(f.name) for f in schema])
        else:
            reader = spark.read.format(fmt)
            if fmt == "csv":
                reader = reader.option("header", "true").schema(schema)
            df = reader.load(source)
        return df.select(*[F.col(f.name).cast(f.dataType) for f in schema])
    except AnalysisException as err:
        raise StateOpsError(
            f"{source}: does not fit initial_state.schema ({spec.schema_}): "
            f"{str(err).splitlines()[0]}"
        ) from err


def validate_initial_state(df: DataFrame, query: Query) -> int:
    """Row count of a sound initial state; refuses null keys and (if configured) repeated keys."""
    from pyspark.sql import functions as F

    keys = query.key_columns
    problems = []
    null_rows = df.filter(reduce(operator.or_, [F.col(k).isNull() for k in keys])).count()
    if null_rows:
        problems.append(f"{null_rows} rows have a null key ({', '.join(keys)})")
    if query.initial_state is not None and query.initial_state.unique_keys:
        dups = df.groupBy(*keys).count().filter("count > 1")
        n = dups.count()
        if n:
            shown = ", ".join(
                f"{'/'.join(str(r[k]) for k in keys)} ({r['count']} rows)"
                for r in dups.orderBy(F.desc("count")).limit(5).collect()
            )
            problems.append(f"{n} keys appear more than once: {shown}")
    if problems:
        raise StateOpsError(f"initial state refused: {'; '.join(problems)}; fix it and retry")
    return df.count()


def prepare_bootstrap(
    spark: SparkSession, registry: Registry, plan: dict[str, Any]
) -> dict[str, Any]:
    """Validate the initial state, then mark the bootstrap pending (until batch 0 commits)."""
    query = registry.query(plan["query"])
    df = read_initial_state(spark, query, plan["initial_state"], plan["format"])
    rows = validate_initial_state(df, query)
    marker = registry.bootstrap_marker(query.name)
    marker.parent.mkdir(parents=True, exist_ok=True)
    record = {k: plan[k] for k in ("initial_state", "format", "checkpoint")} | {"rows": rows}
    tmp = marker.with_suffix(".tmp")
    tmp.write_text(json.dumps(record, indent=2), encoding="utf-8")
    tmp.replace(marker)
    return record


def pending_initial_state(
    spark: SparkSession, registry: Registry, query: Query, last_committed: int | None
) -> DataFrame | None:
    """The initial state to pass on this start: only while a bootstrap awaits batch 0."""
    marker = registry.bootstrap_marker(query.name)
    if not marker.exists():
        return None
    record = json.loads(marker.read_text(encoding="utf-8"))
    if last_committed is not None or record.get("checkpoint") != query.checkpoint:
        marker.unlink()  # settled (or the query moved to another checkpoint)
        return None
    return read_initial_state(spark, query, record["initial_state"], record["format"])
