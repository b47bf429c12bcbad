"""A user's own query whose batches the clock drives (a registry ``transform``):
tests/spark/test_clock_driven.py runs it the ways the scheduled runs and the backfill do."""

from __future__ import annotations

import functools
from collections.abc import Iterator
from typing import Any

OUTPUT_SCHEMA = "user_id STRING, views LONG, open BOOLEAN"


def _views(key: tuple, frames: Iterator[Any], state: Any, timeout_ms: int) -> Iterator[Any]:
    """One row per call: the user's views so far (open), or, once the user was quiet for
    ``timeout_ms`` of processing time, the closed count (its state removed)."""
    import pandas as pd

    if state.hasTimedOut:
        (views,) = state.get
        state.remove()
        yield pd.DataFrame({"user_id": [key[0]], "views": [views], "open": [False]})
        return
    views = (state.get[0] if state.exists else 0) + sum(len(f) for f in frames)
    state.update((views,))
    state.setTimeoutDuration(timeout_ms)
    yield pd.DataFrame({"user_id": [key[0]], "views": [views], "open": [True]})


def quiet_users(spark: Any, inputs: dict[str, Any], timeout_minutes: int = 60) -> Any:
    """Views per user in group state (applyInPandasWithState) with a processing-time timeout:
    Spark runs a batch that reads nothing on every trigger to fire the timeouts due."""
    from pyspark.sql.streaming.state import GroupStateTimeout

    return (
        inputs["source"]
        .groupBy("user_id")
        .applyInPandasWithState(
            functools.partial(_views, timeout_ms=timeout_minutes * 60_000),
            outputStructType=OUTPUT_SCHEMA,
            stateStructType="views LONG",
            outputMode="Update",
            timeoutConf=GroupStateTimeout.ProcessingTimeTimeout,
        )
    )
