"""A user's own query code (registry ``transform``s), one query per shape of Spark's built-in
stateful operators: tests/spark/test_shapes.py runs every lifecycle operation on each."""

from __future__ import annotations

from typing import Any


def first_views(spark: Any, inputs: dict[str, Any], delay: str = "10 minutes") -> Any:
    """Dedup within the watermark: a user's first view of each page (append)."""
    views = inputs["source"].withWatermark("event_time", delay)
    return views.dropDuplicatesWithinWatermark(["user_id", "page"])


def session_counts(
    spark: Any, inputs: dict[str, Any], gap: str = "5 minutes", delay: str = "10 minutes"
) -> Any:
    """Session windows: views per user per session of activity (append, once closed)."""
    from pyspark.sql import functions as F

    views = inputs["source"].withWatermark("event_time", delay)
    return (
        views.groupBy(F.session_window("event_time", gap).alias("session"), "user_id")
        .agg(F.count("*").alias("views"))
        .select(
            F.col("session.start").alias("session_start"),
            F.col("session.end").alias("session_end"),
            "user_id",
            "views",
        )
    )


def views_near_events(spark: Any, inputs: dict[str, Any], within: str = "1 minute") -> Any:
    """A stream-stream join of two sources: each page view with the user's events at most
    ``within`` before or after it (append)."""
    from pyspark.sql import functions as F

    views = (
        inputs["views"]
        .select(F.col("user_id").alias("view_user"), "page", F.col("event_time").alias("view_time"))
        .withWatermark("view_time", "2 minutes")
    )
    events = (
        inputs["events"]
        .select(F.col("user_id").alias("event_user"), "data", "event_time")
        .withWatermark("event_time", "2 minutes")
    )
    return views.join(
        events,
        F.expr(
            f"view_user = event_user AND event_time BETWEEN view_time - interval {within} "
            f"AND view_time + interval {within}"
        ),
    )


def deduped_counts(spark: Any, inputs: dict[str, Any], delay: str = "10 minutes") -> Any:
    """Two stateful operators, both stores ``default``: views deduplicated (within the
    watermark), then counted per page and 10-minute window (append)."""
    from pyspark.sql import functions as F

    views = inputs["source"].withWatermark("event_time", delay)
    unique = views.dropDuplicates(["user_id", "page", "event_time"])
    counted = unique.groupBy(F.window("event_time", "10 minutes").alias("w"), "page").count()
    return counted.select(F.col("w.start").alias("window_start"), "page", "count")


def chained_windows(spark: Any, inputs: dict[str, Any], delay: str = "10 minutes") -> Any:
    """Two chained windowed aggregations: views per page per 10 minutes, then the busiest
    10 minutes of each hour (append)."""
    from pyspark.sql import functions as F

    views = inputs["source"].withWatermark("event_time", delay)
    tens = views.groupBy(F.window("event_time", "10 minutes").alias("w"), "page").count()
    hours = tens.groupBy(F.window(F.window_time("w"), "1 hour").alias("h"), "page").agg(
        F.max("count").alias("busiest")
    )
    return hours.select(F.col("h.start").alias("hour_start"), "page", "busiest")
