"""Spark's repartition of a checkpoint's state, and its proof (the Spark side of
:mod:`stateops.ops.repartition`). Spark-side: PySpark is imported lazily.

The proof compares the state after batch N (before) with the state after the repartition's
batch N + 1, per operator and store or state variable: the same rows with the same
order-independent checksum; every row in the partition Spark's key hash gives it for the new
count (``pmod(hash(key), n)``, the hash partitioning every stateful operator's input uses, over
the operator's partitioning key: :func:`stateops.core.formats.partitioning_fields`); the
batch's partition count in the offsets log and, for operators with v2 metadata
(transformWithState), in their metadata. Spark writes v1 operator metadata once, at batch 0,
and never again: its count is reported, not required.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from stateops.core.checkpoint import load_checkpoint
from stateops.core.formats import partitioning_fields
from stateops.core.storage import S3Path, location, write_file
from stateops.spark.export import read_state_variable, state_checksum, state_reads
from stateops.spark.streaming import checkpoint_url

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

__all__ = ["repartition_and_prove", "store_states"]


def repartition_and_prove(
    spark: SparkSession, checkpoint: str, partitions: int, proof: str | Path | S3Path
) -> dict[str, Any]:
    """Repartition ``checkpoint`` (stopped, last batch N committed) to ``partitions`` with
    Spark's engine, then prove it; the proof is written to ``proof`` and returned."""
    _ = spark.streams.active  # the StateStoreCoordinator: Spark's repartition needs it
    last = load_checkpoint(checkpoint).last_committed_batch
    before = store_states(spark, checkpoint, last)
    url = checkpoint_url(spark, checkpoint)
    spark._streamingCheckpointManager.repartition(url, partitions)
    cp = load_checkpoint(checkpoint)
    batch = cp.last_committed_batch
    after = store_states(spark, checkpoint, batch, partitions)
    metadata = {
        f"operator {row['operatorId']} {row['stateStoreName']}": int(row["numPartitions"])
        for row in spark.read.format("state-metadata").option("batchId", batch).load(url).collect()
    }
    v2 = {op.operator_id for op in cp.operators if None not in op.metadata_files}
    failures = []
    if batch != last + 1:
        failures.append(f"Spark committed batch {batch}, expected {last + 1}")
    if cp.partitions(batch) != partitions:
        failures.append(f"the offsets log of batch {batch} says {cp.partitions(batch)} partitions")
    for name in sorted(before.keys() | after.keys()):
        old, new = before.get(name), after.get(name)
        if old is None or new is None or old["state"] != new["state"]:
            failures.append(f"{name}: {old and old['state']} before, {new and new['state']} after")
        elif new["misplaced"]:
            failures.append(f"{name}: {new['misplaced']} rows outside their key's partition")
    for name, count in metadata.items():
        if int(name.split()[1]) in v2 and count != partitions:
            failures.append(f"{name}: the operator metadata says {count} partitions")
    rows = sum(s["state"][0] for s in after.values())
    result = {
        "ok": not failures,
        "checkpoint": checkpoint,
        "batch_before": last,
        "batch": batch,
        "partitions": partitions,
        "stores": {
            name: {"before": before.get(name), "after": after.get(name)}
            for name in sorted(before.keys() | after.keys())
        },
        "metadata_partitions": metadata,
        "failures": failures,
        "summary": "; ".join(failures[:3])
        if failures
        else (
            f"{len(after)} stores, {rows} rows: the same rows and checksums as batch {last}, "
            f"each in its key's partition of {partitions}"
        ),
    }
    path = location(proof)  # beside the checkpoint: a folder, or a prefix in S3
    write_file(path, json.dumps(result, indent=1) + "\n")
    return result


def store_states(
    spark: SparkSession, checkpoint: str, batch: int, partitions: int | None = None
) -> dict[str, dict[str, Any]]:
    """Per operator and store or variable: (rows, checksum), and with ``partitions`` the rows
    outside the partition their key hashes to."""
    stores = {}
    for read in state_reads(spark, checkpoint, batch):
        df = read_state_variable(spark, checkpoint, batch, read)
        entry: dict[str, Any] = {"state": list(state_checksum(df))}
        if partitions is not None:
            entry["misplaced"] = _misplaced(df, read, partitions)
        stores[f"operator {read['operator_id']} {read['variable']}"] = entry
    return stores


def _misplaced(df: DataFrame, read: dict[str, Any], partitions: int) -> int:
    from pyspark.sql import functions as F

    fields = [f.name for f in df.schema["key"].dataType.fields]
    fields = partitioning_fields(read["operator_name"], read["variable"], fields)
    key = ", ".join(f"key.`{f}`" for f in fields)
    return df.where(F.expr(f"pmod(hash({key}), {partitions})") != F.col("partition_id")).count()
