"""Kafka topics in and out (Spark's Kafka connector).

In: the offsets entry is ``{"topic": {"partition": next_offset}}``; each record's value is
decoded into the columns of the source's ``schema``. The brokers and their security come from
the source's Airflow connection (:mod:`stateops.core.kafka`), never from the registry.

Out: each row a record of ``topic`` (its ``key`` column as the record's key, every column as
the JSON value): at least once, a batch that runs again writes its records again.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from stateops.core.kafka import kafka_settings, spark_options
from stateops.kinds.base import Sink, Source, register_sink, register_source

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

__all__ = ["KAFKA", "KAFKA_SINK"]

CONNECTOR = "spark-sql-kafka"
_SECURITY = ("kafka.sasl.", "kafka.security.", "kafka.ssl.")


class Kafka:
    name = "kafka"
    fields = ("topic", "topics", "bootstrap_servers", "connection")
    connector = CONNECTOR

    def check(self, source: Source) -> None:
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

    def places(self, source: Source) -> list[str]:
        return []

    def stream(self, spark: SparkSession, source: Source) -> DataFrame:
        from pyspark.sql import functions as F

        records = (
            spark.readStream.format("kafka")
            .options(**spark_options(kafka_settings(source.bootstrap_servers, source.connection)))
            .option("subscribe", ",".join(source.subscribed))
            .options(**source.reader_options)
            .load()
        )
        value = F.from_json(F.col("value").cast("string"), source.schema_)
        return records.select(value.alias("value")).select("value.*")


class KafkaSink:
    name = "kafka"
    fields = ("topic", "key", "bootstrap_servers", "connection")
    connector = CONNECTOR

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


KAFKA = register_source(Kafka(), "kafka")
KAFKA_SINK = register_sink(KafkaSink(), "kafka")
