"""A query's initial state read with Spark: the files or the export a bootstrap names, typed
by the registry's ``initial_state.schema`` and checked (values that do not convert, null or
repeated keys) before Spark applies it with batch 0."""

from __future__ import annotations

import operator
from functools import reduce
from typing import TYPE_CHECKING, Any

from stateops.core.errors import StateOpsError
from stateops.core.registry import Query
from stateops.spark.export import read_exported, read_manifest
from stateops.spark.streaming import data_url

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

__all__ = [
    "check_initial_types",
    "exported_state",
    "read_initial_state",
    "read_raw_initial_state",
    "typed_initial_state",
    "validate_initial_state",
]


def read_raw_initial_state(spark: SparkSession, query: Query, source: str, fmt: str) -> DataFrame:
    """The initial state with ``initial_state.schema``'s column names, types as found."""
    from pyspark.errors import AnalysisException
    from pyspark.sql import functions as F

    spec = query.initial_state
    assert spec is not None
    schema = _initial_schema(query)
    try:
        if fmt == "export" and spec.mapping:
            df = _mapped(spark, query, exported_state(spark, source))
            return df.select(*[F.col(f.name) for f in schema])
        if fmt == "export":
            variable = spec.from_export["variable"]
            entries = read_manifest(source)["entries"]
            entry = next((e for e in entries if e["variable"] == variable), None)
            if entry is None:
                raise StateOpsError(f"{source}: the export has no state variable {variable!r}")
            df = read_exported(spark, source, entry)
            return df.select(*[F.expr(spec.from_export[f.name]).alias(f.name) for f in schema])
        reader = spark.read.format(fmt)
        if fmt == "csv":  # every column as text: the type check below names bad values
            reader = reader.option("header", "true")
        df = reader.load(data_url(spark, source))
        if spec.position and spec.position not in df.columns:
            df = df.withColumn(spec.position, F.lit(None))  # no recorded order: null
        return df.select(*[F.col(f.name) for f in schema])
    except AnalysisException as err:
        raise StateOpsError(
            f"{source}: does not fit initial_state.schema ({spec.schema_}): "
            f"{str(err).splitlines()[0]}"
        ) from err


def exported_state(spark: SparkSession, export: str) -> dict[str, DataFrame]:
    """A state export's variables (a built-in operator's store: ``default``) by name, each as
    the export wrote it (a list's elements with their ``list_position``); where two operators
    have a variable of the same name, both are named ``op<operator id>.<name>``."""
    entries = read_manifest(export)["entries"]
    names = [e["variable"] for e in entries]
    return {
        (
            e["variable"]
            if names.count(e["variable"]) == 1
            else f"op{e['operator_id']}.{e['variable']}"
        ): read_exported(spark, export, e)
        for e in entries
    }


def _mapped(spark: SparkSession, query: Query, old_state: dict[str, DataFrame]) -> DataFrame:
    """``initial_state.mapping`` applied to the old state; refused in one line where it fails
    or returns something else than a DataFrame with the initial state's columns."""
    from pyspark.sql import DataFrame

    from stateops.spark.streaming import load_function

    spec = query.initial_state
    assert spec is not None and spec.mapping
    mapping = load_function(query, "initial_state.mapping", spec.mapping)
    try:
        df = mapping(spark, old_state, **spec.options)
    except StateOpsError:
        raise
    except Exception as err:
        raise StateOpsError(
            f"initial_state.mapping {spec.mapping} failed: {type(err).__name__}: "
            f"{str(err).splitlines()[0] if str(err) else ''}"
        ) from err
    if not isinstance(df, DataFrame):
        raise StateOpsError(
            f"initial_state.mapping {spec.mapping} returned {type(df).__name__}, not a DataFrame"
        )
    missing = [f.name for f in _initial_schema(query) if f.name not in df.columns]
    if missing:
        raise StateOpsError(
            f"initial_state.mapping {spec.mapping} returned no column {', '.join(missing)} of "
            f"initial_state.schema ({spec.schema_})"
        )
    return df


def _initial_schema(query: Query) -> Any:
    from pyspark.sql.types import StructType

    assert query.initial_state is not None
    return StructType.fromDDL(query.initial_state.schema_)


def typed_initial_state(raw: DataFrame, query: Query) -> DataFrame:
    from pyspark.sql import functions as F

    schema = _initial_schema(query)
    return raw.select(*[F.col(f.name).try_cast(f.dataType).alias(f.name) for f in schema])


def read_initial_state(spark: SparkSession, query: Query, source: str, fmt: str) -> DataFrame:
    """The initial state as a DataFrame of ``initial_state.schema`` (columns cast to it)."""
    return typed_initial_state(read_raw_initial_state(spark, query, source, fmt), query)


def check_initial_types(raw: DataFrame, query: Query) -> None:
    """Refuse values that do not convert to ``initial_state.schema`` (they would become null)."""
    from pyspark.sql import functions as F

    schema = _initial_schema(query)
    lost = {
        f.name: F.col(f.name).isNotNull() & F.col(f.name).try_cast(f.dataType).isNull()
        for f in schema
    }
    row = raw.select(
        *[F.sum(cond.cast("long")).alias(name) for name, cond in lost.items()],
        *[
            F.first(F.when(cond, F.col(name)), ignorenulls=True).alias(f"e_{name}")
            for name, cond in lost.items()
        ],
    ).first()
    problems = [
        f"column {f.name}: {row[f.name]} values are not {f.dataType.simpleString().upper()} "
        f"(e.g. {row[f'e_{f.name}']!r})"
        for f in schema
        if row[f.name]
    ]
    if problems:
        raise StateOpsError(f"initial state refused: {'; '.join(problems)}; fix them and retry")


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
