"""Carry-over proof: the new checkpoint's state is what the old query's would have been.

Bootstrap and migration hand a query state through ``initialState`` (Spark applies it with
batch 0 only) or by a transplant of the old checkpoint's state files (the first batch is then
N + 1). :func:`prove_carry_over` compares what Spark stored with a reference that shares
nothing with the road under test: the old checkpoint's own state after its batch N, read with
Spark's state reader and loaded as it is (never through the processor's
``handleInitialState``), then carried through each new batch by the processor's
``handleInputRows`` and ``handleExpiredTimer`` in a pure-Python runtime
(:mod:`stateops.spark.simulator`), with the input rows the old query would have kept and the timers
it would have fired: the watermarks of a query restarted after batch N
(:func:`watermark_steps`), not the new checkpoint's. Per state variable and for
timers: row counts and checksums, with each list element's position in its list, so a list in
another order differs. It also compares each batch's watermark with the reference's. Batches
are proven until the new input's own watermark has caught up with the carried one (from then
on the carry changes nothing); a transplant's first batch only.

A bootstrap from data files (no old query) has only the processor's own ``handleInitialState``
to go by: :func:`prove_first_batch` simulates it with the same initial state and batch 0's
input. Large states are checked on a deterministic sample of keys (by key hash, the same keys
on both sides); the keys no batch touched are compared in Spark with the old state, as it was.
Spark-side: PySpark is imported lazily.
"""

from __future__ import annotations

import json
import math
from typing import TYPE_CHECKING, Any

from stateops.control.audit import audit_dir
from stateops.core.checkpoint import Checkpoint, load_checkpoint
from stateops.core.errors import CheckpointError, StateOpsError
from stateops.core.registry import Query
from stateops.core.storage import write_file
from stateops.spark.export import (
    batch_watermarks,
    read_exported,
    read_manifest,
    read_ordered_state,
    state_checksum,
    state_checksums,
    state_reads,
    store_checksums,
)
from stateops.spark.simulator import SimulatedHandle, simulate_batch

if TYPE_CHECKING:
    import pandas as pd
    from pyspark.sql import Column, DataFrame, SparkSession

__all__ = [
    "DEFAULT_MAX_KEYS",
    "format_proof",
    "proof_failures",
    "prove_carried_state",
    "prove_carry_over",
    "prove_first_batch",
    "simulate_query",
    "watermark_steps",
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
    from stateops.spark.streaming import load_processor

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


def _batch(
    spark: SparkSession, query: Query, cp: Checkpoint, batch: int, image: bool = False
) -> tuple[DataFrame, list]:
    """What ``batch`` read, as its source's kind reads it again: its input and where it came
    from (input files; a topic's ranges of records, ``topic[p] a..b``; empty: nothing). An
    ``image`` batch (:mod:`stateops.ops.carry`) reads nothing, whatever its offsets hold (an
    upgrade's: the old query's positions)."""
    source = query.source
    if image:
        return spark.createDataFrame([], source.schema_), []
    return source.kind.batch_read(spark, source, cp, batch, 0)


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
    image: bool = False,
    max_keys: int = DEFAULT_MAX_KEYS,
) -> dict[str, Any]:
    """Compare the state after batch 0 of a bootstrap from data files with the processor's
    ``handleInitialState`` on ``initial_state`` plus batch 0's input, simulated; ``image``:
    batch 0 is an image batch, which reads no input.

    There is no old query to compare with here (see :func:`prove_carry_over` for that), so the
    reference is the processor itself. The result (also written to
    ``<checkpoint>.audit/proofs/batch-0.json``) has ``ok`` and, per state variable, expected
    and actual rows and checksums.
    """
    from pyspark.sql import functions as F

    cp = load_checkpoint(query.checkpoint)
    batch = 0
    cp.restart_files(batch)  # the batch is committed and its state files are all there
    input_df, files = _batch(spark, query, cp, batch, image)
    offsets = cp.offsets[batch]
    keys = query.key_columns
    columns = [F.col(k) for k in keys]
    touched = input_df.select(*keys)
    if initial_state is not None:
        touched = touched.unionByName(initial_state.select(*keys))
    touched = touched.distinct().cache()
    total_keys = touched.count()
    modulus = max(1, math.ceil(total_keys / max_keys))
    not_sampled = touched.subtract(_sample(touched, columns, modulus)) if modulus > 1 else None
    input_pdf = _sample(input_df, columns, modulus).toPandas()
    initial_pdf = (
        None if initial_state is None else _sample(initial_state, columns, modulus).toPandas()
    )
    try:
        simulated = simulate_query(
            query, input_pdf, initial_pdf, offsets.timestamp_ms, offsets.watermark_ms
        )
    except StateOpsError as err:
        raise StateOpsError(
            f"query {query.name}: the proof cannot simulate batch {batch}: {err}"
        ) from err
    variables = _compare_batches(spark, query, {batch: simulated}, not_sampled)
    touched.unpersist()
    result = {
        "query": query.name,
        "checkpoint": query.checkpoint,
        "batch_id": batch,
        "batches": [batch],
        "carried": "initial state",
        "reference": "the processor's handleInitialState (no old query to compare with)",
        "input_files": len(files),
        "input_rows": len(input_pdf),
        "initial_state_rows": None if initial_pdf is None else len(initial_pdf),
        "keys": total_keys,
        "keys_note": "keys of the initial state and the batch",
        "sample": "all keys" if modulus == 1 else f"1 in {modulus} keys by key hash",
        "ok": all(v["ok"] for v in variables),
        "variables": variables,
    }
    return _write_proof(query, result)


