"""Append-only audit log beside each checkpoint: ``<checkpoint>.audit/audit.jsonl``; for a
checkpoint in S3, which has no appends, one object per record under ``<checkpoint>.audit/records/``.

Beside, not inside: Spark owns the checkpoint folder, and a backup of it must hold state only.
"""

from __future__ import annotations

import getpass
import json
import os
import socket
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from stateops.core import faults
from stateops.core.storage import S3Path, file_names, location

__all__ = ["append_audit", "audit_dir", "read_audit"]


def audit_dir(checkpoint: str | os.PathLike[str] | S3Path) -> Path | S3Path:
    """``<checkpoint>.audit``: a folder, or for a checkpoint in S3 a prefix beside it."""
    path = location(checkpoint)
    return path.with_name(path.name + ".audit")


def append_audit(
    checkpoint: str | os.PathLike[str],
    operation: str,
    *,
    run_id: str,
    result: str,
    batch_before: int | None = None,
    batch_after: int | None = None,
    **details: Any,
) -> dict[str, Any]:
    """Append one record (one JSON line, fsynced) and return it."""
    faults.point("audit")
    record = {
        "time": datetime.now(UTC).isoformat(timespec="seconds"),
        "operation": operation,
        "run_id": run_id,
        "by": f"{getpass.getuser()}@{socket.gethostname()}",
        "batch_before": batch_before,
        "batch_after": batch_after,
        "result": result,
        **details,
    }
    directory = audit_dir(checkpoint)
    line = (json.dumps(record, sort_keys=True, default=str) + "\n").encode("utf-8")
    if isinstance(directory, S3Path):  # no appends in S3: one object per record, in time order
        stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S.%fZ")
        (directory / "records" / f"{stamp}-{uuid.uuid4().hex[:8]}.json").write_bytes(line)
        return record
    directory.mkdir(parents=True, exist_ok=True)
    fd = os.open(directory / "audit.jsonl", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.write(fd, line)
        os.fsync(fd)
    finally:
        os.close(fd)
    return record


def read_audit(checkpoint: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """All records, oldest first; a torn last line (a crash mid-write) is skipped."""
    directory = audit_dir(checkpoint)
    if isinstance(directory, S3Path):
        folder = directory / "records"
        lines = [(folder / name).read_text() for name in sorted(file_names(folder))]
    else:
        path = directory / "audit.jsonl"
        lines = path.read_text(encoding="utf-8").splitlines() if path.exists() else []
    records = []
    for line in lines:
        try:
            records.append(json.loads(line))
        except ValueError:
            continue
    return records
