"""Carry-over proof: the state after the first batch is the carried state plus its effect.

Bootstrap and migration hand a query state either through ``initialState`` (Spark applies it
only with batch 0 and ignores it silently afterwards) or by a transplant of the old
checkpoint's state files (the first batch is then N + 1). This proof reads back what Spark
stored and compares it with what the query's own processor leaves behind when a pure-Python
runtime (:mod:`stateops.simulator`) applies the same carried state (the initial state, or the
old checkpoint's state after N) and the same input files (from the source log of that batch):
row counts and order-independent checksums, per state variable and for timers. Large states
are checked on a deterministic sample of keys (by key hash, the same keys on both sides).
Spark-side: PySpark is imported lazily.
"""

from __future__ import annotations

import json
import math
from typing import TYPE_CHECKING, Any

from stateops.audit import audit_dir
from stateops.checkpoint import load_checkpoint
from stateops.errors import StateOpsError
from stateops.export import read_state_variable, state_checksum, state_reads
from stateops.registry import Query
from stateops.simulator import SimulatedHandle, simulate_batch

if TYPE_CHECKING:
    import pandas as pd
    from pyspark.sql import Column, DataFrame, SparkSession

__all__ = [
    "DEFAULT_MAX_KEYS",
    "format_proof",
    "proof_failures",
    "prove_first_batch",
    "simulate_query",
]

# Above this many keys the simulation runs on a 1-in-m sample of keys (the processor runs
# once per key in Python: about 10,000 keys/s).
DEFAULT_MAX_KEYS = 200_000


def simulate_query(
    query: Query,
    input_rows: pd.DataFrame | None,
    initial_state: pd.DataFrame | None,
    batch_timestamp_ms: int = 0,
    watermark_ms: int = 0,
    prior_state: dict[str, list[Any]] | None = None,
) -> SimulatedHandle:
    """One micro-batch of the registered query's processor, in memory (no state store)."""
    from stateops.streaming import load_processor

    return simulate_batch(
        load_processor(query),
        time_mode=query.processor.time_mode,
        key_columns=query.key_columns,
        input_rows=input_rows,
        initial_state=initial_state,
        batch_timestamp_ms=batch_timestamp_ms,
        watermark_ms=watermark_ms,
        prior_state=prior_state,
    )


def _batch_input(spark: SparkSession, query: Query, files: list[str]) -> DataFrame:
    source = query.source
    if not files:
        return spark.createDataFrame([], source.schema_)
    reader = spark.read.format(source.format).schema(source.schema_)
    return reader.options(**source.reader_options).load(files)


def _sample(df: DataFrame, keys: list[Column], modulus: int) -> DataFrame:
    """The rows of 1 in ``modulus`` keys, chosen by key hash (the same keys in every frame)."""
    from pyspark.sql import functions as F

    if modulus == 1:
        return df
    return df.filter(F.pmod(F.xxhash64(*keys), F.lit(modulus)) == 0)


def _by_keys(state: DataFrame, keyset: DataFrame, keys: list[str], how: str) -> DataFrame:
    """``state`` rows (key in a ``key`` struct) joined with a frame of key columns: ``how`` is
    ``left_semi`` (rows of those keys) or ``left_anti`` (rows of other keys)."""
    from pyspark.sql import functions as F

    names = [f"_stateops_key_{k}" for k in keys]
    keyed = state.select("*", *(F.col("key")[k].alias(n) for k, n in zip(keys, names, strict=True)))
    keyset = keyset.select(*(F.col(k).alias(n) for k, n in zip(keys, names, strict=True)))
    return keyed.join(keyset, on=names, how=how).drop(*names)


