"""Kafka topics in and out (Spark's Kafka connector).

In: the offsets entry is ``{"topic": {"partition": next_offset}}``; each record's value is
decoded into the columns of the source's ``schema``. The brokers and their security come from
the source's Airflow connection (:mod:`stateops.core.kafka`), never from the registry.

Out: each row a record of ``topic`` (its ``key`` column as the record's key, every column as
the JSON value): at least once, a batch that runs again writes its records again.
"""

from __future__ import annotations

import functools
import json
import operator
import uuid
from typing import TYPE_CHECKING, Any

from stateops.core.kafka import (
    KafkaDown,
    Offsets,
    broker_offsets,
    kafka_settings,
    parse_offsets,
    spark_options,
    topic_partitions,
)
from stateops.core.model import schema_fields
from stateops.kinds.base import Sink, Source, register_sink, register_source

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession

__all__ = ["KAFKA", "KAFKA_SINK", "records_between", "topic_offsets"]

CONNECTOR = "spark-sql-kafka"
AVRO = "spark-avro"  # Avro's functions (from_avro)
_SECURITY = ("kafka.sasl.", "kafka.security.", "kafka.ssl.")
# The columns of a record as Spark's Kafka source gives it (``encoding: raw``).
RECORD_COLUMNS = (
    "key",
    "value",
    "topic",
    "partition",
    "offset",
    "timestamp",
    "timestampType",
    "headers",
)
# The run's progress counts the values of a ``malformed: count`` source that did not parse,
# under names that start so, one per source (Spark's observed metrics:
# stateops.spark.streaming.progress_summary).
MALFORMED_METRIC = "stateops_malformed"
_MALFORMED_COLUMN = "_stateops_malformed"


class Kafka:
    name = "kafka"
    fields = ("topic", "topics", "bootstrap_servers", "connection", "avro_schema", "malformed")
    connector = CONNECTOR
    connection_type = "kafka"
    session_conf: dict[str, str] = {}

    def check(self, source: Source) -> None:
        self._check_place(source)
        columns = [name for name, _ in schema_fields(source.schema_)]
        if source.avro_schema and source.encoding != "avro":
            raise ValueError("avro_schema is for Avro values: give encoding: avro with it")
        if source.encoding == "raw":
            if source.malformed:
                raise ValueError(
                    "malformed is for json and avro values: a raw record is never decoded"
                )
            unknown = [c for c in columns if c not in RECORD_COLUMNS]
            if unknown:
                raise ValueError(
                    f"schema {', '.join(unknown)}: a raw record's columns are "
                    f"{', '.join(RECORD_COLUMNS)} (encoding: json decodes the value instead)"
                )
        elif source.encoding == "avro":
            _check_avro(source)
        elif _MALFORMED_COLUMN in columns:
            raise ValueError(f"schema {_MALFORMED_COLUMN}: the name is stateops' own")

    def jars(self, source: Source) -> tuple[str, ...]:
        """The connector, and Avro's functions for Avro values."""
        return (CONNECTOR, AVRO) if source.encoding == "avro" else (CONNECTOR,)

    def _check_place(self, source: Source) -> None:
        if source.path:
            raise ValueError("a kafka source reads topics: give topic or topics, not path")
        if bool(source.topic) == bool(source.topics):
            raise ValueError("a kafka source names topic (one) or topics (several)")
        if {"subscribe", "subscribePattern", "assign"} & set(source.options):
            raise ValueError("give a kafka source's topics as topic or topics, not options")
        if "kafka.bootstrap.servers" in source.options:
            raise ValueError("give a kafka source's brokers as bootstrap_servers, not options")
        secret = [k for k in source.options if k.startswith(_SECURITY)]
        if secret:
            # The registry is shown in plans, logs and XCom; credentials are not.
            raise ValueError(
                f"options {', '.join(secret)}: security settings come from the source's "
                "Airflow connection (connection, else connections.kafka) or STATEOPS_KAFKA_* "
                "variables, never the registry"
            )

    def where(self, source: Source) -> str:
        return f"topic {','.join(source.subscribed)}"

    def brief(self, source: Source) -> dict[str, Any]:
        return {"topics": source.subscribed}

    def places(self, source: Source) -> list[str]:
        return []

    def stream(self, spark: SparkSession, source: Source) -> DataFrame:
        reader = spark.readStream.format("kafka").options(**read_options(source))
        return decode(reader.options(**source.reader_options).load(), source, streaming=True)


