"""On-call backfill: where to roll back to, the registry a reprocessing runs with, and what
the reprocessing changed in the output.

The steps themselves (backup, rollback, reprocess with ``available-now``, integrity checks)
are the library's own operations; the ``stream_backfill`` DAG runs them in order.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from datetime import datetime
from pathlib import Path
from typing import Any

from stateops.checkpoint import load_checkpoint
from stateops.errors import CheckpointError, RegistryError, StateOpsError
from stateops.registry import Registry, derived_registry
from stateops.times import parse_past_time, parse_time  # re-exported: older callers

__all__ = [
    "OVERRIDABLE",
    "diff_output",
    "last_batch_before",
    "parse_past_time",
    "parse_time",
    "registry_with_overrides",
]

# What a backfill may change about a query: its logic and checks, never where its data is.
OVERRIDABLE = ("processor", "watermark", "expectations", "spark_conf")


def last_batch_before(checkpoint: str | os.PathLike[str], before: datetime, source: int = 0) -> int:
    """The last committed batch whose input, and all earlier batches' input, is older than
    ``before``: the batch before the first one that read a file modified at or after it
    (file times as the file source logged them)."""
    cp = load_checkpoint(checkpoint)
    committed = sorted(cp.commits)
    if not committed:
        raise CheckpointError(f"{cp.root}: no committed batch yet: nothing to reprocess")
    limit_ms = before.timestamp() * 1000
    previous = None
    for batch in committed:
        if cp.file_log_offset(batch, source) is None:
            raise StateOpsError(
                f"{cp.root}: source {source} is not a file source, so its input has no file "
                "times; roll back to a batch id instead"
            )
        if any(f["timestamp"] >= limit_ms for f in cp.input_files(batch, source)):
            if previous is None:
                raise CheckpointError(
                    f"{cp.root}: batch {batch}, the oldest one kept, already read input from "
                    f"{before.isoformat()} or later; restore an older backup to go further back"
                )
            return previous
        previous = batch
    raise StateOpsError(
        f"{cp.root}: every committed batch (up to {committed[-1]}) read only input older than "
        f"{before.isoformat()}: nothing to reprocess"
    )


def registry_with_overrides(
    registry: Registry, query: str, overrides: dict[str, Any], dest: str | os.PathLike[str]
) -> Path:
    """Write a registry for reprocessing ``query`` with ``overrides`` merged into its entry
    (only its logic and checks change: the same checkpoint, sink, lock and run summary)."""
    current = registry.query(query).model_dump(by_alias=True)  # refuses an unknown name
    unknown = sorted(set(overrides) - set(OVERRIDABLE))
    if unknown:
        raise RegistryError(
            f"overrides: {', '.join(unknown)} cannot be changed by a backfill (only "
            f"{', '.join(OVERRIDABLE)}): the checkpoint, source and sink stay where they are"
        )
    changes = {k: _merged(current[k], v) for k, v in overrides.items()}
    try:
        return derived_registry(registry, query, changes, dest)
    except RegistryError as err:
        raise RegistryError(f"overrides: {err}") from None


def _merged(base: Any, override: Any) -> Any:
    if isinstance(base, dict) and isinstance(override, dict):
        return {**base, **{k: _merged(base.get(k), v) for k, v in override.items()}}
    return override


def diff_output(
    sink: str | os.PathLike[str],
    rolled_back: str | os.PathLike[str],
    after_batch: int,
    key_columns: list[str],
) -> dict[str, Any]:
    """What reprocessing changed: the output moved aside by the rollback (``rolled_back``,
    its ``batch_id=K`` folders) against the new ``batch_id=K`` folders after ``after_batch``.

    Rows are compared as multisets (batch ids may differ between the runs). A key with rows
    removed and rows added is *changed*; other rows are *added* or *removed*.
    """
    before = _rows(Path(rolled_back), lambda k: True)
    after = _rows(Path(sink), lambda k: k > after_batch)
    added, removed = after["rows"] - before["rows"], before["rows"] - after["rows"]

    def key(row: tuple) -> tuple:
        values = dict(row)
        return tuple(values.get(c) for c in key_columns)

    changed = {key(r) for r in added} & {key(r) for r in removed}
    examples = []
    for k in sorted(changed, key=repr)[:3]:
        was = [_text(r) for r in removed if key(r) == k]
        now = [_text(r) for r in added if key(r) == k]
        examples.append(f"{dict(zip(key_columns, k, strict=True))}: {was} -> {now}")
    return {
        "batches_before": before["batches"],
        "batches_after": after["batches"],
        "rows_before": before["rows"].total(),
        "rows_after": after["rows"].total(),
        "unchanged": (before["rows"] & after["rows"]).total(),
        "added": sum(n for r, n in added.items() if key(r) not in changed),
        "removed": sum(n for r, n in removed.items() if key(r) not in changed),
        "changed_keys": len(changed),
        "examples": examples,
    }


def _text(row: tuple) -> str:
    return ", ".join(f"{k}={v}" for k, v in row)


def _rows(folder: Path, wanted) -> dict[str, Any]:
    rows: Counter = Counter()
    batches = []
    for batch_dir in folder.glob("batch_id=*"):
        batch = int(batch_dir.name.split("=", 1)[1])
        if not wanted(batch):
            continue
        batches.append(batch)
        rows.update(_frozen(r) for r in _read_batch(batch_dir))
    return {"rows": rows, "batches": sorted(batches)}


def _read_batch(batch_dir: Path) -> list[dict]:
    parquet = sorted(batch_dir.glob("*.parquet"))
    if parquet:
        import pyarrow.parquet as pq

        return [r for part in parquet for r in pq.read_table(part).to_pylist()]
    return [
        json.loads(line)
        for part in sorted(batch_dir.glob("*.json"))
        for line in part.read_text(encoding="utf-8").splitlines()
        if line.strip()
    ]


def _frozen(value: Any) -> Any:
    """A hashable copy of a row (dicts as sorted item tuples, lists as tuples)."""
    if isinstance(value, dict):
        return tuple(sorted((k, _frozen(v)) for k, v in value.items()))
    if isinstance(value, list):
        return tuple(_frozen(v) for v in value)
    return value