def prove_first_batch(
    spark: SparkSession,
    query: Query,
    initial_state: DataFrame | None,
    *,
    prior: tuple[str, int] | None = None,
    max_keys: int = DEFAULT_MAX_KEYS,
) -> dict[str, Any]:
    """Compare the state after the first batch of carried-over state with a simulation of it.

    The initialState road: batch 0 from ``initial_state``. The transplant road (``prior`` =
    the old checkpoint and its batch N): batch N + 1 from the old checkpoint's state after N.
    The result (also written to ``<checkpoint>.audit/proofs/batch-<id>.json``) has ``ok`` and,
    per state variable, expected and actual rows and checksums.
    """
    from pyspark.sql import functions as F

    cp = load_checkpoint(query.checkpoint)
    batch = 0 if prior is None else prior[1] + 1
    cp.restart_files(batch)  # the batch is committed and its state files are all there
    files = [f["path"] for f in cp.input_files(batch)]
    offsets = cp.offsets[batch]
    keys = query.key_columns
    columns = [F.col(k) for k in keys]
    input_df = _batch_input(spark, query, files)
    if query.watermark and batch - 1 in cp.offsets:
        # Spark drops input at or before the previous batch's watermark as late.
        late = F.timestamp_millis(F.lit(cp.offsets[batch - 1].watermark_ms))
        column = F.col(query.watermark.column)
        input_df = input_df.filter(column.isNull() | (column > late))
    prior_frames = {}
    if prior is not None:
        prior_frames = {
            read["variable"]: read_state_variable(spark, prior[0], prior[1], read)
            for read in state_reads(spark, prior[0], prior[1])
        }
    # The keys the batch can change: with an initial state, all; after a transplant, the
    # batch's input keys and those whose timers fire. Only those are simulated; every other
    # key's state must be the old checkpoint's, as it was (compared in Spark).
    touched = input_df.select(*keys)
    if initial_state is not None:
        touched = touched.unionByName(initial_state.select(*keys))
    threshold = {"EventTime": offsets.watermark_ms, "ProcessingTime": offsets.timestamp_ms}
    due = threshold.get(query.processor.time_mode)
    if "timers" in prior_frames and due is not None:
        timers = prior_frames["timers"].filter(F.col("expiration_timestamp_ms") <= due)
        touched = touched.unionByName(timers.select(*(F.col("key")[k].alias(k) for k in keys)))
    touched = touched.distinct().cache()
    total_keys = touched.count()
    modulus = max(1, math.ceil(total_keys / max_keys))
    sampled = _sample(touched, columns, modulus)
    not_sampled = touched.subtract(sampled) if modulus > 1 else None
    input_pdf = _sample(input_df, columns, modulus).toPandas()
    initial_pdf = (
        None if initial_state is None else _sample(initial_state, columns, modulus).toPandas()
    )
    prior_rows = {
        name: _by_keys(df, sampled, keys, "left_semi").collect()
        for name, df in prior_frames.items()
    }
    try:
        simulated = simulate_query(query, input_pdf, initial_pdf, offsets.timestamp_ms,
                                   offsets.watermark_ms, prior_rows)  # fmt: skip
    except StateOpsError as err:
        raise StateOpsError(
            f"query {query.name}: the proof cannot simulate batch {batch}: {err}"
        ) from err

    variables = []
    seen = set()
    for read in state_reads(spark, str(cp.root), batch):
        name = read["variable"]
        seen.add(name)
        actual = read_state_variable(spark, str(cp.root), batch, read).drop("partition_id")
        if not_sampled is not None:
            actual = _by_keys(actual, not_sampled, keys, "left_anti")
        known = name == "timers" or name in simulated.variables
        rows = simulated.rows(name) if known else []
        fields = [f.name for f in actual.schema.fields]
        expected = state_checksum(spark.createDataFrame(
            [tuple(r[f] for f in fields) for r in rows], schema=actual.schema, verifySchema=True
        ))  # fmt: skip
        if name in prior_frames:  # plus the keys the batch left alone, as they were
            untouched = _by_keys(prior_frames[name].drop("partition_id"), touched, keys,
                                 "left_anti")  # fmt: skip
            more = state_checksum(untouched)
            expected = (expected[0] + more[0], str(int(expected[1]) + int(more[1])))
        variables.append(_compare(name, read["kind"], expected, actual))
    touched.unpersist()
    for name, variable in simulated.variables.items():
        if name not in seen and variable.data:
            variables.append(
                {"variable": name, "kind": variable.kind, "ok": False,
                 "expected_rows": len(simulated.rows(name)), "actual_rows": 0,
                 "expected_checksum": None, "actual_checksum": None,
                 "problem": "the processor holds it, the checkpoint has no such variable"}
            )  # fmt: skip
    result = {
        "query": query.name,
        "checkpoint": query.checkpoint,
        "batch_id": batch,
        "carried": "initial state"
        if prior is None
        else f"state of {prior[0]} after batch {prior[1]}",
        "input_files": len(files),
        "input_rows": len(input_pdf),
        "initial_state_rows": None if initial_pdf is None else len(initial_pdf),
        "keys": total_keys,
        "keys_note": "keys the batch can change (the others are compared as they were)"
        if prior
        else "keys of the initial state and the batch",
        "sample": "all keys" if modulus == 1 else f"1 in {modulus} keys by key hash",
        "ok": all(v["ok"] for v in variables),
        "variables": variables,
    }
    out = audit_dir(query.checkpoint) / "proofs" / f"batch-{batch}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2, default=str) + "\n", encoding="utf-8")
    result["proof_file"] = str(out)
    return result


def _compare(name: str, kind: str, expected: tuple[int, str], actual: DataFrame) -> dict[str, Any]:
    actual_rows, actual_sum = state_checksum(actual)
    expected_rows, expected_sum = expected
    return {
        "variable": name,
        "kind": kind,
        "ok": (expected_rows, expected_sum) == (actual_rows, actual_sum),
        "expected_rows": expected_rows,
        "actual_rows": actual_rows,
        "expected_checksum": expected_sum,
        "actual_checksum": actual_sum,
    }


def format_proof(result: dict[str, Any]) -> str:
    """One line per variable and a verdict, for logs."""
    lines = []
    for v in result["variables"]:
        mark = "ok    " if v["ok"] else "DIFFERS"
        detail = f"{v['actual_rows']} rows"
        if not v["ok"]:
            detail = (
                f"{v['actual_rows']} rows (expected {v['expected_rows']}), checksum "
                f"{v['actual_checksum']} (expected {v['expected_checksum']})"
            )
        lines.append(f"{mark} {v['variable']} ({v['kind']}): {detail}")
    verdict = "PROVEN" if result["ok"] else "NOT PROVEN"
    lines.append(
        f"{verdict}: state of {result['query']} after batch {result['batch_id']} "
        f"{'equals' if result['ok'] else 'differs from'} the {result['carried']} plus that "
        f"batch's input ({result['input_files']} files, {result['input_rows']} rows; "
        f"{result['sample']})"
    )
    return "\n".join(lines) + "\n"


def proof_failures(result: dict[str, Any]) -> str:
    """The failed variables in one line (empty when proven)."""
    return "; ".join(
        f"{v['variable']}: {v['actual_rows']} rows, expected {v['expected_rows']}"
        + ("" if v["actual_rows"] != v["expected_rows"] else " (contents differ)")
        for v in result["variables"]
        if not v["ok"]
    )
