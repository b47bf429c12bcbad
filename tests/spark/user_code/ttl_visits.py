"""A processor with a TTL on every kind of state variable (ProcessingTime mode): Spark stores
each value wrapped as ``{value, ttlExpirationMs}`` and keeps an index of expiries beside it
(tests/spark/test_ttl_state.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pandas as pd
from pyspark.sql.streaming.stateful_processor import StatefulProcessor, StatefulProcessorHandle

TTL_MS = 3_600_000  # an hour: nothing expires while a test runs


class TtlVisits(StatefulProcessor):
    """Per user: value ``count`` (visits), map ``per_page`` (page -> visits) and list
    ``recent`` (the last five pages), each with a TTL; the output of registry.yaml's
    ``page_visits``."""

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.count = handle.getValueState("count", "visits LONG", TTL_MS)
        self.per_page = handle.getMapState("per_page", "page STRING", "visits LONG", TTL_MS)
        self.recent = handle.getListState("recent", "page STRING, visited_at TIMESTAMP", TTL_MS)

    def handleInputRows(
        self, key: tuple, rows: Iterator[pd.DataFrame], timerValues
    ) -> Iterator[pd.DataFrame]:
        (user_id,) = key
        rows = pd.concat(list(rows), ignore_index=True).sort_values(["event_time", "page"])
        count = self.count.get()
        total = (count[0] if count else 0) + len(rows)
        self.count.update((total,))
        for page, n in rows["page"].value_counts().items():
            seen = self.per_page.getValue((page,)) if self.per_page.containsKey((page,)) else None
            self.per_page.updateValue((page,), ((seen[0] if seen else 0) + int(n),))
        recent = [tuple(r) for r in self.recent.get()]
        recent += list(zip(rows["page"], rows["event_time"], strict=True))
        self.recent.put(recent[-5:])
        yield pd.DataFrame(
            [(user_id, total, recent[-1][0], len(list(self.per_page.keys())))],
            columns=["user_id", "visits", "last_page", "distinct_pages"],
        )

    def close(self) -> None:
        pass
