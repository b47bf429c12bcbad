"""A topic's values as they are: Spark's own structured_kafka_wordcount as a registered query
on text values (``encoding: raw``), Avro values (``encoding: avro``), and values that do not
decode, never silently null: counted and skipped (``malformed: count``, which the run's
summary and the status report), or the run fails on them (the default)."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
import yaml

from stateops.core.registry import load_registry
from tests.conftest import run_cli, write_registry
from tests.spark.harness import USER_CODE, job_in_session, read_sink, run_in_session
from tests.spark.test_kafka_queries import T0, kafka_source, visits

pytestmark = pytest.mark.spark

LINES = [
    "the quick brown fox",
    "jumps over the lazy dog",
    "the dog sleeps",
    "a fox a dog a cat",
]


def _with_query(root: Path, name: str, entry: dict) -> Path:
    path = write_registry(root)
    raw = yaml.safe_load(path.read_text())
    raw["queries"][name] = {
        "shuffle_partitions": 2,
        "sink": {"format": "parquet", "path": f"output/{name}"},
        "checkpoint": f"checkpoints/{name}",
        **entry,
    }
    raw["code_paths"] = [str(USER_CODE)]
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


def test_sparks_kafka_wordcount_counts_every_word_of_a_text_topic(spark, kafka, tmp_path):
    topic = kafka.create_topic("wordcount-lines", partitions=2)
    kafka.produce(topic, [(None, line, T0 + i) for i, line in enumerate(LINES)])
    registry = _with_query(
        tmp_path,
        "word_counts",
        {
            "sources": {
                "lines": {
                    "format": "kafka",
                    "topic": topic,
                    "encoding": "raw",
                    "schema": "value STRING",
                    "options": {"startingOffsets": "earliest", "maxOffsetsPerTrigger": 2},
                }
            },
            "transform": {"function": "wordcount:build", "output_mode": "update"},
            "key_columns": ["word"],
        },
    )
    summary = run_in_session(spark, registry, "word_counts", "--mode", "available-now")
    assert summary["input_rows"] == len(LINES) and summary["malformed_records"] == 0
    counts: dict[str, int] = {}
    for batch in sorted(output := read_sink(tmp_path / "output" / "word_counts")):
        counts.update(dict(output[batch]))  # update mode: a word's newest count wins
    assert len(output) == summary["batches_run"] > 1, "read in several batches"
    assert counts == Counter(word for line in LINES for word in line.split(" "))


def _json_topic(kafka, name: str) -> tuple[str, int]:
    """A topic of :func:`visits` with values between them that are not JSON objects (text, an
    empty value, a tombstone, JSON's null): (topic, their count)."""
    topic = kafka.create_topic(name, partitions=1)
    records = visits(12)
    bad = [
        ("u9", "not json", T0 + 500),
        ("u9", "{truncated", T0 + 600),
        ("u9", "", T0 + 700),
        ("u9", None, T0 + 800),  # a tombstone
        ("u9", "null", T0 + 900),
    ]
    kafka.produce(topic, records[:6] + bad + records[6:])
    return topic, len(bad)


def test_json_values_that_do_not_parse_are_counted_skipped_and_reported(spark, kafka, tmp_path):
    topic, bad = _json_topic(kafka, "visits-malformed-count")
    source = {**kafka_source(topic), "malformed": "count"}
    registry = write_registry(tmp_path, with_kafka=True, kafka_visits={"source": source})
    summary = run_in_session(spark, registry, "kafka_visits", "--mode", "available-now")
    assert summary["status"] == "succeeded"
    assert (summary["input_rows"], summary["malformed_records"]) == (12 + bad, bad)
    rows = [r for batch in read_sink(tmp_path / "output" / "kafka_visits").values() for r in batch]
    assert {r[0] for r in rows} == {f"u{u}" for u in range(5)}, "no row of a null user"
    [status] = json.loads(
        run_cli("--registry", str(registry), "status", "kafka_visits", "--json").stdout
    )
    said = [f for f in status["health"]["findings"] if f["rule"] == "malformed"]
    assert said and said[0]["level"] == "WARN" and f"skipped {bad} records" in said[0]["reason"]


def test_by_default_a_json_value_that_does_not_parse_fails_the_run(spark, kafka, tmp_path):
    topic, _ = _json_topic(kafka, "visits-malformed-fail")
    registry = write_registry(
        tmp_path, with_kafka=True, kafka_visits={"source": kafka_source(topic)}
    )
    query = load_registry(registry).query("kafka_visits")
    assert query.source.malformed is None  # the default: fail
    code, out = job_in_session(
        spark, "run_query.py", "--registry", str(registry), "--query", "kafka_visits"
    )
    summary = json.loads(out.strip().splitlines()[-1])
    assert code != 0 and summary["status"] == "failed"
    assert summary["error"].startswith("a record did not parse as its source's schema")
    assert summary["last_committed_batch"] is None and summary["malformed_records"] == 0


def test_two_counting_sources_of_one_query_are_each_counted(spark, kafka, tmp_path):
    """Spark refuses one observed metric name on two DataFrames: each source has its own."""
    (a, bad_a), (b, bad_b) = (_json_topic(kafka, f"visits-malformed-{n}") for n in "ab")
    source = {"malformed": "count", "schema": "user_id STRING, page STRING"}
    registry = _with_query(
        tmp_path,
        "union_counts",
        {
            "sources": {n: {**kafka_source(topic), **source} for n, topic in (("a", a), ("b", b))},
            "transform": {"function": "union_counts:build", "output_mode": "update"},
            "key_columns": ["user_id"],
        },
    )
    summary = run_in_session(spark, registry, "union_counts", "--mode", "available-now")
    assert summary["malformed_records"] == bad_a + bad_b
    counts: dict[str, int] = {}
    for batch in sorted(output := read_sink(tmp_path / "output" / "union_counts")):
        counts.update(dict(output[batch]))
    assert counts == {f"u{u}": 2 * 12 // 5 + (2 if u < 12 % 5 else 0) for u in range(5)}


VISIT_AVRO = {
    "type": "record",
    "name": "Visit",
    "fields": [
        {"name": "user_id", "type": "string"},
        {"name": "page", "type": "string"},
        {"name": "event_time", "type": {"type": "long", "logicalType": "timestamp-millis"}},
    ],
}


def _avro(spark, records: list[tuple[str, dict, int]]) -> list[bytes]:
    """:func:`visits`' values as Spark's own ``to_avro`` writes them with VISIT_AVRO."""
    from pyspark.sql import functions as F
    from pyspark.sql.avro.functions import to_avro

    rows = [(v["user_id"], v["page"], v["event_time"] * 1000) for _, v, _ in records]
    df = spark.createDataFrame(rows, "user_id STRING, page STRING, ms BIGINT")
    record = F.struct(
        F.coalesce("user_id", F.lit("")).alias("user_id"),  # not null, as the schema says
        F.coalesce("page", F.lit("")).alias("page"),
        F.coalesce(F.timestamp_millis("ms"), F.timestamp_millis(F.lit(0))).alias("event_time"),
    )
    values = df.select(to_avro(record, json.dumps(VISIT_AVRO)).alias("v")).collect()
    return [bytes(r.v) for r in values]


@pytest.mark.whole
def test_avro_values_read_as_the_same_events_in_json_and_bad_ones_are_counted_or_fail(
    spark, kafka, tmp_path
):
    """The same 12 visits as JSON values and as Avro values (Spark's ``to_avro``), with 3
    values between them that do not decode (a negative length, a record cut short, a
    tombstone): counted, the Avro run's output is the JSON run's; not counted, the run fails
    on them and commits nothing."""
    events = visits(12)
    json_topic = kafka.create_topic("visits-as-json", partitions=1)
    kafka.produce(json_topic, events)
    values = _avro(spark, events)
    bad = [
        ("u9", b"\x01", T0 + 500),  # a string's length, zigzag -1
        ("u9", values[0][:-2], T0 + 600),  # the time cut short
        ("u9", None, T0 + 700),  # a tombstone
    ]
    good = [(key, value, stamp) for (key, _, stamp), value in zip(events, values, strict=True)]
    avro_topic = kafka.create_topic("visits-as-avro", partitions=1)
    kafka.produce(avro_topic, good[:6] + bad + good[6:])
    one_batch = {"options": {"startingOffsets": "earliest"}}
    avro = {**kafka_source(avro_topic), **one_batch, "encoding": "avro", "avro_schema": VISIT_AVRO}

    outputs = []
    for name, source in (
        ("json", {**kafka_source(json_topic), **one_batch}),
        ("avro", {**avro, "malformed": "count"}),
    ):
        registry = write_registry(tmp_path / name, with_kafka=True, kafka_visits={"source": source})
        summary = run_in_session(spark, registry, "kafka_visits", "--mode", "available-now")
        assert summary["status"] == "succeeded", summary
        outputs.append((summary, read_sink(tmp_path / name / "output" / "kafka_visits")))
    (json_run, json_rows), (avro_run, avro_rows) = outputs
    assert (json_run["input_rows"], json_run["malformed_records"]) == (12, 0)
    assert (avro_run["input_rows"], avro_run["malformed_records"]) == (12 + len(bad), len(bad))
    assert avro_rows == json_rows and json_rows, "the same rows, batch for batch"

    registry = write_registry(tmp_path / "fail", with_kafka=True, kafka_visits={"source": avro})
    code, out = job_in_session(
        spark, "run_query.py", "--registry", str(registry), "--query", "kafka_visits"
    )
    summary = json.loads(out.strip().splitlines()[-1])
    assert code != 0 and summary["status"] == "failed"
    assert summary["error"].startswith("a record did not parse as its source's schema"), summary
    assert summary["last_committed_batch"] is None