class KafkaSink:
    name = "kafka"
    fields = ("topic", "key", "bootstrap_servers", "connection")
    connector = CONNECTOR
    connection_type = "kafka"
    session_conf: dict[str, str] = {}
    exclusive = False  # a topic takes many writers

    def check(self, sink: Sink) -> None:
        if sink.path or not sink.topic:
            raise ValueError("a kafka sink writes a topic: give topic, not path")

    def where(self, sink: Sink) -> str:
        return f"topic {sink.topic}"

    def places(self, sink: Sink) -> list[str]:
        return []

    def write(self, df: DataFrame, batch_id: int, sink: Sink) -> None:
        from pyspark.sql import functions as F

        record = [F.to_json(F.struct(*df.columns)).alias("value")]
        if sink.key:
            record.insert(0, F.col(sink.key).cast("string").alias("key"))
        df.select(*record).write.format("kafka").options(
            **spark_options(kafka_settings(sink.bootstrap_servers, sink.connection))
        ).option("topic", sink.topic).save()

    def undo_plan(self, sink: Sink, to_batch: int) -> None:
        """Nothing to undo: the topic keeps what a batch wrote (see :meth:`rewrites`)."""
        return None

    def rewrites(self, sink: Sink, first_batch: int, since_ms: int | None) -> dict[str, Any]:
        """How many records the batches from ``first_batch`` on wrote to the topic, which a
        reprocessing writes again: those stamped at or after ``since_ms``, the first of those
        batches' start (None: none of them ran), the query being the topic's only writer.
        Raises KafkaDown where the brokers do not answer."""
        found = {
            "sink": f"Kafka topic {sink.topic}",
            "topic": sink.topic,
            "first_batch": first_batch,
            "since_ms": None,
            "records": 0,
        }
        if since_ms is None:  # nothing after it: nothing is written again
            return found
        at = topic_offsets([sink.topic or ""], sink, since_ms)
        end = topic_offsets([sink.topic or ""], sink, "latest")
        found.update(since_ms=since_ms, records=records_between(at, end))
        return found

    def set_aside(self, plan: dict[str, Any], run_id: str, submit: object) -> None:
        raise AssertionError("a kafka sink has no undo plan")  # undo_plan is None

    def plan_lines(self, plan: dict[str, Any]) -> list[str]:
        return []

    def undo_hint(self, plan: dict[str, Any]) -> str:
        return ""

    def touches(self, plan: dict[str, Any]) -> dict[str, list[Any]]:
        return {"move": [], "delete": [], "write": []}

    def mark(self, sink: Sink) -> dict[str, dict[str, int]] | None:
        """The topic's end offsets now, as JSON keeps them: where a reprocessing's records
        start (None: the broker does not answer; the reprocessing then fails and says so)."""
        try:
            end = topic_offsets([sink.topic or ""], sink, "latest")
        except KafkaDown:
            return None
        return {t: {str(p): o for p, o in ps.items()} for t, ps in end.items()}

    def compare(
        self,
        sink: Sink,
        *,
        run_id: str,
        after_batch: int,
        key_columns: list[str],
        mark: object,
        before: dict[str, Any] | None,
    ) -> tuple[list[str], dict[str, Any], dict[str, Any]]:
        """How many records the reprocessing wrote (from ``mark``), against the count the
        rolled-back batches had written (``before``, their :meth:`rewrites`): the topic keeps
        both, rows are not compared."""
        end = topic_offsets([sink.topic or ""], sink, "latest")
        start = parse_offsets(mark)
        written = records_between(start, end) if start is not None else None
        was = (before or {}).get("records", 0)
        lines = [
            f"the reprocessing of the batches after {after_batch} wrote "
            f"{'an unknown number of' if written is None else written} records to Kafka topic "
            f"{sink.topic}; the rolled-back batches had written {was}, which the topic keeps "
            "(at least once)"
        ]
        output = {"records_written": written, "records_written_before": was}
        return lines, output, output


