"""Per user: the ordered list of visited pages and a visit count, with optional initial state."""

from __future__ import annotations

from collections.abc import Iterator

import pandas as pd
from pyspark.sql.streaming.stateful_processor import (
    StatefulProcessor,
    StatefulProcessorHandle,
    TimerValues,
)

from stateops.pipelines.carried import CarriedList

__all__ = ["INITIAL_STATE_SCHEMA", "INPUT_SCHEMA", "OUTPUT_SCHEMA", "PageVisitsProcessor"]

INPUT_SCHEMA = "user_id STRING, page STRING, event_time TIMESTAMP"
# One row per previously visited page, in `position` order (from a state export) or, without
# one, in `visited_at` order.
INITIAL_STATE_SCHEMA = "user_id STRING, page STRING, visited_at TIMESTAMP, position INT"
OUTPUT_SCHEMA = "user_id STRING, visits LONG, last_page STRING, distinct_pages INT"
PAGES_SCHEMA = "page STRING, visited_at TIMESTAMP"
COUNT_SCHEMA = "visits LONG"


class PageVisitsProcessor(StatefulProcessor):
    """List state ``pages`` (oldest first, at most ``max_pages``) and value state ``count``."""

    def __init__(self, max_pages: int = 1000) -> None:
        if max_pages <= 0:
            raise ValueError("max_pages must be positive")
        self.max_pages = int(max_pages)

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.pages = handle.getListState("pages", PAGES_SCHEMA)
        self.count = handle.getValueState("count", COUNT_SCHEMA)
        self.carried = CarriedList(fallback_order=["visited_at", "page"])

    def _apply(self, visits: list[tuple]) -> tuple[int, list[tuple]]:
        pages = [(p, t) for p, t in self.pages.get()] + visits
        pages = pages[-self.max_pages :]
        current = self.count.get()
        total = (current[0] if current else 0) + len(visits)
        self.pages.put(pages)
        self.count.update((total,))
        return total, pages

    def handleInitialState(
        self, key: tuple, initialState: pd.DataFrame, timerValues: TimerValues
    ) -> None:
        """Pages visited before: in the exported order (``position``), else by ``visited_at``
        (an initial state written by hand). The count is the number of carried pages."""
        visits = self.carried.rows(key, initialState, ["page", "visited_at"])
        self.pages.clear()
        self.count.clear()
        self._apply(visits)

    def handleInputRows(
        self, key: tuple, rows: Iterator[pd.DataFrame], timerValues: TimerValues
    ) -> Iterator[pd.DataFrame]:
        (user_id,) = key
        incoming = pd.concat(list(rows), ignore_index=True).sort_values(
            ["event_time", "page"], kind="stable"
        )
        total, pages = self._apply(list(zip(incoming["page"], incoming["event_time"], strict=True)))
        yield pd.DataFrame(
            [(user_id, total, pages[-1][0], len({p for p, _ in pages}))],
            columns=["user_id", "visits", "last_page", "distinct_pages"],
        )

    def close(self) -> None:
        pass
