"""Data-level integrity: Great Expectations on the state itself (Spark-side, lazy imports).

For every state variable (or store) of the query at a committed batch: key columns non-null,
one row per key for value state and for a built-in operator's store (its whole key), rows
only in the partitions ``state-metadata`` names, row counts within
``expectations.row_change_factor`` of the previous validation, the registry's
``non_negative`` bounds, and no expired state left behind: no session or group state past
its timeout (``expectations.expiry``) and no entry past its TTL (variables with TTL
enabled). Results go to ``<checkpoint>.audit/validations/`` as JSON and to Great
Expectations Data Docs (HTML) under ``<checkpoint>.audit/gx/``.
"""

from __future__ import annotations

import json
import logging
import math
import os
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any

from stateops.control.audit import audit_dir
from stateops.core.checkpoint import load_checkpoint
from stateops.core.errors import CheckpointError, RegistryError
from stateops.core.formats import OffsetEntry
from stateops.core.registry import Query
from stateops.core.storage import (
    S3Path,
    file_names,
    list_files,
    prefetch,
    safe_relative_path,
    upload,
    write_file,
)
from stateops.spark.export import read_state_variable, state_reads

Store = tuple[int, str]
"""A state store or variable: ``(operator id, store name or state variable)``."""

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
    """Top-level columns only: struct fields become ``<struct>_<field>`` (at every depth), key
    fields keep their names (``key.user_id`` -> ``user_id``), so expectations can name them."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import StructType

    def leaves(path: list[str], dtype: Any, alias: str) -> list:
        if not isinstance(dtype, StructType):
            return [F.col(".".join(f"`{p}`" for p in path)).alias(alias)]
        # A variable with TTL wraps its value as {value, ttlExpirationMs}: keep the value's
        # column names as without TTL, so expectations survive turning TTL on.
        ttl_wrapped = dtype.fieldNames() == ["value", "ttlExpirationMs"]
        columns = []
        for sub in dtype.fields:
            if path == ["key"]:
                sub_alias = sub.name
            elif ttl_wrapped and sub.name == "value":
                sub_alias = alias
            else:
                sub_alias = f"{alias}_{sub.name}"
            columns += leaves([*path, sub.name], sub.dataType, sub_alias)
        return columns

    return df.select(*[c for f in df.schema.fields for c in leaves([f.name], f.dataType, f.name)])


def last_validation(
    audit: Path | S3Path, before: int | None = None
) -> tuple[Path | S3Path, dict] | None:
    """The latest validation result file under ``audit`` (of a batch before ``before``, if
    given) and its content; None if there is none."""
    found = []
    folder = audit / "validations"
    for name in file_names(folder):
        number = name.removeprefix("batch-").removesuffix(".json")
        if name.endswith(".json") and number.isdigit() and (before is None or int(number) < before):
            found.append((int(number), folder / name))
    if not found:
        return None
    path = max(found)[1]
    return path, json.loads(path.read_text(encoding="utf-8"))


def _previous_rows(audit: Path, batch: int, reads: list[dict[str, Any]]) -> dict[Store, int]:
    """Rows per store or variable (``(operator, name)``: two operators' stores are both
    ``default``) of ``reads`` at the latest validation of an earlier batch ({} if none). A
    result written before it recorded operators names stores only: trusted where the name is
    one store's, then and now."""
    last = last_validation(audit, before=batch)
    found = last[1].get("variables", []) if last else []
    rows = {(v["operator_id"], v["variable"]): int(v["rows"]) for v in found if "operator_id" in v}
    unique_then = Counter(v["variable"] for v in found)
    unique_now = Counter(r["variable"] for r in reads)
    for v in found:
        if "operator_id" not in v and unique_then[v["variable"]] == unique_now[v["variable"]] == 1:
            op = next(r["operator_id"] for r in reads if r["variable"] == v["variable"])
            rows[(op, v["variable"])] = int(v["rows"])
    return rows


def _expired_keys(df: DataFrame, query: Query, watermark_ms: int) -> DataFrame:
    """One row per key (per row, for a recorded timeout) with ``expired``: its latest time
    plus the timeout, or the timeout it records, is at or behind the watermark."""
    from pyspark.sql import functions as F

    expiry = query.expectations.expiry
    assert expiry is not None
    if expiry.timeout_column is not None:
        column = _column(query, df, "expectations.expiry", expiry.timeout_column)
        return df.select((F.col(column) <= F.lit(watermark_ms)).alias("expired"))
    assert expiry.time_column is not None and expiry.timeout_option is not None
    timeout_ms = int(query.code_options[expiry.timeout_option]) * 1000
    latest = F.max(F.unix_millis(F.col(expiry.time_column)))
    return df.groupBy(*query.key_columns).agg(
        ((latest + F.lit(timeout_ms)) <= F.lit(watermark_ms)).alias("expired")
    )


