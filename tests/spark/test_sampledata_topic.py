"""The demo's events on a topic (``python -m stateops.dev.sampledata --topic``): the same
records as the landing files, the user as key, the event time as the record's timestamp. Needs
the session broker only (no Spark)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import datetime

import pytest

from stateops.core.kafka import kafka_settings
from stateops.dev.sampledata import generate_events, produce_events

pytestmark = pytest.mark.spark


def _consume(bootstrap: str, topic: str, count: int) -> list:
    from confluent_kafka import Consumer

    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": topic, "auto.offset.reset": "earliest"}
    )
    consumer.subscribe([topic])
    records = []
    try:
        for _ in range(100):
            records += [m for m in consumer.consume(count, timeout=0.5) if m.error() is None]
            if len(records) >= count:
                break
    finally:
        consumer.close()
    return records


def kafka_env(kafka) -> dict[str, str]:
    return {**os.environ, **kafka.env()}


def test_a_round_on_a_topic_is_the_round_of_the_landing_files(kafka, tmp_path):
    topic = "E-sampledata-round"
    count = produce_events(
        kafka_settings(kafka.bootstrap_servers),
        topic,
        partitions=3,
        events_per_file=20,
        users=7,
        files=2,
        round_=1,
    )
    files = generate_events(
        {"page_visits": tmp_path}, events_per_file=20, users=7, files=2, round_=1
    )
    expected = [
        json.loads(line) for p in files["page_visits"] for line in p.read_text().splitlines()
    ]
    assert count == len(expected) == 40
    assert sum(kafka.offsets(topic, "latest").values()) == 40
    records = _consume(kafka.bootstrap_servers, topic, 40)
    values = [json.loads(m.value()) for m in records]
    assert sorted(values, key=json.dumps) == sorted(expected, key=json.dumps)
    assert {m.partition() for m in records} == {0, 1, 2}
    for message, value in zip(records, values, strict=True):
        assert message.key().decode() == value["user_id"]
        stamp = datetime.fromisoformat(value["event_time"].replace("Z", "+00:00"))
        assert message.timestamp()[1] == int(stamp.timestamp() * 1000)


def test_the_command_fills_a_missing_topic_once_and_names_a_broker_that_is_down(kafka):
    topic = "E-sampledata-once"
    command = [
        sys.executable,
        "-m",
        "stateops.dev.sampledata",
        "--topic",
        topic,
        "--files",
        "1",
        "--events",
        "10",
        "--if-missing",
    ]
    first = subprocess.run(command, capture_output=True, text=True, env=kafka_env(kafka))
    assert first.returncode == 0, first.stderr
    assert first.stdout.startswith(f"10 page_visits events (round 0) to {topic}: end offsets ")
    again = subprocess.run(command, capture_output=True, text=True, env=kafka_env(kafka))
    assert (again.returncode, again.stdout) == (0, "")
    assert sum(kafka.offsets(topic, "latest").values()) == 10
    down = {
        **kafka_env(kafka),
        "STATEOPS_KAFKA_BOOTSTRAP_SERVERS": "127.0.0.1:9",
        "STATEOPS_KAFKA_TIMEOUT": "1",
    }
    refused = subprocess.run(command, capture_output=True, text=True, env=down)
    assert refused.returncode == 2
    assert refused.stderr.startswith("error: Kafka at 127.0.0.1:9 does not answer")
    assert refused.stderr.count("\n") == 1