def prove_carry_over(
    spark: SparkSession,
    query: Query,
    origin: dict[str, Any],
    *,
    first: int,
    image: bool,
    until_caught_up: bool,
    max_keys: int = DEFAULT_MAX_KEYS,
) -> dict[str, Any]:
    """Prove the new checkpoint's batches from ``first`` on against the old query's state.

    ``origin``: the old ``checkpoint`` and its ``batch`` N (and, for an export, its ``export``
    folder and ``watermark``, see :func:`stateops.spark.export.batch_watermarks`). ``image``: batch
    ``first`` (0) holds the carried state without input (the initialState road, see
    :mod:`stateops.ops.carry`). ``until_caught_up``: prove batches until the new input's own
    watermark has caught up with the carried one; else the first batch only (a transplant).
    The reference loads the old state as Spark's reader gives it (the old checkpoint's, or
    where that is gone, the export's) and never calls ``handleInitialState``.
    """
    from pyspark.sql import functions as F

    cp = load_checkpoint(query.checkpoint)
    last = cp.last_committed_batch
    if last is None or last < first:
        raise CheckpointError(f"{cp.root}: batch {first} has not committed: nothing to prove")
    old_frames, watermark, source = _old_state(spark, origin)
    old_frames = {name: df.cache() for name, df in old_frames.items()}  # read several times
    keys, columns = query.key_columns, [F.col(k) for k in query.key_columns]
    steps = _new_batches(
        spark,
        query,
        cp,
        range(first, last + 1),
        watermark,
        image=image,
        until_caught_up=until_caught_up,
    )
    _reference_watermarks(query, steps, watermark)
    touched = _touched_keys(query, steps, old_frames)
    total_keys = touched.count()
    modulus = max(1, math.ceil(total_keys / max_keys))
    sampled = _sample(touched, columns, modulus)
    not_sampled = touched.subtract(sampled) if modulus > 1 else None
    state = {
        name: _by_keys(df, sampled, keys, "left_semi").collect() for name, df in old_frames.items()
    }
    simulated, watermarks, input_rows = _simulate_batches(query, cp, steps, state, columns, modulus)
    untouched = {name: _by_keys(df, touched, keys, "left_anti") for name, df in old_frames.items()}
    variables = _compare_batches(spark, query, simulated, not_sampled, untouched)
    touched.unpersist()
    for df in old_frames.values():
        df.unpersist()
    proven = [s["batch"] for s in steps]
    result = {
        "query": query.name,
        "checkpoint": query.checkpoint,
        "batch_id": proven[0],
        "batches": proven,
        "carried": f"state of {origin['checkpoint']} after batch {origin['batch']}",
        "reference": f"{source}, loaded as it is, plus the new input at the old query's "
        "watermarks (handleInitialState not called)",
        "watermark_carried": watermark,
        "input_files": sum(len(s["files"]) for s in steps),
        "input_rows": input_rows,
        "keys": total_keys,
        "keys_note": "keys the batches can change (the others are compared as they were)",
        "sample": "all keys" if modulus == 1 else f"1 in {modulus} keys by key hash",
        "watermarks": watermarks,
        "ok": all(v["ok"] for v in variables) and all(w["ok"] for w in watermarks),
        "variables": variables,
    }
    return _write_proof(query, result)


