"""A query's figures over time (issue 57, item 3): what each of its runs and each health check
saw, for `stateops status --history`, the Streaming state view's chart, Airflow's metrics and
the state growth rule (``health.state_rows_per_hour``, ``health.state_bytes_per_hour``).

A point is one JSON line in a file per UTC day, in the folder :meth:`Registry.history_path`
names (beside the query's lease: the control store on a fleet, where a run's driver and the
health DAG's task write from any host):

- a run's (``source: run``, written by the run's driver when it ends): the last committed
  batch, the input rows it read, its batches' mean duration, and the state's rows and bytes
  in memory per operator as Spark reported them after its last batch;
- a health check's (``source: check``, stream_health): the last committed batch, the Kafka
  sources' lag in records, how long records have waited since the last commit, and the bytes
  of the state's files in the checkpoint.

A point is appended: a local file in append mode; an S3 object read and written again only
over the version read (a conditional write, as the lease's), again when another writer came
first. The writer deletes the days older than ``health.keep_history``. A line that cannot be
read (a writer that died in the middle of a local append) is left out.
"""

from __future__ import annotations

import json
import random
import time
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any

from stateops.control.lock import require_conditional_writes
from stateops.core.errors import StateOpsError
from stateops.core.registry import HealthLimits, Registry
from stateops.core.report import format_bytes
from stateops.core.storage import S3Path, file_names
from stateops.core.times import format_span

__all__ = [
    "RUN_FIGURES",
    "check_point",
    "format_history",
    "growth",
    "read_history",
    "record",
    "run_point",
]

_ATTEMPTS = 50  # conditional writes lost to other writers before giving up
_SUFFIX = ".jsonl"


def run_point(summary: dict[str, Any], now: datetime | None = None) -> dict[str, Any]:
    """The point of a run that ended (its summary, :func:`stateops.ops.start.run_start`)."""
    operators = [
        {
            "operator": o["operator"],
            "name": o["operator_name"],
            "rows": o["state_rows"],
            "bytes": o["memory_used_bytes"],
        }
        for o in summary.get("state_operators") or []
    ]
    return {
        "at": _iso(now),
        "source": "run",
        "operation": summary.get("operation"),
        "run_id": summary.get("run_id"),
        "status": summary.get("status"),
        "batch": summary.get("last_committed_batch"),
        "input_rows": summary.get("input_rows"),
        "batch_seconds": summary.get("batch_seconds"),
        "state_rows": _total(o["rows"] for o in operators),
        "state_bytes": _total(o["bytes"] for o in operators),
        "operators": operators,
    }


RUN_FIGURES = ("state_rows", "state_bytes", "input_rows", "batch_seconds")
"""A run's figures that stand for the query until its next run (its status's last run)."""


def check_point(status: dict[str, Any], now: datetime | None = None) -> dict[str, Any]:
    """The point of a health check: what :func:`stateops.status.query_status` read."""
    now = now or datetime.now(UTC)
    lags = [
        p["lag_total"]
        for p in status["positions"]
        if p["lag_total"] is not None and p["lag_unit"] == "records"
    ]
    lag = sum(lags) if lags else None
    committed = status["committed_at"]
    waiting = None
    if lag is not None:
        since = now - datetime.fromisoformat(committed) if lag and committed else timedelta()
        waiting = round(since.total_seconds())
    return {
        "at": _iso(now),
        "source": "check",
        "verdict": status["health"]["verdict"],
        "batch": status["last_committed_batch"],
        "lag_records": lag,
        "waiting_seconds": waiting,
        "checkpoint_bytes": _total(op["bytes"] for op in status["operators"]),
    }


def record(registry: Registry, name: str, point: dict[str, Any]) -> None:
    """Append ``point`` to query ``name``'s history; with a day's first point, delete the days
    older than the query's ``health.keep_history``."""
    folder = registry.history_path(name)
    day = datetime.fromisoformat(point["at"]).date()
    line = (json.dumps(point, separators=(",", ":")) + "\n").encode()
    target = folder / f"{day.isoformat()}{_SUFFIX}"
    if isinstance(target, S3Path):
        first = _append_s3(target, line)
    else:
        target.parent.mkdir(parents=True, exist_ok=True)
        first = not target.exists()
        with open(target, "ab") as out:  # one write of one line: appends do not interleave
            out.write(line)
    if not first:  # the older days were pruned with this day's first point
        return
    keep = registry.health_limits(registry.query(name)).keep_history
    for file, kept in _days(folder):
        if kept < day - keep:
            (folder / file).unlink(missing_ok=True)


