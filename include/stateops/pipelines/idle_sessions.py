"""Per user, the events of the current visit, closed by an event-time timeout: a registry
``transform`` with Spark's ``applyInPandasWithState`` (group state, not a processor).

The group state holds the visit's first and last event times and its event count; its
timeout is the last event time plus ``idle_seconds``. On timeout the visit is emitted as
closed and its state removed: a visit whose state outlives its timeout is a leak, which the
expectations' expiry check (``timeout_column: value_timeoutTimestamp``) finds.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from typing import Any

import pandas as pd

__all__ = ["OUTPUT_SCHEMA", "STATE_SCHEMA", "build", "visit_row", "visits"]

OUTPUT_SCHEMA = (
    "user_id STRING, visit_start TIMESTAMP, visit_end TIMESTAMP, events LONG, open BOOLEAN"
)
STATE_SCHEMA = "first_ms LONG, last_ms LONG, events LONG"


def visits(
    key: tuple, frames: Iterator[pd.DataFrame], state: Any, idle_ms: int
) -> Iterator[pd.DataFrame]:
    """One row per call: the user's visit so far (open) or the visit that timed out."""
    if state.hasTimedOut:
        first_ms, last_ms, events = state.get
        state.remove()
        yield visit_row(key[0], first_ms, last_ms, events, is_open=False)
        return
    times = pd.concat([f["event_time"] for f in frames])
    ms = times.astype("datetime64[ms]").astype("int64")
    first_ms, last_ms, events = state.get if state.exists else (int(ms.min()), 0, 0)
    last_ms = max(last_ms, int(ms.max()))
    events += len(ms)
    state.update((first_ms, last_ms, events))
    state.setTimeoutTimestamp(max(last_ms, state.getCurrentWatermarkMs()) + idle_ms)
    yield visit_row(key[0], first_ms, last_ms, events, is_open=True)


def visit_row(user: str, first_ms: int, last_ms: int, events: int, is_open: bool) -> pd.DataFrame:
    return pd.DataFrame(
        {
            "user_id": [user],
            "visit_start": [pd.Timestamp(first_ms, unit="ms")],
            "visit_end": [pd.Timestamp(last_ms, unit="ms")],
            "events": [events],
            "open": [is_open],
        }
    )


def build(
    spark: Any, inputs: dict[str, Any], idle_seconds: int = 1800, delay: str = "5 minutes"
) -> Any:
    """``inputs["source"]``: user events (``user_id``, ``event_time``)."""
    from pyspark.sql.streaming.state import GroupStateTimeout

    if idle_seconds <= 0:
        raise ValueError("idle_seconds must be positive")
    events = inputs["source"].withWatermark("event_time", delay)
    return events.groupBy("user_id").applyInPandasWithState(
        functools.partial(visits, idle_ms=idle_seconds * 1000),
        outputStructType=OUTPUT_SCHEMA,
        stateStructType=STATE_SCHEMA,
        outputMode="Update",
        timeoutConf=GroupStateTimeout.EventTimeTimeout,
    )
