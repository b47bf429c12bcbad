"""New code for registry.yaml's ``page_visits`` (list state ``pages``, value state ``count``
per user), as a code upgrade deploys it, and the mappings that carry its state over
(tests/spark/test_upgrade.py)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pandas as pd
from pyspark.sql.streaming.stateful_processor import StatefulProcessor, StatefulProcessorHandle

from stateops.pipelines.carried import CarriedList
from stateops.pipelines.idle_sessions import visit_row
from stateops.pipelines.page_views import PageViewsProcessor
from stateops.pipelines.page_visits import PAGES_SCHEMA, PageVisitsProcessor


class CountAs(PageVisitsProcessor):
    """page_visits with its value state ``count`` declared anew: its ``name`` and ``schema``,
    whose fields are of ``visits`` (the count, as text where it is a STRING), ``last_page``
    and ``first_page``."""

    def __init__(
        self, max_pages: int = 1000, name: str = "count", schema: str = "visits LONG"
    ) -> None:
        super().__init__(max_pages)
        self.name, self.schema = name, schema
        self.fields = [f.split()[0] for f in schema.split(",")]
        self.text = "visits STRING" in schema

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.pages = handle.getListState("pages", PAGES_SCHEMA)
        self.count = handle.getValueState(self.name, self.schema)
        self.carried = CarriedList(fallback_order=["visited_at", "page"])

    def _apply(self, visits: list[tuple]) -> tuple[int, list[tuple]]:
        pages = ([(p, t) for p, t in self.pages.get()] + visits)[-self.max_pages :]
        current = self.count.get()
        total = (int(current[0]) if current else 0) + len(visits)
        self.pages.put(pages)
        values = {
            "visits": str(total) if self.text else total,
            "last_page": pages[-1][0] if pages else None,
            "first_page": pages[0][0] if pages else None,
        }
        self.count.update(tuple(values[f] for f in self.fields))
        return total, pages


class SplitCount(CountAs):
    """``count`` split into ``visits`` and ``last_page`` (Spark drops ``count``)."""

    def __init__(self, max_pages: int = 1000) -> None:
        super().__init__(max_pages, "visits", "visits LONG")

    def init(self, handle: StatefulProcessorHandle) -> None:
        super().init(handle)
        self.last_page = handle.getValueState("last_page", "page STRING")


class PerPageVisits(PageVisitsProcessor):
    """page_visits' own variables, kept per user and page (a wider key)."""

    def handleInputRows(
        self, key: tuple, rows: Iterator[pd.DataFrame], timerValues
    ) -> Iterator[pd.DataFrame]:
        incoming = pd.concat(list(rows), ignore_index=True)
        total, pages = self._apply(list(zip(incoming["page"], incoming["event_time"], strict=True)))
        yield pd.DataFrame(
            [(key[0], total, pages[-1][0], len({p for p, _ in pages}))],
            columns=["user_id", "visits", "last_page", "distinct_pages"],
        )


def pages_as_before(spark: Any, old_state: dict[str, Any], **options: Any) -> Any:
    """page_visits' pages, as its own initial state (a rename keeps the list)."""
    from pyspark.sql import functions as F

    return old_state["pages"].select(
        F.col("key.user_id").alias("user_id"),
        F.col("list_element.page").alias("page"),
        F.col("list_element.visited_at").alias("visited_at"),
        F.col("list_position").alias("position"),
    )


class IdleVisits(StatefulProcessor):
    """idle_sessions (``applyInPandasWithState``) as a processor: value state ``visit`` (first
    and last event time, events) and an event-time timer ``idle_seconds`` after the last
    event, which emits the visit closed; the initial state's rows are a visit each with the
    timeout the old group state had (``timeout_ms``), re-armed as the timer."""

    def __init__(self, idle_seconds: int = 1800) -> None:
        self.idle_ms = int(idle_seconds) * 1000

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.handle = handle
        self.visit = handle.getValueState("visit", "first_ms LONG, last_ms LONG, events LONG")

    def _arm(self, at_ms: int) -> None:
        for timer in list(self.handle.listTimers()):
            self.handle.deleteTimer(timer)
        self.handle.registerTimer(at_ms)

    def handleInitialState(self, key: tuple, initialState: pd.DataFrame, timerValues) -> None:
        row = initialState.iloc[-1]
        self.visit.update((int(row["first_ms"]), int(row["last_ms"]), int(row["events"])))
        self._arm(int(row["timeout_ms"]))

    def handleInputRows(
        self, key: tuple, rows: Iterator[pd.DataFrame], timerValues
    ) -> Iterator[pd.DataFrame]:
        times = pd.concat([chunk["event_time"] for chunk in rows])
        ms = times.astype("datetime64[ms]").astype("int64")
        current = self.visit.get()
        first_ms, last_ms, events = current if current else (int(ms.min()), 0, 0)
        last_ms, events = max(last_ms, int(ms.max())), events + len(ms)
        self.visit.update((first_ms, last_ms, events))
        self._arm(max(last_ms, timerValues.getCurrentWatermarkInMs()) + self.idle_ms)
        yield visit_row(key[0], first_ms, last_ms, events, is_open=True)

    def handleExpiredTimer(
        self, key: tuple, timerValues, expiredTimerInfo
    ) -> Iterator[pd.DataFrame]:
        current = self.visit.get()
        self.visit.clear()
        if current:
            yield visit_row(key[0], *current, is_open=False)

    def close(self) -> None:
        pass