def _new_batches(
    spark: SparkSession,
    query: Query,
    cp: Checkpoint,
    batches: range,
    watermark: dict[str, int],
    *,
    image: bool,
    until_caught_up: bool,
) -> list[dict[str, Any]]:
    """The new checkpoint's batches to prove, each with its input files, its input and its
    latest event time: up to the one where the new input's own watermark has caught up with
    the carried one (``until_caught_up``), else the first only."""
    from pyspark.sql import functions as F

    delay = query.watermark.delay_ms if query.watermark else None
    steps: list[dict[str, Any]] = []
    own_late = own_evict = 0  # the watermarks the new input alone gives (no carry)
    for batch in batches:
        cp.restart_files(batch)  # committed, and its state files are all there
        df, files = _batch(spark, query, cp, batch, image and batch == batches[0])
        latest = None
        if delay is not None and files:
            # Spark's watermark: the latest event time in ms, truncated, minus the delay.
            latest = df.select(F.max(F.unix_millis(F.col(query.watermark.column)))).first()[0]
        steps.append(
            {
                "batch": batch,
                "files": files,
                "input": df,
                "latest": latest,
                "image": image and batch == batches[0],
            }
        )
        if not until_caught_up:
            break
        if not steps[-1]["image"]:
            caught_up = delay is None or (own_late, own_evict) == _carried(watermark, steps, delay)
            own_late, own_evict = (
                own_evict,
                own_evict if latest is None else max(own_evict, latest - delay),
            )
            if caught_up:
                break
    return steps


def _reference_watermarks(
    query: Query, steps: list[dict[str, Any]], watermark: dict[str, int]
) -> None:
    """Each step's ``late`` and ``evict`` watermarks in the reference, and its input ``kept``
    (without the rows Spark drops as late): the image batch runs at batch N's watermarks, the
    others as batch N + 1..."""
    from pyspark.sql import functions as F

    delay = query.watermark.delay_ms if query.watermark else None
    moved = [s for s in steps if not s["image"]]
    chain = iter(watermark_steps(watermark, [s["latest"] for s in moved], delay))
    for step in steps:
        late, evict = (None, watermark["batch_watermark_ms"]) if step["image"] else next(chain)
        step["late"], step["evict"] = late, evict
        df = step["input"]
        if late is not None and query.watermark:
            column = F.col(query.watermark.column)  # Spark drops rows at or before it as late
            df = df.filter(column.isNull() | (column > F.timestamp_millis(F.lit(late))))
        step["kept"] = df


def _touched_keys(
    query: Query, steps: list[dict[str, Any]], old_frames: dict[str, DataFrame]
) -> DataFrame:
    """The keys some batch can change (cached): its input's, and those of old timers due by
    the end."""
    from pyspark.sql import functions as F

    keys = query.key_columns
    touched = None
    for step in steps:
        batch_keys = step["input"].select(*keys)
        touched = batch_keys if touched is None else touched.unionByName(batch_keys)
    if "timers" in old_frames and query.processor.time_mode == "EventTime":
        due = max(s["evict"] for s in steps)
        timers = old_frames["timers"].filter(F.col("expiration_timestamp_ms") <= due)
        touched = touched.unionByName(timers.select(*(F.col("key")[k].alias(k) for k in keys)))
    return touched.distinct().cache()


def _simulate_batches(
    query: Query,
    cp: Checkpoint,
    steps: list[dict[str, Any]],
    state: dict[str, Any],
    columns: list[Column],
    modulus: int,
) -> tuple[dict[int, Any], list[dict[str, Any]], int]:
    """The reference: the sampled old ``state`` carried through each step's kept input
    (sampled) by the processor; with each batch's watermark check and the input rows used."""
    watermarks, input_rows, simulated = [], 0, {}
    for step in steps:
        batch, offsets = step["batch"], cp.offsets[step["batch"]]
        rows = _sample(step["kept"], columns, modulus).toPandas()
        input_rows += len(rows)
        given = rows if len(rows) else None
        try:
            simulated[batch] = simulate_query(
                query, given, None, offsets.timestamp_ms, step["evict"], state
            )
        except StateOpsError as err:
            raise StateOpsError(
                f"query {query.name}: the proof cannot simulate batch {batch}: {err}"
            ) from err
        state = {
            name: simulated[batch].rows(name) for name in [*simulated[batch].variables, "timers"]
        }
        if query.watermark:
            ok = offsets.watermark_ms == step["evict"]
            watermarks.append(
                {
                    "batch": batch,
                    "ok": ok,
                    "expected": step["evict"],
                    "actual": offsets.watermark_ms,
                }
            )
    return simulated, watermarks, input_rows


