"""Spark's own example examples/src/main/python/sql/streaming/structured_kafka_wordcount.py as
a registered query's transform: the example's lines that follow its ``lines`` unchanged; its
``lines`` (the topic's values as strings) is the registry's source ``lines`` (``format:
kafka``, ``encoding: raw``, ``schema: "value STRING"``)."""

from pyspark.sql.functions import explode, split


def build(spark, inputs):
    lines = inputs["lines"]
    # fmt: off

    # Split the lines into words
    words = lines.select(
        # explode turns each item in an array into a separate row
        explode(
            split(lines.value, ' ')
        ).alias('word')
    )

    # Generate running word count
    wordCounts = words.groupBy('word').count()
    # fmt: on
    return wordCounts
