"""State export: a checkpoint's state at a committed batch, as Parquet plus a manifest.

The portable form of state used by bootstrap, validation, backfill and migration. One Parquet
folder per (operator, state variable or store); the manifest records its schema, row count and
an order-independent checksum, so two exports of the same state compare equal whatever the
partitioning or row order. List state is exported one row per element with its position in
the list (``list_position``, 0 first): the order is part of the state (a session's events,
in the order they arrived), so it is part of the checksum too. The manifest also records the
batch's watermarks, which a carry-over continues from. An export is a local folder or an S3
prefix (on a fleet, the host that bootstraps from it is not the one that exported it).
Spark-side: PySpark is imported lazily.
"""

from __future__ import annotations

import json
import os
import re
import stat
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from stateops.core import faults
from stateops.core.access import refuse_unreadable, refuse_unwritable
from stateops.core.checkpoint import Checkpoint, load_checkpoint
from stateops.core.errors import CheckpointError, StateOpsError
from stateops.core.formats import parse_offsets
from stateops.core.staging import has_entries, occupied
from stateops.core.storage import (
    S3Path,
    begin_unfinished,
    end_unfinished,
    location,
    remove_all,
)
from stateops.core.verify import refuse_damaged
from stateops.spark.streaming import checkpoint_url, data_url

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

__all__ = [
    "MANIFEST",
    "POSITION",
    "batch_watermarks",
    "check_export",
    "export_state",
    "read_exported",
    "read_manifest",
    "read_ordered_state",
    "read_state_variable",
    "state_checksum",
    "state_checksums",
    "state_reads",
    "store_checksums",
]

MANIFEST = "manifest.json"
POSITION = "list_position"


def read_manifest(export: str | os.PathLike[str] | S3Path) -> dict[str, Any]:
    """The manifest of the export at ``export`` (a folder or an S3 prefix);
    ``FileNotFoundError`` where it has none."""
    return json.loads((location(export) / MANIFEST).read_text(encoding="utf-8"))


def read_exported(
    spark: SparkSession, export: str | os.PathLike[str] | S3Path, entry: dict[str, Any]
) -> DataFrame:
    """The rows of a manifest's ``entry`` in the export at ``export``, read by Spark."""
    return spark.read.parquet(data_url(spark, location(export) / entry["path"]))


def state_checksum(df: DataFrame) -> tuple[int, str]:
    """(rows, checksum): the checksum is the sum of each row's xxhash64, independent of row
    order (a list's order is in its rows' ``list_position``)."""
    return state_checksums(df).get(None, (0, "0"))


def state_checksums(df: DataFrame, by: str | None = None) -> dict[Any, tuple[int, str]]:
    """:func:`state_checksum` per value of column ``by`` (all rows under None), in one job."""
    from pyspark.sql import functions as F

    columns = [c for c in df.columns if c not in ("partition_id", by)]
    groups = [F.col(by)] if by else []
    rows = df.groupBy(*groups).agg(
        F.count(F.lit(1)).alias("rows"),
        F.sum(F.xxhash64(*columns).cast("decimal(38,0)")).alias("checksum"),
    )
    return {
        (row[by] if by else None): (int(row["rows"]), str(row["checksum"] or 0))
        for row in rows.collect()
    }


def state_reads(spark: SparkSession, checkpoint: str, batch: int) -> list[dict[str, Any]]:
    """What to read, per operator: state variables and timers (transformWithState) or stores."""
    # The statestore reader on RocksDB needs the StateStoreCoordinator (see shared/FACTS.md).
    _ = spark.streams.active
    reads = []
    # The batch's own partition count: state-metadata's is batch 0's for operators with v1
    # metadata, which Spark never rewrites (stale after a repartition).
    partitions = parse_offsets(location(checkpoint) / "offsets" / str(batch), batch).partitions
    url = checkpoint_url(spark, checkpoint)
    meta = spark.read.format("state-metadata").option("batchId", batch).load(url)
    for row in meta.orderBy("operatorId", "stateStoreName").collect():
        base = {
            "operator_id": int(row["operatorId"]),
            "operator_name": row["operatorName"],
            "num_partitions": partitions or int(row["numPartitions"]),
        }
        props = json.loads(row["operatorProperties"] or "{}")
        variables = props.get("stateVariables")
        if variables is None:
            store = row["stateStoreName"]
            options = {} if store == "default" else {"storeName": store}
            reads.append({**base, "variable": store, "kind": "store", "options": options})
            continue
        for var in variables:
            name = var["stateName"]
            if var["stateVariableType"] == "TimerState":
                # Internal timer families are read through readRegisteredTimers, once.
                if not any(
                    r.get("kind") == "timers" and r["operator_id"] == base["operator_id"]
                    for r in reads
                ):
                    reads.append(
                        {
                            **base,
                            "variable": "timers",
                            "kind": "timers",
                            "options": {"readRegisteredTimers": "true"},
                        }
                    )
            elif not name.startswith("$"):
                kind = var["stateVariableType"].removesuffix("State").lower()
                reads.append(
                    {
                        **base,
                        "variable": name,
                        "kind": kind,
                        "ttl": bool(var.get("ttlEnabled")),
                        "options": {"stateVarName": name},
                    }
                )
    return reads


def store_checksums(spark: SparkSession, checkpoint: str, batch: int) -> dict[str, tuple]:
    """Every entry of :func:`state_reads` after ``batch`` (every store of every operator, or
    every state variable): ``operator N <variable>`` -> (kind, (rows, checksum))."""
    return {
        f"operator {r['operator_id']} {r['variable']}": (
            r["kind"],
            state_checksum(read_state_variable(spark, checkpoint, batch, r)),
        )
        for r in state_reads(spark, checkpoint, batch)
    }