def prove_carried_state(
    spark: SparkSession, query: Query, origin: dict[str, Any], carried: int
) -> dict:
    """A transplanted ``transform``'s carried state: every store of every operator reads the
    same (rows and checksum) after batch ``carried`` of the new checkpoint (N, or N + 1 where
    Spark repartitioned it) as after batch N of the old one (``origin``). Its first new batch
    is Spark's own operators on that state; there is no processor to simulate."""
    old, batch = origin["checkpoint"], int(origin["batch"])
    load_checkpoint(query.checkpoint).restart_files(carried)  # the carried batch is whole
    expected = store_checksums(spark, old, batch)
    actual = store_checksums(spark, query.checkpoint, carried)
    none = ("", (0, "0"))
    variables = [
        _compared(
            name,
            (expected.get(name) or actual[name])[0],
            carried,
            expected.get(name, none)[1],
            actual.get(name, none)[1],
        )
        for name in sorted(expected.keys() | actual.keys())
    ]
    result = {
        "query": query.name,
        "checkpoint": query.checkpoint,
        "batch_id": carried,
        "batches": [carried],
        "carried": f"state of {old} after batch {batch}",
        "reference": "Spark's state reader on both checkpoints, every store of every operator",
        "input_files": 0,
        "input_rows": 0,
        "sample": "all keys",
        "watermarks": [],
        "ok": bool(variables) and all(v["ok"] for v in variables),
        "variables": variables,
    }
    return _write_proof(query, result)


def _carried(watermark: dict[str, int], steps: list[dict[str, Any]], delay: int) -> tuple:
    """(late, evict) of the last of ``steps`` with the carried watermark."""
    moved = [s["latest"] for s in steps if not s["image"]]
    return watermark_steps(watermark, moved, delay)[-1]


def _old_state(
    spark: SparkSession, origin: dict[str, Any]
) -> tuple[dict[str, DataFrame], dict[str, int], str]:
    """The old state after batch N by variable (list elements with their position), the
    watermarks batch N ran with and handed on, and where they were read from: the old
    checkpoint, or where it is gone or no longer holds batch N, the export."""
    old, batch = origin.get("checkpoint"), int(origin["batch"])
    try:
        cp = load_checkpoint(old)
        cp.restart_files(batch)
    except (StateOpsError, OSError, TypeError):
        export = origin.get("export")
        if not export:
            raise
        manifest = read_manifest(export)
        frames = {e["variable"]: read_exported(spark, export, e) for e in manifest["entries"]}
        return frames, manifest["watermark"], f"the export {export} (its checkpoint is gone)"
    frames = {
        read["variable"]: read_ordered_state(spark, str(cp.root), batch, read).drop("partition_id")
        for read in state_reads(spark, str(cp.root), batch)
    }
    return frames, batch_watermarks(cp, batch), f"the state of {cp.root} after batch {batch}"


def _compare_batches(
    spark: SparkSession,
    query: Query,
    simulated: dict[int, SimulatedHandle],
    not_sampled: DataFrame | None,
    untouched: dict[str, DataFrame] | None = None,
) -> list[dict[str, Any]]:
    """Per variable and batch: Spark's state after the batch against the simulated keys'
    plus the ``untouched`` keys' old state; keys left out of the sample are left out of both.
    One job per side and variable for all batches (the state reader is slow to start)."""
    from pyspark.sql import functions as F

    keys, batches = query.key_columns, sorted(simulated)
    tag = "_stateops_batch"
    variables, seen = [], set()
    for read in state_reads(spark, query.checkpoint, batches[-1]):
        name = read["variable"]
        seen.add(name)
        actual = None
        for batch in batches:
            df = read_ordered_state(spark, query.checkpoint, batch, read).drop("partition_id")
            df = df.withColumn(tag, F.lit(batch))
            actual = df if actual is None else actual.unionByName(df)
        if not_sampled is not None:
            actual = _by_keys(actual, not_sampled, keys, "left_anti")
        fields = [f.name for f in actual.schema.fields if f.name != tag]
        rows = [
            (*(r[f] for f in fields), batch)
            for batch in batches
            if name == "timers" or name in simulated[batch].variables
            for r in simulated[batch].rows(name)
        ]
        expected = state_checksums(
            spark.createDataFrame(rows, schema=actual.schema, verifySchema=True), tag
        )
        found = state_checksums(actual, tag)
        more = (0, "0")
        if untouched and name in untouched:  # plus the keys no batch touched, as they were
            more = state_checksum(untouched[name])
        for batch in batches:
            rows_, sum_ = expected.get(batch, (0, "0"))
            variables.append(
                _compared(
                    name,
                    read["kind"],
                    batch,
                    (rows_ + more[0], str(int(sum_) + int(more[1]))),
                    found.get(batch, (0, "0")),
                )
            )
    for batch in batches:
        for name, variable in simulated[batch].variables.items():
            if name not in seen and variable.data:
                variables.append(
                    {
                        "variable": name,
                        "kind": variable.kind,
                        "batch": batch,
                        "ok": False,
                        "expected_rows": len(simulated[batch].rows(name)),
                        "actual_rows": 0,
                        "expected_checksum": None,
                        "actual_checksum": None,
                        "problem": "the processor holds it, the checkpoint has no such variable",
                    }
                )
    return sorted(variables, key=lambda v: v["batch"])


