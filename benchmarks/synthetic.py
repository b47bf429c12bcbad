"""Synthetic checkpoint trees in Spark's HDFS-provider layout, for the benchmarks.

Offsets, commits and a file-source log with valid entries (the checkpoint model parses them),
one operator with per-partition state folders, and the ``.crc`` sidecar Hadoop writes beside
each log file (a backup refuses a file its sidecar does not match). What goes into the state
files is up to the benchmark.
"""

from __future__ import annotations

import json
from pathlib import Path

from stateops.core.formats import hadoop_crc


def write_log(path: Path, text: str) -> None:
    path.write_text(text)
    (path.parent / f".{path.name}.crc").write_bytes(hadoop_crc(text.encode()))


def start_tree(root: Path, partitions: int) -> None:
    """``metadata``, the log folders, operator metadata and empty partition folders."""
    for d in ("offsets", "commits", "sources/0", "state/0/_metadata"):
        (root / d).mkdir(parents=True)
    write_log(root / "metadata", json.dumps({"id": "bench"}))
    write_log(root / "state" / "0" / "_metadata" / "metadata", "v1\n{}")
    for p in range(partitions):
        (root / "state" / "0" / str(p)).mkdir()


def write_batch_logs(root: Path, b: int) -> None:
    """Batch ``b`` planned, committed, and one file in the source log."""
    write_log(
        root / "offsets" / str(b),
        f'v1\n{{"batchWatermarkMs":0,"batchTimestampMs":{b}}}\n{{"logOffset":{b}}}',
    )
    write_log(root / "commits" / str(b), 'v1\n{"nextBatchWatermarkMs":0}')
    write_log(root / "sources" / "0" / str(b), f'v1\n{{"path":"f{b}","timestamp":0,"batchId":{b}}}')
