"""Build and run a registered query with Spark. Spark-side: PySpark is imported lazily."""

from __future__ import annotations

import importlib
import json
from typing import TYPE_CHECKING, Any

from stateops.core.errors import RegistryError
from stateops.core.registry import Query

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming import StreamingQuery

__all__ = [
    "apply_query_conf",
    "build_session",
    "load_processor",
    "progress_summary",
    "spark_session",
    "start_query",
    "write_batch",
]

# Keep every progress event of a run: the run summary counts batches and input rows from them.
_SESSION_CONF = {
    "spark.sql.session.timeZone": "UTC",
    "spark.sql.streaming.numRecentProgressUpdates": "1000000",
    "spark.ui.showConsoleProgress": "false",
}


def spark_session(app_name: str, master: str | None = None) -> SparkSession:
    """The session every job uses (UTC, no console progress bars, all progress kept)."""
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.appName(app_name)
    if master:
        builder = builder.master(master)
    for key, value in _SESSION_CONF.items():
        builder = builder.config(key, value)
    return builder.getOrCreate()


def build_session(query: Query, app_name: str, master: str | None = None) -> SparkSession:
    """:func:`spark_session` with the state-shaping settings of ``query``."""
    spark = spark_session(app_name, master)
    apply_query_conf(spark, query)
    return spark


def apply_query_conf(spark: SparkSession, query: Query) -> None:
    """Set the state-shaping settings of ``query`` (they are recorded in its offset log)."""
    for key, value in {**_SESSION_CONF, **query.spark_conf_for_query()}.items():
        if key != "spark.ui.showConsoleProgress":
            spark.conf.set(key, value)


def load_processor(query: Query) -> Any:
    module_name, _, class_name = query.processor.class_.partition(":")
    try:
        cls = getattr(importlib.import_module(module_name), class_name)
    except (ImportError, AttributeError) as err:
        raise RegistryError(
            f"query {query.name}: processor.class {query.processor.class_!r} "
            f"cannot be imported ({err})"
        ) from err
    try:
        return cls(**query.processor.options)
    except (TypeError, ValueError) as err:
        raise RegistryError(
            f"query {query.name}: processor.options do not fit {query.processor.class_}: {err}"
        ) from err


def write_batch(df: DataFrame, batch_id: int, query: Query) -> None:
    """Idempotent per batch id: a re-run of a batch replaces its folder instead of adding to it."""
    df.write.mode("overwrite").format(query.sink.format).save(
        f"{query.sink.path}/batch_id={query.sink.folder_batch(batch_id)}"
    )


def start_query(
    spark: SparkSession,
    query: Query,
    *,
    available_now: bool,
    initial_state: DataFrame | None = None,
) -> StreamingQuery:
    source = query.source
    df = (
        spark.readStream.format(source.format)
        .schema(source.schema_)
        .options(**source.reader_options)
        .load(source.path)
    )
    if query.watermark:
        df = df.withWatermark(query.watermark.column, query.watermark.delay)
    grouped_initial = (
        initial_state.groupBy(*query.key_columns) if initial_state is not None else None
    )
    out = df.groupBy(*query.key_columns).transformWithStateInPandas(
        statefulProcessor=load_processor(query),
        outputStructType=query.output_schema,
        outputMode=query.processor.output_mode,
        timeMode=query.processor.time_mode,
        initialState=grouped_initial,
    )
    writer = (
        out.writeStream.queryName(query.name)
        .outputMode(query.processor.output_mode.lower())
        .option("checkpointLocation", query.checkpoint)
        .foreachBatch(lambda batch_df, batch_id: write_batch(batch_df, batch_id, query))
    )
    if available_now:
        writer = writer.trigger(availableNow=True)
    else:
        writer = writer.trigger(processingTime=query.trigger.processing_time)
    return writer.start()


def progress_summary(progress: list[Any]) -> dict[str, Any]:
    """Input rows and state rows per operator from a run's progress events.

    Batch counts come from the checkpoint instead: an idle trigger also reports a progress
    event, with the next batch id, though it commits nothing.
    """
    events = [json.loads(p.json) if hasattr(p, "json") else dict(p) for p in progress]
    # A no-data batch (watermark advance) can report no operators: take the last that did.
    last_state = next(
        (e["stateOperators"] for e in reversed(events) if e.get("stateOperators")), []
    )
    return {
        "input_rows": sum(int(e.get("numInputRows", 0)) for e in events),
        "state_operators": [
            {
                "operator": i,
                "operator_name": s.get("operatorName"),
                "state_rows": s.get("numRowsTotal"),
                "memory_used_bytes": s.get("memoryUsedBytes"),
            }
            for i, s in enumerate(last_state)
        ],
    }
