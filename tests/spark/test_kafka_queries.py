"""Registered queries reading Kafka (the embedded broker): the registry's ``format: kafka``
source runs the existing processors unchanged, and the checkpoint records its offsets."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from stateops.core.checkpoint import load_checkpoint
from tests.conftest import run_cli, write_registry
from tests.spark.harness import read_sink, run_in_session

pytestmark = pytest.mark.spark

T0 = 1_790_000_000_000  # epoch ms of the first event (in the past: brokers refuse the future)


def visits(n: int, start: int = 0) -> list[tuple[str, dict, int]]:
    """``n`` page visits of 5 users, one a second from T0 + ``start`` s."""
    out = []
    for i in range(start, start + n):
        user = f"u{i % 5}"
        stamp = T0 + i * 1000
        iso = f"{stamp // 1000}"
        value = {"user_id": user, "page": f"/p{i % 7}", "event_time": int(iso)}
        out.append((user, value, stamp))
    return out


def kafka_registry(root: Path, topic: str) -> Path:
    source = {
        "format": "kafka",
        "topic": topic,
        "schema": "user_id STRING, page STRING, event_time TIMESTAMP",
        "options": {"startingOffsets": "earliest", "maxOffsetsPerTrigger": 10},
    }
    return write_registry(root, page_visits={"source": source})


def test_a_processor_reads_a_topic_and_the_checkpoint_holds_its_offsets(spark, kafka, tmp_path):
    topic = kafka.create_topic("visits-smoke", partitions=2)
    kafka.produce(topic, visits(25))
    registry = kafka_registry(tmp_path, topic)

    summary = run_in_session(spark, registry, "page_visits", "--mode", "available-now")

    checkpoint = load_checkpoint(tmp_path / "checkpoints" / "page_visits")
    last = max(checkpoint.commits)
    end = kafka.offsets(topic)
    assert sum(end.values()) == 25
    # the last committed batch read every record: the next offset of each partition is its end
    read = checkpoint.offsets[last].source_offsets[0]
    assert read == {topic: {str(p): o for p, o in end.items()}}
    assert summary["input_rows"] == 25
    output = read_sink(tmp_path / "output" / "page_visits")
    final = {}
    for batch in sorted(output):
        for row in output[batch]:
            final[row[0]] = row[1]
    assert final == {f"u{u}": 5 for u in range(5)}, json.dumps(summary)


@pytest.mark.parametrize(
    "where, says",
    [
        ({"topic": "k-no-such-topic"}, "topic 'k-no-such-topic' does not exist on 127.0.0.1:"),
        (
            {"topic": "k-any", "bootstrap_servers": "127.0.0.1:9"},
            "Kafka at 127.0.0.1:9 does not answer",
        ),
    ],
    ids=["missing-topic", "broker-down"],
)
def test_a_run_on_a_missing_topic_or_a_broker_down_is_refused_in_one_line(
    kafka, tmp_path, no_jvm, where, says
):
    """Before any JVM starts: one line, exit 2, nothing written."""
    source = {"format": "kafka", "schema": "user_id STRING, page STRING, event_time TIMESTAMP"}
    registry = write_registry(tmp_path, page_visits={"source": source | where})
    proc = run_cli("--registry", str(registry), "run", "page_visits", "--master", "local[1]")
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.count("\n") == 1 and says in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "checkpoints").exists()
    assert no_jvm() == []
