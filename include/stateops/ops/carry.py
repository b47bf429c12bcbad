"""The initialState road of a carry-over: what it keeps of the old query, and what it cannot.

A query bootstrapped from a state export must go on computing what the old query would have
computed had it stopped at its last batch N and restarted on the new source. Two things decide
that besides the state itself (which :mod:`stateops.spark.export` exports with each list element's
position, so its order survives):

- **The watermark.** Spark drops an input row as late against the *previous* batch's
  watermark, and fires event-time timers at the current batch's. A fresh checkpoint starts at
  0 and its batch 1 still filters with batch 0's watermark, so rows the old query would have
  dropped get in, in its first two batches; and timers the old query would have fired wait
  for the new input to move the watermark. The old query, restarted, runs batch N + 1 with
  late rows filtered at batch N's watermark and timers fired at the watermark batch N's
  commit hands on (``nextBatchWatermarkMs``), and moves on from there with the new input: its
  effective watermark is max(old watermark, the new input's).
- **Where the new input starts.** Spark applies ``initialState`` with batch 0 only.

So the new checkpoint starts with an *image* of batch N (:func:`write_image_batch`): batch 0
reads no input (its source offset is void, ``-``), applies the exported state, and runs with
batch N's watermark; once it commits, its commit is given batch N's ``nextBatchWatermarkMs``
(:func:`finish_image_batch`). Batch 1 then filters late rows and fires timers exactly as the
old query's batch N + 1 would have, and Spark carries the watermark on from there by itself.
Four ways were run against a copy of the old checkpoint restarted on the same events (the
scenario of ``tests/spark/test_initial_state_road.py``: late events in the new source's first
two batches, a cutover batch that moved the watermark, a session idle since before it):
filtering the new input against the old watermark in the query dropped the late rows, but
timers still fired at the new input's watermark, so the idle session took the new input's
first event instead of closing; an image batch with only batch N's watermark did the same;
one with the watermark N handed on dropped a row that N + 1 keeps; this one (N's watermark in
the offsets, the handed-on one in the commit) gave the same state and output. Only this one
is kept, so only it is tested; the test also shows the proof failing without it.

What the road cannot give is listed by :func:`stateops.ops.transplant.carry_differences` (a
processor whose state changed, state with a TTL): the migration then refuses unless the
operator accepts it.
Pure Python; the Spark session is passed in where Spark's own values are needed.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

from stateops.core.checkpoint import Checkpoint, load_checkpoint
from stateops.core.errors import CheckpointError
from stateops.core.formats import crc_sidecar, hadoop_crc
from stateops.core.staging import has_entries
from stateops.core.storage import S3Path, location

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = [
    "finish_image_batch",
    "is_image_batch",
    "write_checkpoint_file",
    "write_image_batch",
]


def write_checkpoint_file(root: Path | S3Path, rel: str, text: str) -> None:
    """A checkpoint log file and the ``.crc`` sidecar Hadoop's local file system checks,
    each written beside itself and renamed into place (complete or absent). In S3 one put,
    atomic, and no sidecar (S3A keeps no checksum files, as Spark writes there)."""
    data = text.encode("utf-8")
    if isinstance(root, S3Path):
        (root / rel).write_bytes(data)
        return
    for name, content in ((rel, data), (crc_sidecar(rel), hadoop_crc(data))):
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.tmp")
        tmp.write_bytes(content)
        os.replace(tmp, path)


def write_image_batch(
    spark: SparkSession, checkpoint: str | os.PathLike[str], watermark: dict[str, int]
) -> bool:
    """Plan batch 0 of a new checkpoint as the image of the old query's last batch: no input
    (a void source offset), the watermark that batch ran with, this query's own settings
    (the values Spark records, read from the session that runs it). False, writing nothing,
    where batch 0 is already planned (a start after a failed one: Spark runs it again)."""
    root = location(checkpoint)
    if has_entries(root / "offsets"):
        return False
    if _names(root) - {"offsets"}:
        raise CheckpointError(f"{root}: not a new checkpoint; bootstrap into a new one")
    # Which settings a batch records is Spark's (OffsetSeqMetadata); their values, the session's.
    metadata = spark._jvm.org.apache.spark.sql.execution.streaming.checkpointing.OffsetSeqMetadata
    keys = json.loads(metadata.apply(0, 0, spark._jsparkSession.conf()).json())["conf"]
    conf = {key: spark.conf.get(key) for key in keys}
    meta = {
        "batchWatermarkMs": int(watermark["batch_watermark_ms"]),
        "batchTimestampMs": int(time.time() * 1000),
        "conf": {k: v for k, v in conf.items() if v is not None},
    }
    write_checkpoint_file(root, "metadata", json.dumps({"id": str(uuid.uuid4())}))
    write_checkpoint_file(root, "offsets/0", "\n".join(["v1", json.dumps(meta), "-"]))
    return True


def _names(root: Path | S3Path) -> set[str]:
    """What is right in a checkpoint folder or prefix (nothing where it does not exist)."""
    if isinstance(root, S3Path):
        return root.top_level()
    return {p.name for p in root.iterdir()} if root.is_dir() else set()


def finish_image_batch(checkpoint: str | os.PathLike[str], origin: dict[str, Any]) -> bool:
    """Once the image batch 0 has committed, and before batch 1 is planned: its commit hands
    on the watermark the old batch's did (``origin["watermark"]``), and, where the query reads
    the old query's own sources (``origin["positions"]``: a code upgrade), batch 0 takes the
    old batch's source positions and logs (:func:`_carry_positions`). True if it changed the
    checkpoint."""
    cp = load_checkpoint(checkpoint)
    if 0 not in cp.commits or 1 in cp.offsets:
        return False
    changed = False
    if origin.get("positions"):
        changed = _carry_positions(cp, load_checkpoint(origin["checkpoint"]), origin["batch"])
    wanted = int(origin["watermark"]["next_batch_watermark_ms"])
    if int(cp.commits[0].get("nextBatchWatermarkMs", 0) or 0) >= wanted:
        return changed
    text = (cp.root / "commits/0").read_text("utf-8")
    header = text.split("\n")[0]
    commit = {**cp.commits[0], "nextBatchWatermarkMs": wanted}
    write_checkpoint_file(cp.root, "commits/0", f"{header}\n{json.dumps(commit)}")
    return True


def _carry_positions(cp: Checkpoint, old: Checkpoint, batch: int) -> bool:
    """Batch 0 of ``cp`` (an image batch, which read nothing) as far into the sources as
    ``old``'s ``batch``: its offsets entry takes that batch's source offsets, and each
    source's log up to it is copied (a file source's list of files read, which the next
    batch skips). The offsets entry is written last: a stop before it leaves batch 0 as it
    was, and the next start does it again. False where it was done already."""
    header, meta, current = _offsets(cp.root, 0)
    positions = _offsets(old.root, batch)[2]
    if len(current) != len(positions):
        raise CheckpointError(
            f"{cp.root}: batch 0 reads {len(current)} sources, {old.root} "
            f"{len(positions)}: their positions cannot be carried"
        )
    if current == positions:
        return False
    for rel in old.restart_files(batch):
        if rel.startswith("sources/") and not rel.endswith(".crc"):
            write_checkpoint_file(cp.root, rel, (old.root / rel).read_text("utf-8"))
    write_checkpoint_file(cp.root, "offsets/0", "\n".join([header, meta, *positions]))
    return True


def _offsets(root: Path | S3Path, batch: int) -> tuple[str, str, list[str]]:
    """``offsets/<batch>`` of the checkpoint at ``root``: its version line, its metadata line
    and the source offsets the batch planned, one line each."""
    header, meta, *lines = (root / f"offsets/{batch}").read_text("utf-8").split("\n")
    return header, meta, [line for line in lines if line.strip()]


def is_image_batch(checkpoint: str | os.PathLike[str], origin: dict[str, Any]) -> bool:
    """Whether batch 0 of ``checkpoint`` is the image of ``origin``'s batch, which reads
    nothing: its source offsets are void, as :func:`write_image_batch` plans them, or, where
    the old query's positions were carried (a code upgrade), that batch's own. A batch 0 that
    Spark planned on the sources (a road that wrote no image) is not: the proof then reads
    its input."""
    root = location(checkpoint)
    current = _offsets(root, 0)[2]
    if all(line == "-" for line in current):
        return True
    return (
        bool(origin.get("positions"))
        and current == (_offsets(location(origin["checkpoint"]), int(origin["batch"]))[2])
    )