def read_state_variable(
    spark: SparkSession, checkpoint: str, batch: int, read: dict[str, Any]
) -> DataFrame:
    """One entry of :func:`state_reads` after ``batch``, with Spark's ``partition_id`` column."""
    return (
        spark.read.format("statestore")
        .options(batchId=str(batch), operatorId=str(read["operator_id"]), **read["options"])
        .load(checkpoint_url(spark, checkpoint))
    )


def read_ordered_state(
    spark: SparkSession, checkpoint: str, batch: int, read: dict[str, Any]
) -> DataFrame:
    """:func:`read_state_variable`, with each list element's position in its list
    (``list_position``, 0 first) beside it: Spark's flattened rows do not say it."""
    from pyspark.sql import functions as F

    if read["kind"] != "list":
        return read_state_variable(spark, checkpoint, batch, read)
    lists = (
        spark.read.format("statestore")
        .options(batchId=str(batch), operatorId=str(read["operator_id"]), **read["options"])
        .option("flattenCollectionTypes", "false")
        .load(checkpoint_url(spark, checkpoint))
    )
    exploded = lists.select(
        "key", F.posexplode("list_value").alias(POSITION, "list_element"), "partition_id"
    )
    return exploded.select("key", "list_element", POSITION, "partition_id")


def batch_watermarks(cp: Checkpoint, batch: int) -> dict[str, int]:
    """The event-time watermark committed batch ``batch`` ran with and the one its commit
    hands to the next batch (Spark restarts with the larger: a batch that advanced the
    watermark and was the last before a stop has not used it yet)."""
    ran = cp.offsets[batch].watermark_ms
    following = int(cp.commits[batch].get("nextBatchWatermarkMs", ran) or 0)
    return {"batch_watermark_ms": ran, "next_batch_watermark_ms": max(ran, following)}


def check_export(
    checkpoint: str | os.PathLike[str], out: str | os.PathLike[str], batch: int | None = None
) -> tuple[Checkpoint, int]:
    """The checkpoint and the committed batch an export would read, or a one-line refusal:
    everything an export checks without Spark (the CLI and the job run it before spark-submit).
    """
    cp = load_checkpoint(checkpoint)
    batch = cp.last_committed_batch if batch is None else batch
    if batch is None:
        raise CheckpointError(f"{checkpoint}: no committed batch yet: there is no state to export")
    files = cp.restart_files(batch)  # the batch is committed and its state files are all there
    refuse_unreadable(f"export of {checkpoint}", [cp.root / rel for rel in files])
    refuse_damaged(cp, files, f"export of {checkpoint}")
    out = location(out)
    if isinstance(out, S3Path):
        if occupied(out):
            raise CheckpointError(f"{out}: not empty; export into a new or empty prefix")
        return cp, batch
    try:
        is_dir = stat.S_ISDIR(out.stat().st_mode)
    except FileNotFoundError:
        is_dir = None  # a new folder; its parents are checked below
    if is_dir is False:
        raise StateOpsError(f"{out}: a file, not a folder; export into a new or empty folder")
    if has_entries(out):
        raise CheckpointError(f"{out}: not empty; export into a new or empty folder")
    refuse_unwritable(f"export to {out}", write=[out / MANIFEST])
    return cp, batch


def export_state(
    spark: SparkSession, checkpoint: str, out: str | Path | S3Path, batch: int | None = None
) -> dict[str, Any]:
    """Export the state after committed ``batch`` (default: the last) to ``out``; the manifest.

    Refuses (before Spark reads anything, see :func:`check_export`) an uncommitted batch or a
    non-empty ``out``, but what an export killed there left (it is emptied and done again);
    the manifest is written last, so an export without one is incomplete.
    """
    cp, batch = check_export(checkpoint, out, batch)
    out = location(out)
    existed = isinstance(out, Path) and out.is_dir()
    begin_unfinished(out)  # a killed export's leftovers (a retry of its run) are emptied first
    try:
        manifest = _export(spark, cp, batch, out)
    except BaseException:  # no partial export left behind: the folder is as it was
        remove_all(out)
        if existed:
            out.mkdir()
        raise
    end_unfinished(out)
    return manifest


def _export(spark: SparkSession, cp: Checkpoint, batch: int, out: Path | S3Path) -> dict[str, Any]:
    entries = []
    for read in state_reads(spark, str(cp.root), batch):
        df = read_ordered_state(spark, str(cp.root), batch, read).drop("partition_id")
        folder = f"op{read['operator_id']}/{re.sub(r'[^A-Za-z0-9_.-]', '_', read['variable'])}"
        # out holds nothing, or a killed export's leftovers (check_export): emptied, but an S3
        # server with folders of its own (SeaweedFS) may still show the folder as there
        df.write.mode("overwrite").parquet(data_url(spark, out / folder))
        faults.point("export")
        rows, checksum = state_checksum(spark.read.parquet(data_url(spark, out / folder)))
        entries.append(
            {
                "operator_id": read["operator_id"],
                "operator_name": read["operator_name"],
                "variable": read["variable"],
                "kind": read["kind"],
                "path": folder,
                "schema": json.loads(df.schema.json()),
                "rows": rows,
                "checksum": checksum,
                **({"position": POSITION} if read["kind"] == "list" else {}),
            }
        )
    manifest = {
        "query_id": cp.query_id,
        "checkpoint": str(cp.root.resolve()),
        "batch_id": batch,
        "watermark": batch_watermarks(cp, batch),
        "spark_version": spark.version,
        "created_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "entries": entries,
    }
    (out / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
    return manifest