def read_options(source: Source) -> dict[str, str]:
    """Spark's Kafka reader's options for the source's brokers, topics and record columns
    (streaming and batch alike; the registry's ``options`` go after them)."""
    options = spark_options(kafka_settings(source.bootstrap_servers, source.connection))
    options["subscribe"] = ",".join(source.subscribed)
    columns = [name for name, _ in schema_fields(source.schema_)]
    if source.encoding == "raw" and "headers" in columns:
        options["includeHeaders"] = "true"
    return options


def decode(records: DataFrame, source: Source, *, streaming: bool = False) -> DataFrame:
    """Kafka records (Spark's Kafka source's columns) as the source's columns: ``raw``, the
    record's columns cast to the schema's types; ``json``, the value decoded into the schema.
    A value that does not parse, is empty or is null (a tombstone) is malformed: it fails the
    batch, or with ``malformed: count`` it is skipped, and a stream counts it in its progress
    (a metric per source: Spark refuses one name for two). The carry-over proof decodes a
    batch's records here too, as the query read them."""
    from pyspark.sql import functions as F

    columns = schema_fields(source.schema_)
    if source.encoding == "raw":
        record = F.struct(*[name for name, _ in columns])
        return records.select(record.cast(f"STRUCT<{source.schema_}>").alias("r")).select("r.*")
    counting = source.malformed == "count"
    if source.encoding == "avro":
        value, bad = _from_avro(source, counting)
        picked = [F.col(f"v.{name}").cast(kind).alias(name) for name, kind in columns]
    elif counting:
        value = F.from_json(
            F.col("value").cast("string"),
            f"{source.schema_}, {_MALFORMED_COLUMN} STRING",
            {"mode": "PERMISSIVE", "columnNameOfCorruptRecord": _MALFORMED_COLUMN},
        )
        bad = F.col("v").isNull() | F.col(f"v.{_MALFORMED_COLUMN}").isNotNull()
        picked = [F.col(f"v.{name}") for name, _ in columns]
    else:
        value = F.from_json(F.col("value").cast("string"), source.schema_, {"mode": "FAILFAST"})
        bad = F.col("v").isNull()
        picked = [F.col(f"v.{name}") for name, _ in columns]
    parsed = records.select(value.alias("v"))
    topics = ",".join(source.subscribed)
    if not counting:  # a value that does not decode fails the batch; an empty one too
        said = f"[MALFORMED_RECORD_IN_PARSING] an empty or null value of topic {topics}"
        guarded = F.when(bad, F.raise_error(F.lit(said))).otherwise(F.col("v"))
        return parsed.select(guarded.alias("v")).select(*picked)
    if streaming:
        name = f"{MALFORMED_METRIC}:{topics}:{uuid.uuid4().hex[:8]}"
        parsed = parsed.observe(name, F.count(F.when(bad, 1)).alias("records"))
    return parsed.where(~bad).select(*picked)


def _from_avro(source: Source, counting: bool) -> tuple[Column, Column]:
    """The value decoded with the writer's schema (Spark's ``from_avro``), and what makes a
    record malformed: a null value (a tombstone) and, when counting, a value Spark could not
    decode, which its PERMISSIVE mode gives as a record of nulls (not as null), so a record
    whose every field is null counts as malformed then."""
    from pyspark.sql import functions as F
    from pyspark.sql.avro.functions import from_avro

    mode = "PERMISSIVE" if counting else "FAILFAST"
    value = from_avro(F.col("value"), source.avro_schema or "", {"mode": mode})
    bad = F.col("v").isNull()
    if counting:
        fields = [F.col(f"v.{name}").isNull() for name in avro_fields(source.avro_schema or "")]
        bad = bad | functools.reduce(operator.and_, fields)
    return value, bad


