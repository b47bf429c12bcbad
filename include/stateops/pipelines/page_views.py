"""Views per user and page: page_visits' code after an upgrade that widens its key (the demo's
and docs/code-upgrades.md's example), and the mapping that carries page_visits' state into it.

``stateops upgrade`` rewrites the old checkpoint's state with :func:`views_from_page_visits`
(the registry's ``initial_state.mapping``) into a new checkpoint, whose first batch hands each
(user, page) its count through :meth:`PageViewsProcessor.handleInitialState`.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pandas as pd
from pyspark.sql.streaming.stateful_processor import StatefulProcessor, StatefulProcessorHandle

__all__ = ["INITIAL_STATE_SCHEMA", "OUTPUT_SCHEMA", "PageViewsProcessor", "views_from_page_visits"]

INITIAL_STATE_SCHEMA = "user_id STRING, page STRING, views LONG"
OUTPUT_SCHEMA = "user_id STRING, page STRING, views LONG"


class PageViewsProcessor(StatefulProcessor):
    """Keyed by (user, page): value state ``views``, emitted with each new count."""

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


def views_from_page_visits(spark: Any, old_state: dict[str, Any], **options: Any) -> Any:
    """page_visits' list state ``pages`` (one row per visited page, at most its ``max_pages``
    latest per user) -> views per (user, page), rows of :data:`INITIAL_STATE_SCHEMA`."""
    from pyspark.sql import functions as F

    return (
        old_state["pages"]
        .select(F.col("key.user_id").alias("user_id"), F.col("list_element.page").alias("page"))
        .groupBy("user_id", "page")
        .agg(F.count("*").alias("views"))
    )
