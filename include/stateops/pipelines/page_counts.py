"""Views per page per event-time window: a streaming aggregation (a registry ``transform``).

Spark's own operators keep the state (the HDFS-backed store or RocksDB, whichever the
registry sets): one count per (window, page), updated as views arrive (``update`` mode),
dropped once the watermark passes the window's end. Views later than the watermark are
dropped as late.
"""

from __future__ import annotations

from typing import Any

__all__ = ["build"]


def build(
    spark: Any, inputs: dict[str, Any], window: str = "10 minutes", delay: str = "10 minutes"
) -> Any:
    """``inputs["source"]``: page views (``page``, ``event_time``)."""
    from pyspark.sql import functions as F

    views = inputs["source"].withWatermark("event_time", delay)
    return (
        views.groupBy(F.window("event_time", window).alias("window"), "page")
        .agg(F.count("*").alias("views"))
        .select(
            F.col("window.start").alias("window_start"),
            F.col("window.end").alias("window_end"),
            "page",
            "views",
        )
    )
