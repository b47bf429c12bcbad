"""Sessionisation: a user's events accumulate until an ``is_last`` event or a timeout."""

from __future__ import annotations

from collections.abc import Iterator

import pandas as pd
from pyspark.sql.streaming.stateful_processor import (
    ExpiredTimerInfo,
    StatefulProcessor,
    StatefulProcessorHandle,
    TimerValues,
)

from stateops.pipelines.carried import CarriedList

__all__ = ["INPUT_SCHEMA", "OUTPUT_SCHEMA", "UserSessionsProcessor"]

INPUT_SCHEMA = "user_id STRING, data STRING, is_last BOOLEAN, event_time TIMESTAMP"
OUTPUT_SCHEMA = (
    "user_id STRING, session_start TIMESTAMP, session_end TIMESTAMP, "
    "num_events INT, data STRING, closed_by STRING"
)
EVENTS_SCHEMA = "data STRING, event_time TIMESTAMP"
_OUTPUT_COLUMNS = ["user_id", "session_start", "session_end", "num_events", "data", "closed_by"]


class UserSessionsProcessor(StatefulProcessor):
    """Open sessions live in list state ``events``; an event-time timer closes idle sessions.

    Runs in ``EventTime`` time mode: with processing-time timers an ``availableNow`` run never
    ends (see FACTS.md), and event time makes reprocessing deterministic.
    """

    def __init__(self, session_timeout_seconds: int = 1800) -> None:
        if session_timeout_seconds <= 0:
            raise ValueError("session_timeout_seconds must be positive")
        self.timeout_ms = int(session_timeout_seconds) * 1000

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.handle = handle
        self.events = handle.getListState("events", EVENTS_SCHEMA)
        self.carried = CarriedList(fallback_order=["event_time", "data"])

    def handleInitialState(
        self, key: tuple, initialState: pd.DataFrame, timerValues: TimerValues
    ) -> None:
        """Open sessions carried over (a migration, a bootstrap from an export): the events in
        the order the session received them, and the timer that closes the session
        ``session_timeout_seconds`` after its last one."""
        self._keep_open(self.carried.rows(key, initialState, ["data", "event_time"]))

    def _keep_open(self, open_events: list[tuple]) -> None:
        for timer in list(self.handle.listTimers()):
            self.handle.deleteTimer(timer)
        if open_events:
            self.events.put(open_events)
            last_ms = max(_to_ms(t) for _, t in open_events)
            self.handle.registerTimer(last_ms + self.timeout_ms)
        else:
            self.events.clear()

    def handleInputRows(
        self, key: tuple, rows: Iterator[pd.DataFrame], timerValues: TimerValues
    ) -> Iterator[pd.DataFrame]:
        (user_id,) = key
        incoming = pd.concat(list(rows), ignore_index=True).sort_values(
            ["event_time", "data"], kind="stable"
        )
        open_events = [(d, t) for d, t in self.events.get()]
        closed = []
        for data, is_last, event_time in zip(
            incoming["data"], incoming["is_last"], incoming["event_time"], strict=True
        ):
            open_events.append((data, event_time))
            if bool(is_last):
                closed.append(_session_row(user_id, open_events, "last"))
                open_events = []
        self._keep_open(open_events)
        if closed:
            yield pd.DataFrame(closed, columns=_OUTPUT_COLUMNS)

    def handleExpiredTimer(
        self, key: tuple, timerValues: TimerValues, expiredTimerInfo: ExpiredTimerInfo
    ) -> Iterator[pd.DataFrame]:
        (user_id,) = key
        open_events = [(d, t) for d, t in self.events.get()]
        self.events.clear()
        if open_events:
            yield pd.DataFrame(
                [_session_row(user_id, open_events, "timeout")], columns=_OUTPUT_COLUMNS
            )

    def close(self) -> None:
        pass


def _to_ms(ts: pd.Timestamp) -> int:
    return int(pd.Timestamp(ts).value // 1_000_000)


def _session_row(user_id: str, events: list[tuple], closed_by: str) -> tuple:
    times = [pd.Timestamp(t) for _, t in events]
    return (
        user_id,
        min(times),
        max(times),
        len(events),
        "|".join(str(d) for d, _ in events),
        closed_by,
    )