def _column(query: Query, df: DataFrame, field: str, column: str) -> str:
    if column not in df.columns:
        raise RegistryError(
            f"query {query.name}: {field}: no such column {column!r} (columns of the state: "
            f"{', '.join(df.columns)})"
        )
    return column


def validate_state(spark: SparkSession, query: Query, batch: int | None = None) -> dict[str, Any]:
    """Validate the state after committed ``batch`` (default: the last); plain-data results."""
    import great_expectations as gx
    from great_expectations.data_context.types.base import ProgressBarsConfig

    logging.getLogger("great_expectations").setLevel(logging.ERROR)
    cp = load_checkpoint(query.checkpoint)
    batch = cp.last_committed_batch if batch is None else batch
    if batch is None:
        raise CheckpointError(f"{query.checkpoint}: no committed batch yet: no state to validate")
    cp.restart_files(batch)
    offsets = cp.offsets[batch]
    audit = audit_dir(query.checkpoint)
    reads = state_reads(spark, query.checkpoint, batch)
    previous_rows = _previous_rows(audit, batch, reads)
    project, shared = gx_root(query.checkpoint), shared_project(query.checkpoint)
    pulled = _pull(shared, project) if shared is not None else {}
    ctx = gx.get_context(mode="file", project_root_dir=str(project.parent))
    # GX draws a progress bar per metric, which floods task logs.
    ctx.variables.progress_bars = ProgressBarsConfig(globally=False)
    source = ctx.data_sources.add_or_update_spark(name="state")
    variables = []
    for read in reads:
        store = (read["operator_id"], read["variable"])
        name = f"{query.name}.op{store[0]}.{store[1]}"
        raw = read_state_variable(spark, query.checkpoint, batch, read)
        checks = _variable_checks(query, read, raw, previous_rows.get(store), offsets)
        checked = _run_checks(ctx, source, name, read["variable"], checks)
        variables.append({"operator_id": read["operator_id"], **checked})
    ctx.build_data_docs()
    if shared is not None:  # what this validation wrote, beside what others did
        upload(project, shared, _changed(project, pulled))
    docs = data_docs_path(query)
    result = {
        "query": query.name,
        "checkpoint": query.checkpoint,
        "batch_id": batch,
        "watermark_ms": offsets.watermark_ms,
        "ok": all(v["ok"] for v in variables),
        "variables": variables,
        "data_docs": str(docs),
    }
    out = audit / "validations" / f"batch-{batch}.json"
    write_file(out, json.dumps(result, indent=2) + "\n")
    result["results_file"] = str(out)
    return result


