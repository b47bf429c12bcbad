"""Marker files: small records that outlive a process and steer the next one. This module
reads and writes each of them; the operations call these functions, never the files.

- **stop** (``Registry.stop_marker``): asks a continuous run to stop after its current batch
  (``stateops stop``, a migration's drain); the run removes it when it stops.
- **carry-over** (``Registry.bootstrap_marker``): carried-over state (a bootstrap's initial
  state, a transplant) awaiting its first batch, whose run then proves it.
- **rollback** (``<checkpoint>.audit/rollback.json``): a rollback under way; the query refuses
  to start until a rollback run has finished it.
- **repartition** (``<checkpoint>.audit/repartition.json``): a repartition under way, with
  every file the checkpoint held before it; the query refuses to start until a repartition
  run has finished or undone it, or a rollback went back to before it.

The registry's migration switch (``stateops.core.registry.write_switch``) is the registry's
own record, kept with it.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from stateops.control import faults
from stateops.control.audit import audit_dir
from stateops.core.errors import CheckpointError
from stateops.core.registry import Registry
from stateops.core.storage import S3Path

__all__ = [
    "clear_carry_over",
    "clear_repartition",
    "read_repartition",
    "write_repartition",
    "clear_rollback",
    "read_carry_over",
    "read_rollback",
    "request_stop",
    "rollback_marker",
    "stop_requested",
    "withdraw_stop",
    "write_carry_over",
    "write_rollback",
]


def _write_json(path: Path | S3Path, record: dict[str, Any]) -> None:
    """Whole or not at all: a reader never sees half a record (an S3 put is atomic)."""
    if isinstance(path, S3Path):
        path.write_text(json.dumps(record, indent=2))
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(record, indent=2), encoding="utf-8")
    os.replace(tmp, path)


def _read_json(path: Path | S3Path) -> dict[str, Any] | None:
    if not path.exists():
        return None
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except ValueError as err:
        raise CheckpointError(f"{path}: unreadable marker ({err}); see the audit log") from None


def request_stop(registry: Registry, name: str) -> Path:
    marker = registry.stop_marker(name)
    marker.parent.mkdir(parents=True, exist_ok=True)
    marker.touch()
    return marker


def stop_requested(registry: Registry, name: str) -> bool:
    return registry.stop_marker(name).exists()


def withdraw_stop(registry: Registry, name: str) -> bool:
    """Remove the query's stop request; True if there was one."""
    try:
        registry.stop_marker(name).unlink()
    except FileNotFoundError:
        return False
    return True


def write_carry_over(registry: Registry, name: str, record: dict[str, Any]) -> None:
    _write_json(registry.bootstrap_marker(name), record)


def read_carry_over(registry: Registry, name: str) -> dict[str, Any] | None:
    return _read_json(registry.bootstrap_marker(name))


def clear_carry_over(registry: Registry, name: str, checkpoint: str | None = None) -> None:
    """Settle the query's pending carry-over (only the one on ``checkpoint``, if given)."""
    record = read_carry_over(registry, name)
    if record is not None and checkpoint in (None, record.get("checkpoint")):
        registry.bootstrap_marker(name).unlink(missing_ok=True)


def rollback_marker(checkpoint: str | os.PathLike[str]) -> Path:
    return audit_dir(checkpoint) / "rollback.json"


def write_rollback(checkpoint: str | os.PathLike[str], record: dict[str, Any]) -> None:
    faults.point("marker")
    _write_json(rollback_marker(checkpoint), record)


def read_rollback(checkpoint: str | os.PathLike[str]) -> dict[str, Any] | None:
    return _read_json(rollback_marker(checkpoint))


def clear_rollback(checkpoint: str | os.PathLike[str]) -> None:
    rollback_marker(checkpoint).unlink()


def _repartition_marker(checkpoint: str | os.PathLike[str]) -> Path:
    return audit_dir(checkpoint) / "repartition.json"


def write_repartition(checkpoint: str | os.PathLike[str], record: dict[str, Any]) -> None:
    faults.point("marker")
    _write_json(_repartition_marker(checkpoint), record)


def read_repartition(checkpoint: str | os.PathLike[str]) -> dict[str, Any] | None:
    return _read_json(_repartition_marker(checkpoint))


def clear_repartition(checkpoint: str | os.PathLike[str]) -> None:
    _repartition_marker(checkpoint).unlink(missing_ok=True)