def _append_s3(target: S3Path, line: bytes) -> bool:
    """The lease's way (:func:`stateops.control.lock._change`): on a store that honours
    conditional writes, over the version read, again after a short random pause when another
    writer came first. True: the object is new."""
    require_conditional_writes(target)
    for _ in range(_ATTEMPTS):
        data, version, _ = target.read_versioned()
        if target.write_own((data or b"") + line, version):
            return data is None
        time.sleep(random.uniform(0.01, 0.1))
    raise StateOpsError(
        f"{target}: {_ATTEMPTS} other writers came first; the point was not recorded"
    )


def read_history(registry: Registry, name: str, since: datetime) -> list[dict[str, Any]]:
    """Query ``name``'s points since ``since``, oldest first."""
    folder = registry.history_path(name)
    points = []
    for file, day in _days(folder):
        if day < since.date():
            continue
        try:
            text = (folder / file).read_text(encoding="utf-8")
        except FileNotFoundError:  # deleted by a writer since the listing
            continue
        for line in text.splitlines():
            try:
                point = json.loads(line)
                at = datetime.fromisoformat(point["at"])
            except (ValueError, KeyError, TypeError):
                continue
            if at >= since:
                points.append(point)
    return sorted(points, key=lambda p: p["at"])


def _days(folder: Path | S3Path) -> list[tuple[str, date]]:
    """The day files in ``folder`` (name, day), oldest first."""
    days = []
    for file in file_names(folder):
        if not file.endswith(_SUFFIX):
            continue
        try:
            days.append((file, date.fromisoformat(file.removesuffix(_SUFFIX))))
        except ValueError:  # not one of ours
            continue
    return sorted(days, key=lambda d: d[1])


_GROWTH = (
    ("state_rows", "rows", "state_rows_per_hour"),
    ("state_bytes", "bytes", "state_bytes_per_hour"),
)


def growth(
    name: str, points: list[dict[str, Any]], limits: HealthLimits, now: datetime
) -> list[str]:
    """The state growth rule: the query's state (its runs' rows, or bytes) grew faster than
    its limit an hour, from the first run in ``limits.growth_window`` to the last."""
    start = now - limits.growth_window
    reasons = []
    for field, unit, setting in _GROWTH:
        limit = getattr(limits, setting)
        seen = [
            (datetime.fromisoformat(p["at"]), p[field])
            for p in points
            if p["source"] == "run" and p.get(field) is not None
        ]
        seen = [(at, v) for at, v in seen if at >= start]
        if not limit or len(seen) < 2:
            continue
        (first_at, first), (last_at, last) = seen[0], seen[-1]
        hours = (last_at - first_at).total_seconds() / 3600
        if hours <= 0 or last <= first or (last - first) / hours <= limit:
            continue
        shown = format_bytes if unit == "bytes" else str
        span = format_span(last_at - first_at)
        reasons.append(
            f"state {unit} grew from {shown(first)} to {shown(last)} in {span}"
            f" ({len(seen)} runs): {(last - first) / hours:,.0f} {unit} an hour, more than "
            f"health.{setting} ({limit:,}): state that is never removed (expired entries "
            f"kept?); stateops status {name} --history shows it"
        )
    return reasons


_COLUMNS = (
    ("time", 20, lambda p: p["at"][:19].replace("T", " ")),
    ("source", 6, lambda p: p["source"]),
    ("batch", 6, lambda p: p["batch"]),
    ("state rows", 11, lambda p: p.get("state_rows")),
    ("state bytes", 11, lambda p: _bytes(p.get("state_bytes"))),
    ("input rows", 10, lambda p: p.get("input_rows")),
    ("batch s", 8, lambda p: p.get("batch_seconds")),
    ("lag", 8, lambda p: p.get("lag_records")),
    ("waiting s", 9, lambda p: p.get("waiting_seconds")),
    ("files", 10, lambda p: _bytes(p.get("checkpoint_bytes"))),
)


def format_history(points: list[dict[str, Any]]) -> list[str]:
    """The points as the lines of a table, oldest first (`stateops status --history`)."""
    if not points:
        return ["  history         none recorded yet (its runs and health checks record it)"]
    rows = [[title for title, _, _ in _COLUMNS]] + [
        ["-" if (v := get(p)) is None else str(v) for _, _, get in _COLUMNS] for p in points
    ]
    return [f"  history         {len(points)} points, oldest first"] + [
        "    " + " ".join(c.ljust(w) for c, (_, w, _) in zip(r, _COLUMNS, strict=True)).rstrip()
        for r in rows
    ]


def _total(values: Any) -> int | None:
    values = list(values)
    return None if not values or None in values else sum(values)


def _bytes(n: int | None) -> str | None:
    return None if n is None else format_bytes(n)


def _iso(now: datetime | None) -> str:
    return (now or datetime.now(UTC)).isoformat(timespec="seconds")