def _variable_checks(
    query: Query, read: dict[str, Any], raw: DataFrame, previous: int | None, offsets: OffsetEntry
) -> list[tuple[DataFrame, Any]]:
    """The expectations on one state variable (``read``: :func:`state_reads`), each with the
    DataFrame it is checked on; ``previous``: its rows at the last validation, ``offsets``:
    the batch's (its watermark and processing time)."""
    import great_expectations.expectations as gxe

    variable = read["variable"]
    df = flatten_state(raw)
    checks: list[tuple[DataFrame, Any]] = []
    keys = [k for k in query.key_columns if k in df.columns]
    checks += [(df, gxe.ExpectColumnValuesToNotBeNull(column=k)) for k in keys]
    # Consistent with state-metadata: rows only in the operator's partitions.
    partitions = gxe.ExpectColumnValuesToBeBetween(
        column="partition_id", min_value=0, max_value=read["num_partitions"] - 1
    )
    checks.append((df, partitions))
    if previous:
        factor = query.expectations.row_change_factor
        low, high = math.floor(previous / factor), math.ceil(previous * factor)
        checks.append((df, gxe.ExpectTableRowCountToBeBetween(min_value=low, max_value=high)))
    if read.get("ttl"):
        # Spark evicts an entry whose TTL ran out by the batch's processing time.
        ttl_column = next(c for c in df.columns if c.endswith("_ttlExpirationMs"))
        ttl = gxe.ExpectColumnValuesToBeBetween(
            column=ttl_column, min_value=offsets.timestamp_ms, strict_min=True
        )
        checks.append((df, ttl))
    if read["kind"] == "store":  # a built-in operator's store: one row per whole key
        keys = flatten_state(raw.select("key")).columns
    if read["kind"] in ("value", "store") and keys:
        unique = (
            gxe.ExpectColumnValuesToBeUnique(column=keys[0])
            if len(keys) == 1
            else gxe.ExpectCompoundColumnsToBeUnique(column_list=keys)
        )
        checks.append((df, unique))
    for path in query.expectations.non_negative:
        var, _, column = path.partition(".")
        if var == variable:
            _column(query, df, f"expectations.non_negative: {path}", column)
            checks.append((df, gxe.ExpectColumnValuesToBeBetween(column=column, min_value=0)))
    expiry = query.expectations.expiry
    if expiry and expiry.variable == variable:
        expired = _expired_keys(df, query, offsets.watermark_ms)
        checks.append(
            (expired, gxe.ExpectColumnValuesToBeInSet(column="expired", value_set=[False]))
        )
    return checks


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
                    "observed": r.result.get("observed_value"),
                    "bounds": [
                        r.expectation_config.kwargs.get(b) for b in ("min_value", "max_value")
                    ]
                    if r.expectation_config.type == "expect_table_row_count_to_be_between"
                    else None,
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
    operators = {v.get("operator_id") for v in result["variables"]}
    for var in result["variables"]:
        # Two operators' stores share names (``default``): named by operator where there are.
        store = var["variable"]
        if len(operators) > 1:
            store = f"operator {var['operator_id']} {store}"
        for e in var["expectations"]:
            mark = "ok    " if e["success"] else "FAILED"
            extra = "" if e["success"] else f": {e['unexpected_count']} unexpected"
            if not e["success"] and e.get("bounds"):
                low, high = e["bounds"]
                extra = f": {e['observed']} rows, the last validation allows {low}..{high}"
            column = f"({e['column']})" if e["column"] else ""
            lines.append(f"{mark} {store}: {e['expectation']}{column}{extra}")
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


def gx_root(checkpoint: str) -> Path:
    """Great Expectations' project (its context and Data Docs) for ``checkpoint``: in its
    audit folder, or for a checkpoint in S3, where GX can only write local files, the local
    copy of its :func:`shared_project` in a folder named after the checkpoint's URL
    (``STATEOPS_GX_HOME``, default ``~/.cache/stateops/gx``). The validation results
    themselves stay in the audit prefix."""
    audit = audit_dir(checkpoint)
    if isinstance(audit, Path):
        return audit / "gx"
    home = os.environ.get("STATEOPS_GX_HOME") or Path.home() / ".cache" / "stateops" / "gx"
    return Path(home) / audit.bucket / audit.key / "gx"


def shared_project(checkpoint: str) -> S3Path | None:
    """Where the Great Expectations project of a checkpoint in S3 is kept between validations,
    beside its results (``<checkpoint>.audit/gx/``): each validation, on whichever host, works
    on a local copy (:func:`gx_root`) pulled from there and publishes it back, so the Data Docs
    there list every validation. None for a local checkpoint (its project is beside it)."""
    audit = audit_dir(checkpoint)
    return audit / "gx" if isinstance(audit, S3Path) else None


def _pull(shared: S3Path, local: Path) -> dict[str, bytes]:
    """The files of the project at ``shared`` into ``local`` (read at once, in parallel);
    returns what it wrote, by name. A key that would land outside ``local`` is refused."""
    rels = list(list_files(shared))
    for rel in rels:
        safe_relative_path(rel, f"the Great Expectations project at {shared}")
    prefetch(shared, rels)
    pulled = {rel: (shared / rel).read_bytes() for rel in rels}
    for rel, data in pulled.items():
        (local / rel).parent.mkdir(parents=True, exist_ok=True)
        (local / rel).write_bytes(data)
    return pulled


def _changed(project: Path, pulled: dict[str, bytes]) -> list[str]:
    """The files of ``project`` that are not as :func:`_pull` wrote them."""
    rels = (str(p.relative_to(project)) for p in project.rglob("*") if p.is_file())
    return [rel for rel in rels if pulled.get(rel) != (project / rel).read_bytes()]


def data_docs_path(query: Query) -> Path | S3Path:
    """The index page of the query's Data Docs: in its shared project for a checkpoint in S3
    (:func:`shared_project`), else beside the checkpoint."""
    project = shared_project(query.checkpoint) or gx_root(query.checkpoint)
    return project / "uncommitted" / "data_docs" / "local_site" / "index.html"