def visits_from_group_state(spark: Any, old_state: dict[str, Any], **options: Any) -> Any:
    """idle_sessions' group state (and its timeout) -> IdleVisits' initial state."""
    from pyspark.sql import functions as F

    return old_state["default"].select(
        F.col("key.user_id").alias("user_id"),
        F.col("value.groupState.first_ms").alias("first_ms"),
        F.col("value.groupState.last_ms").alias("last_ms"),
        F.col("value.groupState.events").alias("events"),
        F.col("value.timeoutTimestamp").alias("timeout_ms"),
    )


class WindowCounts(StatefulProcessor):
    """page_counts (a windowed aggregation) as a processor, per page: map state ``views``
    (window start -> views), updated rows per window touched; the initial state's rows are
    ``(page, window_start, views)``."""

    def __init__(self, window_minutes: int = 10) -> None:
        self.window_ms = int(window_minutes) * 60_000

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.views = handle.getMapState("views", "window_start TIMESTAMP", "views LONG")

    def handleInitialState(self, key: tuple, initialState: pd.DataFrame, timerValues) -> None:
        for start, views in zip(initialState["window_start"], initialState["views"], strict=True):
            self.views.updateValue((start,), (int(views),))

    def handleInputRows(
        self, key: tuple, rows: Iterator[pd.DataFrame], timerValues
    ) -> Iterator[pd.DataFrame]:
        times = pd.concat([chunk["event_time"] for chunk in rows])
        ms = times.astype("datetime64[ms]").astype("int64")
        starts = (ms // self.window_ms) * self.window_ms
        out = []
        for start_ms, seen in starts.value_counts().sort_index().items():
            start = pd.Timestamp(int(start_ms), unit="ms")
            current = self.views.getValue((start,)) if self.views.containsKey((start,)) else None
            total = (current[0] if current else 0) + int(seen)
            self.views.updateValue((start,), (total,))
            out.append((start, start + pd.Timedelta(milliseconds=self.window_ms), key[0], total))
        yield pd.DataFrame(out, columns=["window_start", "window_end", "page", "views"])

    def close(self) -> None:
        pass


def windows_from_aggregation(spark: Any, old_state: dict[str, Any], **options: Any) -> Any:
    """page_counts' aggregation state (window, page -> count) -> WindowCounts' initial state."""
    from pyspark.sql import functions as F

    return old_state["default"].select(
        F.col("key.page").alias("page"),
        F.col("key.window.start").alias("window_start"),
        F.col("value.count").alias("views"),
    )


def dedup_pairs(spark: Any, inputs: dict[str, Any]) -> Any:
    """The old code: each (user, page)'s first view, Spark's dropDuplicates."""
    return inputs["source"].dropDuplicates(["user_id", "page"])


class FirstViews(StatefulProcessor):
    """dedup_pairs as a processor: value state ``seen`` per user and page; a pair's first
    view is emitted once. The initial state's rows are the pairs seen before."""

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.seen = handle.getValueState("seen", "seen BOOLEAN")

    def handleInitialState(self, key: tuple, initialState: pd.DataFrame, timerValues) -> None:
        self.seen.update((True,))

    def handleInputRows(
        self, key: tuple, rows: Iterator[pd.DataFrame], timerValues
    ) -> Iterator[pd.DataFrame]:
        incoming = pd.concat(list(rows), ignore_index=True).sort_values("event_time")
        if not self.seen.exists():
            self.seen.update((True,))
            yield incoming.iloc[:1][["user_id", "page", "event_time"]]

    def close(self) -> None:
        pass


def pairs_from_dedup(spark: Any, old_state: dict[str, Any], **options: Any) -> Any:
    """dropDuplicates' state (the pairs seen) -> FirstViews' initial state."""
    from pyspark.sql import functions as F

    return old_state["default"].select(
        F.col("key.user_id").alias("user_id"), F.col("key.page").alias("page")
    )


__all__ = [
    "FirstViews",
    "IdleVisits",
    "PAGES_SCHEMA",
    "WindowCounts",
    "dedup_pairs",
    "pairs_from_dedup",
    "visits_from_group_state",
    "windows_from_aggregation",
    "CountAs",
    "PerPageVisits",
    "SplitCount",
    "pages_as_before",
]


class FailsOnInput(PageViewsProcessor):
    """page_visits' new code (views per user and page) with a bug: it raises on the first input
    it is given. The upgrade's own batch (the old state carried over) commits; the next fails."""

    def handleInputRows(
        self, key: tuple, rows: Iterator[pd.DataFrame], timerValues
    ) -> Iterator[pd.DataFrame]:
        raise RuntimeError("FailsOnInput: the new code fails on its first input")
