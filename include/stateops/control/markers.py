"""Marker files: small records that outlive a process and steer the next one. This module
reads and writes each of them; the operations call these functions, never the files.

- **stop** (``Registry.stop_marker``): asks a continuous run to stop after its current batch
  (``stateops stop``, a migration's drain); the run removes it when it stops.
- **carry-over** (``<checkpoint>.audit/carry_over.json``): carried-over state (a bootstrap's
  initial state, a transplant) awaiting the checkpoint's first batch, whose run then proves
  it. Beside the checkpoint it describes, so a start on any host sees it.
- **rollback** (``<checkpoint>.audit/rollback.json``): a rollback under way; the query refuses
  to start until a rollback run has finished it.
- **repartition** (``<checkpoint>.audit/repartition.json``): a repartition under way, with
  every file the checkpoint held before it; the query refuses to start until a repartition
  run has finished or undone it, or a rollback went back to before it.
- **retired** (``<checkpoint>.audit/retired.json``): a checkpoint no operation may write to: one a
  migration moved its query away from (``retired``), or a failed migration's new checkpoint
  set aside in place (``set aside``; S3 has no rename). Starts and every lifecycle operation
  refuse it (:func:`refuse_retired`) until ``stateops unretire`` lifts it
  (docs/migration-on-s3.md). On S3 it is the only hold (no file modes); on local disk it is
  kept with the read-only files.
- **holder** (``<checkpoint>.audit/holder.json``, S3 checkpoints): the token, operation and
  run of the process that took the query's lease last, written right after it took it. The
  driver's checkpoint file manager reads it before each log file it creates and refuses the
  write when it names another holder (``spark_jobs/java/stateops/``): Spark's own writes of a
  driver that stalled past its lease are fenced at the write.

The registry's migration switch (``stateops.core.registry.write_switch``) is the registry's
own record, kept with it.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from stateops.control.audit import audit_dir
from stateops.control.lock import LockInfo
from stateops.core import faults, fence
from stateops.core.errors import CheckpointError
from stateops.core.registry import Registry
from stateops.core.storage import S3Path

__all__ = [
    "carry_over_marker",
    "clear_carry_over",
    "clear_repartition",
    "read_repartition",
    "write_repartition",
    "clear_retired",
    "clear_rollback",
    "read_carry_over",
    "read_retired",
    "read_rollback",
    "refuse_retired",
    "retired_marker",
    "request_stop",
    "rollback_marker",
    "take_stop",
    "withdraw_stop",
    "read_record",
    "write_carry_over",
    "write_record",
    "write_retired",
    "write_rollback",
]


def write_record(path: Path | S3Path, record: dict[str, Any]) -> None:
    """Whole or not at all: a reader never sees half a record (an S3 put is atomic)."""
    if isinstance(path, S3Path):
        path.write_text(json.dumps(record, indent=2))
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(record, indent=2), encoding="utf-8")
    os.replace(tmp, path)


def _write_marker(path: Path | S3Path, record: dict[str, Any]) -> None:
    """A marker beside a checkpoint, written by an operation under the query's lease: only
    while the lease is still its own (:func:`stateops.core.fence.guard`)."""
    fence.guard()
    write_record(path, record)


def _clear_marker(path: Path | S3Path, missing_ok: bool = True) -> None:
    """A marker removed, as :func:`_write_marker` writes one."""
    fence.guard()
    path.unlink(missing_ok=missing_ok)


def read_record(path: Path | S3Path) -> dict[str, Any] | None:
    """The record (a marker) at ``path``, or None when there is none. One read, no existence
    check first: on S3 a GET that a wrong key refuses says why (SignatureDoesNotMatch), a
    HEAD only 403."""
    try:
        text = path.read_text(encoding="utf-8")
    except (FileNotFoundError, NotADirectoryError):
        return None
    try:
        return json.loads(text)
    except ValueError as err:
        raise CheckpointError(f"{path}: unreadable marker ({err}); see the audit log") from None


def request_stop(registry: Registry, name: str, holder: LockInfo) -> Path | S3Path:
    """Ask the run that holds query ``name``'s lease (``holder``: the lock it took) to stop
    after its current batch: a request addressed to that run's token, beside the lease (in
    the control store where the registry names one), so the driver sees it on whichever host
    it runs, and a later run never takes it for its own."""
    marker = registry.stop_marker(name)
    record = {"token": holder.token, "run_id": holder.run_id, "at": time.time()}
    write_record(marker, record)
    return marker


def take_stop(registry: Registry, name: str, token: str) -> bool:
    """Whether a stop is requested of the run holding lock ``token``; the request is taken
    (removed) when it is. One addressed to another run is left alone: that run may be the
    lease's holder now and this one a holder that lost it (a stale request is replaced by the
    next)."""
    marker = registry.stop_marker(name)
    try:
        record = read_record(marker)
    except CheckpointError:
        record = {}  # unreadable: nobody's
    if record is None or record.get("token") != token:
        return False
    marker.unlink(missing_ok=True)
    return True


def withdraw_stop(registry: Registry, name: str) -> bool:
    """Remove the query's stop request; True if there was one."""
    marker = registry.stop_marker(name)
    if not marker.exists():
        return False
    marker.unlink(missing_ok=True)
    return True


