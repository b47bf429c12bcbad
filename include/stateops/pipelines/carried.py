"""Carried-over list state for ``handleInitialState``: a key's rows in their recorded order."""

from __future__ import annotations

import pandas as pd

__all__ = ["POSITION", "CarriedList"]

POSITION = "position"


class CarriedList:
    """A key's carried list, in its recorded order (``position``, from a state export).

    Spark hands a key's initial rows over in no particular order (they are shuffled), and a
    key with more rows than ``spark.sql.execution.arrow.maxRecordsPerBatch`` in several calls,
    one after the other: :meth:`rows` returns every row of the key so far, so the state the
    last call stores is the whole list. The order is never re-derived from the values: a
    session that took a late event keeps it where it arrived, as the query that kept running
    does. Rows without a position (an initial state written by hand) are taken in
    ``fallback_order``. A processor makes one in ``init`` (once per task).
    """

    def __init__(self, fallback_order: list[str]) -> None:
        self.fallback_order = fallback_order
        self.key: tuple | None = None
        self.chunks: list[pd.DataFrame] = []

    def rows(self, key: tuple, chunk: pd.DataFrame, columns: list[str]) -> list[tuple]:
        if key != self.key:
            self.key, self.chunks = key, []
        self.chunks.append(chunk)
        every = pd.concat(self.chunks, ignore_index=True)
        if POSITION in every.columns and every[POSITION].notna().all():
            every = every.sort_values(POSITION, kind="stable")
        else:
            every = every.sort_values(self.fallback_order, kind="stable")
        return list(zip(*(every[c] for c in columns), strict=True))