def _write_proof(query: Query, result: dict[str, Any]) -> dict[str, Any]:
    out = audit_dir(query.checkpoint) / "proofs" / f"batch-{result['batch_id']}.json"
    write_file(out, json.dumps(result, indent=2, default=str) + "\n")
    result["proof_file"] = str(out)
    return result


def _compared(
    name: str, kind: str, batch: int, expected: tuple[int, str], actual: tuple[int, str]
) -> dict[str, Any]:
    return {
        "variable": name,
        "kind": kind,
        "batch": batch,
        "ok": expected == actual,
        "expected_rows": expected[0],
        "actual_rows": actual[0],
        "expected_checksum": expected[1],
        "actual_checksum": actual[1],
    }


def format_proof(result: dict[str, Any]) -> str:
    """One line per variable (and batch) and watermark that differs, and a verdict, for logs."""
    lines = []
    many = len(result["batches"]) > 1
    for v in result["variables"]:
        mark = "ok    " if v["ok"] else "DIFFERS"
        detail = f"{v['actual_rows']} rows"
        if not v["ok"]:
            detail = (
                f"{v['actual_rows']} rows (expected {v['expected_rows']}), checksum "
                f"{v['actual_checksum']} (expected {v['expected_checksum']})"
            )
        where = f"batch {v['batch']} " if many else ""
        lines.append(f"{mark} {where}{v['variable']} ({v['kind']}): {detail}")
    for w in result.get("watermarks", []):
        if not w["ok"]:
            lines.append(
                f"DIFFERS batch {w['batch']} watermark: {w['actual']} ms (the old query's would "
                f"be {w['expected']} ms)"
            )
    verdict = "PROVEN" if result["ok"] else "NOT PROVEN"
    batches = result["batches"]
    span = f"batch {batches[0]}" if len(batches) == 1 else f"batches {batches[0]}-{batches[-1]}"
    lines.append(
        f"{verdict}: state of {result['query']} after {span} "
        f"{'equals' if result['ok'] else 'differs from'} the {result['carried']} plus the "
        f"input ({result['input_files']} files, {result['input_rows']} rows kept; "
        f"{result['sample']}); reference: {result['reference']}"
    )
    return "\n".join(lines) + "\n"


def proof_failures(result: dict[str, Any]) -> str:
    """What failed, in one line (empty when proven)."""
    many = len(result["batches"]) > 1
    failed = [
        (f"batch {v['batch']} " if many else "")
        + f"{v['variable']}: {v['actual_rows']} rows, expected {v['expected_rows']}"
        + ("" if v["actual_rows"] != v["expected_rows"] else " (contents differ)")
        for v in result["variables"]
        if not v["ok"]
    ]
    failed += [
        f"batch {w['batch']} ran with watermark {w['actual']}, the old query's would be "
        f"{w['expected']}"
        for w in result.get("watermarks", [])
        if not w["ok"]
    ]
    return "; ".join(failed)


def watermark_steps(
    watermark: dict[str, int], max_event_ms: list[int | None], delay: int | None
) -> list[tuple[int, int]]:
    """``(late, evict)`` for each batch after the old query's batch N, as Spark gives them to a
    query restarted after N: rows at or before ``late`` are dropped, timers at or before
    ``evict`` fire. ``max_event_ms``: each batch's latest event time (None: no input)."""
    late = int(watermark["batch_watermark_ms"])
    tracker = max(late, int(watermark["next_batch_watermark_ms"]))
    steps = []
    for latest in max_event_ms:
        steps.append((late, tracker))
        late = tracker
        if delay is not None and latest is not None:
            tracker = max(tracker, latest - delay)
    return steps