def carry_over_marker(checkpoint: str | os.PathLike[str]) -> Path | S3Path:
    return audit_dir(checkpoint) / "carry_over.json"


def write_carry_over(checkpoint: str | os.PathLike[str], record: dict[str, Any]) -> None:
    _write_marker(carry_over_marker(checkpoint), record)


def read_carry_over(checkpoint: str | os.PathLike[str]) -> dict[str, Any] | None:
    return read_record(carry_over_marker(checkpoint))


def clear_carry_over(checkpoint: str | os.PathLike[str]) -> None:
    """Settle the checkpoint's pending carry-over."""
    _clear_marker(carry_over_marker(checkpoint))


def rollback_marker(checkpoint: str | os.PathLike[str]) -> Path:
    return audit_dir(checkpoint) / "rollback.json"


def write_rollback(checkpoint: str | os.PathLike[str], record: dict[str, Any]) -> None:
    faults.point("marker")
    _write_marker(rollback_marker(checkpoint), record)


def read_rollback(checkpoint: str | os.PathLike[str]) -> dict[str, Any] | None:
    return read_record(rollback_marker(checkpoint))


def clear_rollback(checkpoint: str | os.PathLike[str]) -> None:
    _clear_marker(rollback_marker(checkpoint), missing_ok=False)


def _repartition_marker(checkpoint: str | os.PathLike[str]) -> Path:
    return audit_dir(checkpoint) / "repartition.json"


def write_repartition(checkpoint: str | os.PathLike[str], record: dict[str, Any]) -> None:
    faults.point("marker")
    _write_marker(_repartition_marker(checkpoint), record)


def read_repartition(checkpoint: str | os.PathLike[str]) -> dict[str, Any] | None:
    return read_record(_repartition_marker(checkpoint))


def clear_repartition(checkpoint: str | os.PathLike[str]) -> None:
    _clear_marker(_repartition_marker(checkpoint))


def holder_marker(checkpoint: str | os.PathLike[str]) -> Path | S3Path:
    return audit_dir(checkpoint) / "holder.json"


def write_holder(checkpoint: str | os.PathLike[str], holder: LockInfo) -> None:
    """Name ``holder``, who has just taken the query's lease, as the one process whose Spark
    driver may write ``checkpoint``'s logs; while the lease is still its own."""
    record = {"token": holder.token, "operation": holder.operation, "run_id": holder.run_id}
    _write_marker(holder_marker(checkpoint), record | {"at": time.time()})


def retired_marker(checkpoint: str | os.PathLike[str]) -> Path | S3Path:
    return audit_dir(checkpoint) / "retired.json"


def write_retired(checkpoint: str | os.PathLike[str], record: dict[str, Any]) -> None:
    """Hold ``checkpoint`` against every start and lifecycle operation (``record``: ``state``
    ``retired`` or ``set aside``, the query, the run id, the time, why). One put, atomic."""
    faults.point("marker")
    _write_marker(retired_marker(checkpoint), record)


def read_retired(checkpoint: str | os.PathLike[str]) -> dict[str, Any] | None:
    return read_record(retired_marker(checkpoint))


def clear_retired(checkpoint: str | os.PathLike[str]) -> bool:
    """Lift the hold; True if there was one."""
    marker = retired_marker(checkpoint)
    if not marker.exists():
        return False
    _clear_marker(marker)
    return True


def refuse_retired(checkpoint: str | os.PathLike[str]) -> None:
    """Refuse, in one line, a checkpoint under a retirement hold (:func:`write_retired`):
    what holds it and the command that lifts the hold."""
    record = read_retired(checkpoint)
    if record is None:
        return
    why = (
        f"retired by the migration of {record.get('query')} (run {record.get('run_id')}) to "
        f"{record.get('migrated_to')}"
        if record.get("state") == "retired"
        else f"set aside: the new checkpoint of the failed migration run {record.get('run_id')} "
        f"of {record.get('query')}"
    )
    raise CheckpointError(
        f"{checkpoint}: {why}, so nothing may run on it or change it; to use it again, lift "
        f"the hold: stateops unretire {checkpoint} (docs/migration-on-s3.md)"
    )