# Spark's type of each Avro type (by its logicalType where it has one) and the types a
# ``schema`` may declare it as beside that: widenings and text.
_AVRO_TYPES: dict[str, tuple[str, ...]] = {
    "boolean": ("BOOLEAN",),
    "int": ("INT", "BIGINT", "DOUBLE"),
    "long": ("BIGINT",),
    "float": ("FLOAT", "DOUBLE"),
    "double": ("DOUBLE",),
    "string": ("STRING",),
    "enum": ("STRING",),
    "bytes": ("BINARY",),
    "fixed": ("BINARY",),
    "date": ("DATE",),
    "timestamp-millis": ("TIMESTAMP",),
    "timestamp-micros": ("TIMESTAMP",),
    "local-timestamp-millis": ("TIMESTAMP_NTZ",),
    "local-timestamp-micros": ("TIMESTAMP_NTZ",),
}


def avro_fields(text: str) -> dict[str, Any]:
    """The fields of an Avro record schema (the ``.avsc`` text) by name, each its type as
    written; ValueError, one line, for text that is not a record schema."""
    try:
        schema = json.loads(text)
    except json.JSONDecodeError as err:
        raise ValueError(
            f"avro_schema is not JSON ({err.msg}, line {err.lineno} column {err.colno}): give "
            "the writer's .avsc text, or the same as a mapping"
        ) from None
    fields = schema.get("fields") if isinstance(schema, dict) else None
    if not isinstance(schema, dict) or schema.get("type") != "record" or not fields:
        raise ValueError(
            'avro_schema is not a record schema ({"type": "record", "name": ..., "fields": '
            "[...]}): a value's columns are its record's fields"
        )
    return {f["name"]: f.get("type") for f in fields if isinstance(f, dict) and "name" in f}


def avro_type(written: Any) -> str | None:
    """An Avro field's type as :data:`_AVRO_TYPES` names it (its logicalType where it has
    one; a union with null, its other member); None: a type Spark reads as a struct, array
    or map, or a union of several, which Spark's cast checks at run time."""
    if isinstance(written, list):
        others = [t for t in written if t != "null"]
        return avro_type(others[0]) if len(others) == 1 else None
    if isinstance(written, dict):
        return written.get("logicalType") or avro_type(written.get("type"))
    return written if isinstance(written, str) else None


def _check_avro(source: Source) -> None:
    """An Avro source's columns are fields of its writer's record, declared as types Spark's
    cast reads them as (a widening or text)."""
    if not source.avro_schema:
        raise ValueError("encoding: avro needs avro_schema: the writer's schema (.avsc)")
    fields = avro_fields(source.avro_schema)
    for name, declared in schema_fields(source.schema_):
        if name not in fields:
            raise ValueError(
                f"schema {name}: not a field of avro_schema's record (its fields: "
                f"{', '.join(fields)})"
            )
        written = avro_type(fields[name])
        allowed = _AVRO_TYPES.get(written or "")
        if allowed is None or declared == "STRING" or declared in allowed:
            continue
        if written in ("long", "int") and declared in ("TIMESTAMP", "TIMESTAMP_NTZ", "DATE"):
            raise ValueError(
                f"schema {name} {declared}: the Avro field is a {written}; declare it with "
                "logicalType timestamp-millis (or date) in avro_schema, or as BIGINT "
                "(Spark would read the number as seconds)"
            )
        raise ValueError(
            f"schema {name} {declared}: the Avro field is {written}, which reads as "
            f"{' or '.join(allowed)} (or STRING)"
        )


def records_between(before: Offsets | None, after: Offsets) -> int:
    """How many records lie from ``before`` to ``after`` (two offsets of one source: what the
    batches between them read); a partition ``before`` lacks counts from 0 (Spark reads a new
    partition from its beginning)."""
    before = before or {}
    return sum(
        max(0, offset - before.get(topic, {}).get(partition, 0))
        for topic, parts in after.items()
        for partition, offset in parts.items()
    )


def topic_offsets(topics: list[str], place: Source | Sink, at: str | int) -> Offsets:
    """Topics' offsets on the brokers of ``place`` (a Kafka source or sink: its
    ``bootstrap_servers`` and ``connection``): ``earliest``, ``latest``, or per partition the
    first record stamped at or after an epoch-ms time."""
    settings = kafka_settings(place.bootstrap_servers, place.connection)
    return broker_offsets(settings, topic_partitions(settings, topics), at)


KAFKA = register_source(Kafka(), "kafka")
KAFKA_SINK = register_sink(KafkaSink(), "kafka")
