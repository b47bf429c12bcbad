"""New code for the visit counter (stateops.pipelines.visit_counter), as a code upgrade deploys
it, and the mapping that rewrites the old state for it (benchmarks/bench_upgrade.py). On the
benchmark registry's ``code_paths``, as a user's own module would be."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pandas as pd
from pyspark.sql.streaming.stateful_processor import (
    StatefulProcessor,
    StatefulProcessorHandle,
    TimerValues,
)

__all__ = ["FirstPageCounter", "with_first_page"]


class FirstPageCounter(StatefulProcessor):
    """The visit count with the user's first page: value state ``count`` goes from
    ``visits LONG`` to ``visits LONG, first_page STRING``, a field added, which Spark refuses
    on a checkpoint not written with Avro; initial state: ``user_id, visits, first_page``."""

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.count = handle.getValueState("count", "visits LONG, first_page STRING")

    def handleInitialState(
        self, key: tuple, initialState: pd.DataFrame, timerValues: TimerValues
    ) -> None:
        first = initialState["first_page"].dropna()
        page = str(first.iloc[0]) if len(first) else None
        self.count.update((int(initialState["visits"].sum()), page))

    def handleInputRows(
        self, key: tuple, rows: Iterator[pd.DataFrame], timerValues: TimerValues
    ) -> Iterator[pd.DataFrame]:
        incoming = pd.concat(list(rows), ignore_index=True)
        current = self.count.get()
        visits = (current[0] if current else 0) + len(incoming)
        if current:
            first = current[1]
        else:
            first = str(incoming["page"].iloc[incoming["event_time"].argmin()])
        self.count.update((visits, first))
        yield pd.DataFrame({"user_id": [key[0]], "visits": [visits], "first_page": [first]})

    def close(self) -> None:
        pass


def with_first_page(spark: Any, old_state: dict[str, Any], **options: Any) -> Any:
    """The old counter's ``count`` -> ``user_id, visits, first_page``: the old state never
    kept the first page, so it is unknown (null) for the users counted before the upgrade."""
    from pyspark.sql import functions as F

    return old_state["count"].select(
        F.col("key.user_id").alias("user_id"),
        F.col("value.visits").alias("visits"),
        F.lit(None).cast("string").alias("first_page"),
    )
