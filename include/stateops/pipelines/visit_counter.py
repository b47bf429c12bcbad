"""Per user, a visit count: one value per key. The benchmarks' minimal processor (the kind of
query behind the carry-over figures in shared/FACTS.md); not in registry.yaml."""

from __future__ import annotations

from collections.abc import Iterator

import pandas as pd
from pyspark.sql.streaming.stateful_processor import (
    StatefulProcessor,
    StatefulProcessorHandle,
    TimerValues,
)

__all__ = ["VisitCounter"]


class VisitCounter(StatefulProcessor):
    """Value state ``count`` (``visits``); initial state: one row per user with ``visits``."""

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.count = handle.getValueState("count", "visits LONG")

    def _add(self, visits: int) -> int:
        current = self.count.get()
        total = (current[0] if current else 0) + visits
        self.count.update((total,))
        return total

    def handleInitialState(
        self, key: tuple, initialState: pd.DataFrame, timerValues: TimerValues
    ) -> None:
        self._add(int(initialState["visits"].sum()))

    def handleInputRows(
        self, key: tuple, rows: Iterator[pd.DataFrame], timerValues: TimerValues
    ) -> Iterator[pd.DataFrame]:
        total = self._add(sum(len(batch) for batch in rows))
        yield pd.DataFrame({"user_id": [key[0]], "visits": [total]})

    def close(self) -> None:
        pass
