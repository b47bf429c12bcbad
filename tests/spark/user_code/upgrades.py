"""New code for registry.yaml's ``page_visits`` (list state ``pages``, value state ``count``
per user), as a code upgrade deploys it, and the mappings that carry its state over
(tests/spark/test_upgrade.py)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pandas as pd
from pyspark.sql.streaming.stateful_processor import StatefulProcessor, StatefulProcessorHandle

from stateops.pipelines.carried import CarriedList
from stateops.pipelines.page_visits import PAGES_SCHEMA, PageVisitsProcessor


class _Changed(PageVisitsProcessor):
    """page_visits with its value state ``count`` declared anew (name, schema)."""

    def _declare(self, handle: StatefulProcessorHandle, name: str, schema: str) -> None:
        self.pages = handle.getListState("pages", PAGES_SCHEMA)
        self.count = handle.getValueState(name, schema)
        self.carried = CarriedList(fallback_order=["visited_at", "page"])


class RenamedCount(_Changed):
    """``count`` renamed ``visit_count``."""

    def init(self, handle: StatefulProcessorHandle) -> None:
        self._declare(handle, "visit_count", "visits LONG")


class TextCount(_Changed):
    """``count`` holds its number as text."""

    def init(self, handle: StatefulProcessorHandle) -> None:
        self._declare(handle, "count", "visits STRING")

    def _apply(self, visits: list[tuple]) -> tuple[int, list[tuple]]:
        pages = ([(p, t) for p, t in self.pages.get()] + visits)[-self.max_pages :]
        current = self.count.get()
        total = (int(current[0]) if current else 0) + len(visits)
        self.pages.put(pages)
        self.count.update((str(total),))
        return total, pages


class WiderCount(_Changed):
    """``count`` gains a field (Avro evolves it; without Avro Spark refuses it)."""

    def init(self, handle: StatefulProcessorHandle) -> None:
        self._declare(handle, "count", "visits LONG, last_page STRING")

    def _apply(self, visits: list[tuple]) -> tuple[int, list[tuple]]:
        pages = ([(p, t) for p, t in self.pages.get()] + visits)[-self.max_pages :]
        current = self.count.get()
        total = (current[0] if current else 0) + len(visits)
        self.pages.put(pages)
        self.count.update((total, pages[-1][0] if pages else None))
        return total, pages


class SplitCount(_Changed):
    """``count`` split into ``visits`` and ``last_page`` (Spark drops ``count``)."""

    def init(self, handle: StatefulProcessorHandle) -> None:
        self._declare(handle, "visits", "visits LONG")
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


class PageCounts(StatefulProcessor):
    """Per user and page (a wider key): value state ``views``; the initial state's rows are
    ``(user_id, page, views)``."""

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.views = handle.getValueState("views", "views LONG")

    def handleInitialState(self, key: tuple, initialState: pd.DataFrame, timerValues) -> None:
        self.views.update((int(initialState["views"].sum()),))

    def handleInputRows(
        self, key: tuple, rows: Iterator[pd.DataFrame], timerValues
    ) -> Iterator[pd.DataFrame]:
        user_id, page = key
        seen = sum(len(chunk) for chunk in rows)
        current = self.views.get()
        total = (current[0] if current else 0) + seen
        self.views.update((total,))
        yield pd.DataFrame([(user_id, page, total)], columns=["user_id", "page", "views"])

    def close(self) -> None:
        pass


PAGE_COUNTS_INITIAL = "user_id STRING, page STRING, views LONG"


def views_per_page(spark: Any, old_state: dict[str, Any], **options: Any) -> Any:
    """page_visits' list of visited pages -> views per (user, page)."""
    from pyspark.sql import functions as F

    pages = old_state["pages"]
    return (
        pages.select(
            F.col("key.user_id").alias("user_id"), F.col("list_element.page").alias("page")
        )
        .groupBy("user_id", "page")
        .agg(F.count("*").alias("views"))
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


__all__ = [
    "PAGES_SCHEMA",
    "PAGE_COUNTS_INITIAL",
    "PageCounts",
    "PerPageVisits",
    "SplitCount",
    "RenamedCount",
    "TextCount",
    "WiderCount",
    "pages_as_before",
    "views_per_page",
]
