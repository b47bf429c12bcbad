"""Files in a folder in (json, parquet, csv: Spark's file source), and a folder of per-batch
folders out.

In: Spark's file source logs the files each batch read (``sources/<i>/<batch>``) and counts its
own log entries in the offsets (``{"logOffset": K}``).

Out: batch K of the checkpoint writes ``<path>/batch_id=K+batch_offset`` (overwritten when a
batch runs again: exactly once per batch id); readers skip the folders that start with ``_``
(``_rolled_back``, where a rollback sets later batches aside).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from stateops.core.storage import spark_url
from stateops.kinds.base import Sink, Source, register_sink, register_source

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

__all__ = ["FILES", "FOLDER"]


class Files:
    name = "files"
    fields = ("path",)
    connector = None

    def check(self, source: Source) -> None:
        if not source.path:
            raise ValueError(f"a {source.format} source reads a folder: give its path")

    def where(self, source: Source) -> str:
        return source.path

    def places(self, source: Source) -> list[str]:
        return [source.path]

    def stream(self, spark: SparkSession, source: Source) -> DataFrame:
        reader = spark.readStream.format(source.format).schema(source.schema_)
        return reader.options(**source.reader_options).load(source.path)


class Folder:
    name = "folder"
    fields = ("path", "batch_offset")
    connector = None

    def check(self, sink: Sink) -> None:
        if not sink.path:
            raise ValueError(f"a {sink.format} sink writes a folder: give its path")

    def where(self, sink: Sink) -> str:
        return sink.path

    def places(self, sink: Sink) -> list[str]:
        return [sink.path]

    def write(self, df: DataFrame, batch_id: int, sink: Sink) -> None:
        df.write.mode("overwrite").format(sink.format).save(
            f"{spark_url(sink.path)}/batch_id={sink.folder_batch(batch_id)}"
        )


FILES = register_source(Files(), "json", "parquet", "csv")
FOLDER = register_sink(Folder(), "parquet", "json")
