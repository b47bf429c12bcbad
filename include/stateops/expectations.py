"""Data-level integrity: Great Expectations on the state itself (Spark-side, lazy imports).

For every state variable (or store) of the query at a committed batch: key columns non-null,
one row per key for value state, the registry's ``non_negative`` bounds, and no expired state
left behind (``expectations.expiry``). Results go to ``<checkpoint>.audit/validations/`` as
JSON and to Great Expectations Data Docs (HTML) under ``<checkpoint>.audit/gx/``.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

from stateops.audit import audit_dir
from stateops.checkpoint import load_checkpoint
from stateops.errors import CheckpointError
from stateops.export import state_reads
from stateops.registry import Query

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

__all__ = [
    "data_docs_path",
    "flatten_state",
    "format_validation",
    "leaking_keys",
    "validate_state",
]


def flatten_state(df: DataFrame) -> DataFrame:
    """Top-level columns only: struct fields become ``<struct>_<field>``, key fields keep their
    names (``key.user_id`` -> ``user_id``), so expectations can name them."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import StructType

    columns = []
    for field in df.schema.fields:
        if field.name == "partition_id":
            continue
        if isinstance(field.dataType, StructType):
            for sub in field.dataType.fields:
                alias = sub.name if field.name == "key" else f"{field.name}_{sub.name}"
                columns.append(F.col(f"`{field.name}`.`{sub.name}`").alias(alias))
        else:
            columns.append(F.col(f"`{field.name}`"))
    return df.select(*columns)


def _expired_keys(df: DataFrame, query: Query, watermark_ms: int) -> DataFrame:
    """One row per key with ``expired``: its latest time + the timeout is at the watermark."""
    from pyspark.sql import functions as F

    expiry = query.expectations.expiry
    assert expiry is not None
    timeout_ms = int(query.processor.options[expiry.timeout_option]) * 1000
    latest = F.max(F.unix_millis(F.col(expiry.time_column)))
    return df.groupBy(*query.key_columns).agg(
        ((latest + F.lit(timeout_ms)) <= F.lit(watermark_ms)).alias("expired")
    )


def validate_state(spark: SparkSession, query: Query, batch: int | None = None) -> dict[str, Any]:
    """Validate the state after committed ``batch`` (default: the last); plain-data results."""
    import great_expectations as gx
    import great_expectations.expectations as gxe
    from great_expectations.data_context.types.base import ProgressBarsConfig

    logging.getLogger("great_expectations").setLevel(logging.ERROR)
    cp = load_checkpoint(query.checkpoint)
    batch = cp.last_committed_batch if batch is None else batch
    if batch is None:
        raise CheckpointError(f"{query.checkpoint}: no committed batch yet: no state to validate")
    cp.restart_files(batch)
    watermark_ms = cp.offsets[batch].watermark_ms
    audit = audit_dir(query.checkpoint)
    ctx = gx.get_context(mode="file", project_root_dir=str(audit))
    # GX draws a progress bar per metric, which floods task logs.
    ctx.variables.progress_bars = ProgressBarsConfig(globally=False)
    source = ctx.data_sources.add_or_update_spark(name="state")
    variables = []
    for read in state_reads(spark, query.checkpoint, batch):
        variable = read["variable"]
        df = flatten_state(
            spark.read.format("statestore")
            .options(batchId=str(batch), operatorId=str(read["operator_id"]), **read["options"])
            .load(query.checkpoint)
        )
        name = f"{query.name}.op{read['operator_id']}.{variable}"
        checks: list[tuple[DataFrame, Any]] = []
        keys = [k for k in query.key_columns if k in df.columns]
        checks += [(df, gxe.ExpectColumnValuesToNotBeNull(column=k)) for k in keys]
        if read["kind"] == "value" and keys:
            unique = (
                gxe.ExpectColumnValuesToBeUnique(column=keys[0])
                if len(keys) == 1
                else gxe.ExpectCompoundColumnsToBeUnique(column_list=keys)
            )
            checks.append((df, unique))
        for path in query.expectations.non_negative:
            var, _, column = path.partition(".")
            if var == variable:
                checks.append((df, gxe.ExpectColumnValuesToBeBetween(column=column, min_value=0)))
        expiry = query.expectations.expiry
        if expiry and expiry.variable == variable:
            expired = _expired_keys(df, query, watermark_ms)
            checks.append(
                (expired, gxe.ExpectColumnValuesToBeInSet(column="expired", value_set=[False]))
            )
        variables.append(_run_checks(ctx, source, name, variable, checks))
    ctx.build_data_docs()
    docs = data_docs_path(query)
    result = {
        "query": query.name,
        "checkpoint": query.checkpoint,
        "batch_id": batch,
        "watermark_ms": watermark_ms,
        "ok": all(v["ok"] for v in variables),
        "variables": variables,
        "data_docs": str(docs),
    }
    out = audit / "validations" / f"batch-{batch}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    result["results_file"] = str(out)
    return result


def _run_checks(ctx: Any, source: Any, name: str, variable: str, checks: list) -> dict[str, Any]:
    """One suite per (variable, DataFrame) pair: GX validates one DataFrame per batch."""
    import great_expectations as gx

    outcomes = []
    frames: dict[int, tuple[Any, list]] = {}
    for df, expectation in checks:
        frames.setdefault(id(df), (df, []))[1].append(expectation)
    for n, (df, expectations) in enumerate(frames.values()):
        suite_name = f"{name}.{n}"
        asset = source.add_dataframe_asset(name=suite_name)
        batch_def = asset.add_batch_definition_whole_dataframe("all")
        suite = ctx.suites.add_or_update(gx.ExpectationSuite(name=suite_name))
        for expectation in expectations:
            suite.add_expectation(expectation)
        definition = ctx.validation_definitions.add_or_update(
            gx.ValidationDefinition(name=suite_name, data=batch_def, suite=suite)
        )
        run = definition.run(batch_parameters={"dataframe": df})
        for r in run.results:
            outcomes.append(
                {
                    "expectation": r.expectation_config.type,
                    "column": r.expectation_config.kwargs.get("column")
                    or r.expectation_config.kwargs.get("column_list"),
                    "success": bool(r.success),
                    "unexpected_count": r.result.get("unexpected_count"),
                }
            )
    rows = checks[0][0].count() if checks else 0
    return {
        "variable": variable,
        "rows": rows,
        "ok": all(o["success"] for o in outcomes),
        "expectations": outcomes,
    }


def format_validation(result: dict[str, Any]) -> str:
    lines = []
    for var in result["variables"]:
        for e in var["expectations"]:
            mark = "ok    " if e["success"] else "FAILED"
            extra = "" if e["success"] else f": {e['unexpected_count']} unexpected"
            lines.append(f"{mark} {var['variable']}: {e['expectation']}({e['column']}){extra}")
    verdict = "OK" if result["ok"] else "FAILED"
    lines.append(
        f"{verdict}: state of {result['query']} after batch {result['batch_id']}; "
        f"Data Docs: {result['data_docs']}"
    )
    return "\n".join(lines) + "\n"


def leaking_keys(result: dict[str, Any]) -> int:
    """How many keys hold expired state (0 when the expiry check passed or is not configured)."""
    return sum(
        e["unexpected_count"] or 0
        for v in result["variables"]
        for e in v["expectations"]
        if e["column"] == "expired" and not e["success"]
    )


def data_docs_path(query: Query) -> Path:
    return (
        audit_dir(query.checkpoint)
        / "gx"
        / "uncommitted"
        / "data_docs"
        / "local_site"
        / "index.html"
    )
