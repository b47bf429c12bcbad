"""Deterministic sample events for the reference pipelines (JSON landing folders)."""

from __future__ import annotations

import json
import random
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from pathlib import Path

__all__ = ["DATASETS", "generate_events", "generate_initial_pages"]

DATASETS = ("user_sessions", "page_visits")

EPOCH = datetime(2026, 1, 1, tzinfo=UTC)
PAGES = ["home", "search", "product", "cart", "checkout", "help", "account", "blog"]


def _ts(t: datetime) -> str:
    return t.strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def generate_events(
    landing: Mapping[str, str | Path],
    *,
    events_per_file: int = 250,
    users: int = 50,
    files: int = 4,
    seed: int = 7,
    round_: int = 0,
    minutes_per_round: int = 120,
) -> dict[str, list[Path]]:
    """Write ``files`` JSON files of ``events_per_file`` events each into the landing folders.

    ``landing`` maps ``user_sessions`` and/or ``page_visits`` to a folder (a query's
    ``source.path``); both datasets come from the same users and times. Same arguments, same
    bytes. Round ``r`` covers event times ``[r, r + 1) * minutes_per_round``
    after 2026-01-01, so later rounds move event time (and the watermark) forward. Returns the
    written paths per landing folder (``user_sessions``, ``page_visits``).
    """
    unknown = set(landing) - set(DATASETS)
    if unknown:
        raise ValueError(f"no sample data for {sorted(unknown)}; known: {list(DATASETS)}")
    if events_per_file < 1 or users < 1 or files < 1:
        raise ValueError("events_per_file, users and files must be at least 1")
    rng = random.Random(f"{seed}-{round_}")
    start = EPOCH + timedelta(minutes=round_ * minutes_per_round)
    span_ms = minutes_per_round * 60_000
    written: dict[str, list[Path]] = {name: [] for name in landing}
    for folder in landing.values():
        Path(folder).mkdir(parents=True, exist_ok=True)
    per_file = events_per_file
    for f in range(files):
        lo = span_ms * f // files
        hi = span_ms * (f + 1) // files
        rows = sorted(
            (start + timedelta(milliseconds=rng.randrange(lo, hi)), f"u{rng.randrange(users):05d}")
            for _ in range(per_file)
        )
        sessions = [
            {
                "user_id": user,
                "data": f"e{round_}-{f}-{i}",
                "is_last": rng.random() < 0.15,
                "event_time": _ts(t),
            }
            for i, (t, user) in enumerate(rows)
        ]
        visits = [
            {"user_id": user, "page": rng.choice(PAGES), "event_time": _ts(t)} for t, user in rows
        ]
        for name, records in (("user_sessions", sessions), ("page_visits", visits)):
            if name not in landing:
                continue
            path = Path(landing[name]) / f"events-r{round_:03d}-{f:04d}.json"
            path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
            written[name].append(path)
    return written


def generate_initial_pages(path: str | Path, *, users: int = 50, seed: int = 7) -> Path:
    """A page_visits initial state (JSON lines): pages each user visited before 2026."""
    rng = random.Random(f"{seed}-initial")
    rows = []
    for u in range(users):
        for i in range(rng.randrange(1, 4)):
            visited = EPOCH - timedelta(days=1, minutes=rng.randrange(24 * 60) - i)
            rows.append(
                {"user_id": f"u{u:05d}", "page": rng.choice(PAGES), "visited_at": _ts(visited)}
            )
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path
