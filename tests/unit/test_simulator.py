"""The in-memory micro-batch runtime behind the carry-over proof (no JVM)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from stateops.core.errors import StateOpsError
from stateops.pipelines.page_visits import PageVisitsProcessor
from stateops.pipelines.user_sessions import UserSessionsProcessor
from stateops.spark.simulator import simulate_batch

pytestmark = pytest.mark.unit

T = pd.Timestamp


def _visits(*rows):
    return pd.DataFrame(rows, columns=["user_id", "page", "event_time"])


def test_initial_state_comes_before_the_batch_input_per_key():
    initial = pd.DataFrame(
        [
            ("a", "cart", T("2025-12-31 11:00")),
            ("a", "home", T("2025-12-31 10:00")),
            ("z", "help", T("2025-12-29 08:00")),
        ],
        columns=["user_id", "page", "visited_at"],
    )
    state = simulate_batch(
        PageVisitsProcessor(),
        time_mode="None",
        key_columns=["user_id"],
        input_rows=_visits(("a", "blog", T("2026-01-01 09:00")), ("b", "home", T("2026-01-01"))),
        initial_state=initial,
    )
    pages = {(r["key"], r["list_element"][0]) for r in state.rows("pages")}
    assert [r["list_element"][0] for r in state.rows("pages") if r["key"] == ("a",)] == [
        "home",
        "cart",
        "blog",
    ]
    assert ("z", "help") in {(k[0], p) for k, p in pages}, "keys with only initial state count"
    counts = {r["key"]: r["value"] for r in state.rows("count")}
    assert counts == {("a",): (3,), ("b",): (1,), ("z",): (1,)}
    # Stored the way Spark's client stores them: Python values, not NumPy or pandas scalars.
    assert all(type(v[0]) is int for v in counts.values())
    assert all(type(r["list_element"][1]).__name__ == "datetime" for r in state.rows("pages"))


def test_sessions_close_on_is_last_and_keep_a_timer_while_open():
    rows = pd.DataFrame(
        [
            ("u1", "e1", False, T("2026-01-01 00:00")),
            ("u1", "e2", True, T("2026-01-01 00:05")),
            ("u2", "e3", False, T("2026-01-01 00:10")),
        ],
        columns=["user_id", "data", "is_last", "event_time"],
    )
    state = simulate_batch(
        UserSessionsProcessor(session_timeout_seconds=60),
        time_mode="EventTime",
        key_columns=["user_id"],
        input_rows=rows,
    )
    assert [r["key"] for r in state.rows("events")] == [("u2",)]
    expiry = T("2026-01-01 00:11").value // 1_000_000
    assert state.rows("timers") == [{"key": ("u2",), "expiration_timestamp_ms": expiry}]


class _Expiring:
    """Processing-time timers: the batch's own timers fire after its input."""

    def init(self, handle):
        self.handle = handle
        self.seen = handle.getValueState("seen", "n LONG")

    def handleInputRows(self, key, rows, timerValues):
        n = sum(len(df) for df in rows)
        self.seen.update((np.int64(n),))
        self.handle.registerTimer(timerValues.getCurrentProcessingTimeInMs() - 1)
        self.handle.registerTimer(timerValues.getCurrentProcessingTimeInMs() + 1000)
        yield from ()

    def handleExpiredTimer(self, key, timerValues, expiredTimerInfo):
        self.seen.clear()
        yield from ()

    def close(self):
        pass


def test_expired_timers_fire_after_the_input_and_are_deleted():
    state = simulate_batch(
        _Expiring(),
        time_mode="ProcessingTime",
        key_columns=["k"],
        input_rows=pd.DataFrame({"k": ["x", "x", "y"]}),
        batch_timestamp_ms=5000,
    )
    assert state.rows("seen") == []
    assert sorted(r["expiration_timestamp_ms"] for r in state.rows("timers")) == [6000, 6000]


class _Broken(_Expiring):
    def handleInputRows(self, key, rows, timerValues):
        self.seen.update((1, 2))
        yield from ()


def test_a_value_that_does_not_fit_the_declared_schema_is_named():
    with pytest.raises(
        StateOpsError,
        match=r"state 'seen': the processor wrote \(1, 2\), the declared schema has 1 fields \(n\)",
    ):
        simulate_batch(
            _Broken(), time_mode="None", key_columns=["k"], input_rows=pd.DataFrame({"k": ["x"]})
        )


class _WithTtl(_Expiring):
    def init(self, handle):
        self.seen = handle.getValueState("seen", "n LONG", 60_000)


def test_state_with_a_ttl_is_refused():
    with pytest.raises(StateOpsError, match="has a TTL"):
        simulate_batch(
            _WithTtl(), time_mode="None", key_columns=["k"], input_rows=pd.DataFrame({"k": ["x"]})
        )


class _AllKinds(_Expiring):
    def init(self, handle):
        self.handle = handle
        self.seen = handle.getValueState("seen", "n LONG")
        self.pages = handle.getListState("pages", "page STRING")
        self.by_page = handle.getMapState("by_page", "page STRING", "n LONG")

    def handleInputRows(self, key, rows, timerValues):
        self.seen.update((sum(len(df) for df in rows),))
        yield from ()


def test_the_handle_and_its_state_are_sparks_own_classes():
    from pyspark.sql.streaming.stateful_processor import (
        ListState,
        MapState,
        StatefulProcessorHandle,
        ValueState,
    )

    processor = _AllKinds()
    state = simulate_batch(
        processor, time_mode="None", key_columns=["k"], input_rows=pd.DataFrame({"k": ["x"]})
    )
    assert isinstance(state, StatefulProcessorHandle)
    assert isinstance(processor.seen, ValueState)
    assert isinstance(processor.pages, ListState)
    assert isinstance(processor.by_page, MapState)
    assert state.rows("seen") == [{"key": ("x",), "value": (1,)}]
    # A method only Spark's class defines (as one a later Spark adds would be) fails by name.
    with pytest.raises(StateOpsError, match=r"a ValueState method .*'exists'"):
        ValueState.exists(processor.seen)
    with pytest.raises(StateOpsError, match=r"a StatefulProcessorHandle method .*'delete_timer'"):
        StatefulProcessorHandle.deleteTimer(state, 0)
