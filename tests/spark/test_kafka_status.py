"""Kafka offsets in the checkpoint model, ``inspect``, ``verify`` and ``status``, on one
checkpoint Spark wrote reading the embedded broker (written once for the module): the offsets
equal Spark's own progress of each batch, the lag equals the broker's end minus the committed
offsets, retention passing a committed offset FAILs, a broker that is down is one line."""

from __future__ import annotations

import json
import shutil
import socket
from pathlib import Path

import pytest

from stateops.core.checkpoint import load_checkpoint
from stateops.core.formats import hadoop_crc
from stateops.core.kafka import parse_offsets
from stateops.core.registry import load_registry
from stateops.core.report import checkpoint_report, format_report
from stateops.core.verify import verify_checkpoint
from stateops.spark.streaming import apply_query_conf, start_query
from stateops.status import format_status, query_status
from tests.conftest import run_cli, tree_digest, write_registry
from tests.spark.harness import _registered_conf, quiesce

pytestmark = pytest.mark.spark

T0 = 1_790_000_000_000  # epoch ms of the first record (in the past: brokers refuse the future)
SCHEMA = "user_id STRING, page STRING, event_time TIMESTAMP"


def visits(n: int, start: int = 0) -> list[tuple[str, dict, int]]:
    out = []
    for i in range(start, start + n):
        value = {"user_id": f"u{i % 5}", "page": f"/p{i % 7}", "event_time": (T0 // 1000) + i}
        out.append((f"u{i % 5}", value, T0 + i * 1000))
    return out


def source(topic: str, **extra) -> dict:
    return {
        "format": "kafka",
        "topic": topic,
        "schema": SCHEMA,
        "options": {"startingOffsets": "earliest", "maxOffsetsPerTrigger": 10},
        **extra,
    }


def as_ints(raw: dict) -> dict[str, dict[int, int]]:
    return {t: {int(p): int(o) for p, o in ps.items()} for t, ps in raw.items()}


def _parsed(offsets: str | dict | None) -> dict:
    """A progress event's offsets: the JSON its source reported (parsed in its ``json``)."""
    return json.loads(offsets) if isinstance(offsets, str) else offsets or {}


@pytest.fixture(scope="module")
def written(spark, kafka, tmp_path_factory):
    """A topic of 2 partitions read in 3 batches (30 records, 10 a batch) by a registered
    processor, Spark's progress of each batch kept; then 7 more records the checkpoint has not
    read (the lag)."""
    root = tmp_path_factory.mktemp("a-kafka-status")
    topic = kafka.create_topic("a-status-visits", partitions=2)
    kafka.produce(topic, visits(30))
    registry = write_registry(root, page_visits={"source": source(topic)})
    query = load_registry(registry).query("page_visits")
    _registered_conf(spark)
    apply_query_conf(spark, query)
    running = start_query(spark, query, available_now=True)
    try:
        running.awaitTermination(120)
        progress = [json.loads(p.json) for p in running.recentProgress]
    finally:
        running.stop()
        quiesce(spark)
    kafka.produce(topic, visits(7, start=30))
    # Batch id -> (start, end) offsets Spark itself reported (idle triggers read nothing).
    batches = {
        p["batchId"]: (
            as_ints(_parsed(p["sources"][0]["startOffset"])),
            as_ints(_parsed(p["sources"][0]["endOffset"])),
        )
        for p in progress
        if p["numInputRows"]
    }
    return {
        "root": root,
        "registry": registry,
        "topic": topic,
        "checkpoint": Path(query.checkpoint),
        "batches": batches,
    }


def test_inspect_shows_each_batch_offsets_as_spark_reported_them(written):
    cp = load_checkpoint(written["checkpoint"])
    spark_said = written["batches"]
    assert len(spark_said) == 3 and max(cp.commits) == max(spark_said), spark_said
    report = checkpoint_report(cp)
    [kafka] = report["progress"]
    assert (kafka["source"], kafka["kind"]) == (0, "kafka")
    batches = {b: parse_offsets(raw) for b, raw in kafka["batches"].items()}
    assert batches == {b: end for b, (_, end) in spark_said.items()}
    # sources/0/0: where the query started the topic (earliest; Spark's progress of batch 0
    # reports no start offsets)
    assert kafka["initial"] == {written["topic"]: {0: 0, 1: 0}}

    proc = run_cli("inspect", str(written["checkpoint"]), "--json", check=True)
    assert json.loads(proc.stdout)["progress"] == json.loads(json.dumps(report["progress"]))
    text = format_report(report)
    topic = written["topic"]
    assert f"kafka 0     started at {topic}[0]=0 {topic}[1]=0" in text, text
    for b, (_, end) in spark_said.items():
        assert f"  batch {b}  {topic}[0]={end[topic][0]} {topic}[1]={end[topic][1]}" in text


def test_status_lag_is_the_broker_end_minus_the_committed_offsets(written, kafka):
    topic = written["topic"]
    end = kafka.offsets(topic, "latest")
    assert sum(end.values()) == 37
    committed = written["batches"][max(written["batches"])][1][topic]
    expected = {p: end[p] - committed[p] for p in end}
    assert sum(expected.values()) == 7

    status = query_status(load_registry(written["registry"]), "page_visits")
    [part] = status["positions"]
    assert part["committed"] == {topic: committed}
    assert part["lag"] == {topic: expected} and part["lag_total"] == 7
    assert part["end"] == {topic: end} and not status["errors"]
    text = format_status(status)
    assert f"  kafka source    topic {topic}, lag 7 records" in text, text
    for p in end:
        assert (
            f"    {topic}[{p}]  committed {committed[p]}  end {end[p]}  lag {expected[p]}" in text
        )


def test_status_fails_once_retention_passed_a_committed_offset(written, kafka, tmp_path):
    topic = written["topic"]
    committed = written["batches"][max(written["batches"])][1][topic]
    end = kafka.offsets(topic, "latest")
    assert committed[0] + 2 <= end[0] and committed[1] < end[1], (committed, end)
    registry = load_registry(written["registry"])
    before = tree_digest(written["checkpoint"])

    # Partition 1: the earliest retained offset reaches the committed one (margin 0, records
    # unread): WARN, and not yet lost.
    kafka.delete_records(topic, {1: committed[1]})
    status = query_status(registry, "page_visits")
    assert status["health"]["verdict"] == "WARN", status["health"]
    [close] = [r for r in status["health"]["reasons"] if r.startswith("kafka source: ")]
    assert f"{topic}[1] committed offset {committed[1]} is 0 records ahead" in close, close

    # Partition 0: retention passes the committed offset by 2 records: FAIL, naming them.
    kafka.delete_records(topic, {0: committed[0] + 2})
    status = query_status(registry, "page_visits")
    assert status["health"]["verdict"] == "FAIL", status["health"]
    [lost] = [r for r in status["health"]["reasons"] if "retention passed" in r]
    assert f"{topic}[0] offsets {committed[0]}..{committed[0] + 1} were deleted" in lost, lost
    assert status["positions"][0]["margin"][topic][0] == -2
    proc = run_cli("status", "page_visits", "--registry", str(written["registry"]), "--no-backups")
    assert proc.returncode == 1 and "FAIL" in proc.stdout.splitlines()[0], proc.stdout
    assert tree_digest(written["checkpoint"]) == before, "status writes nothing"


def _rewrite_offsets(checkpoint: Path, batch: int, change) -> None:
    """Change a Kafka source's entry in ``offsets/<batch>`` (its checksum sidecar kept valid,
    so the offsets are the one fault)."""
    path = checkpoint / "offsets" / str(batch)
    lines = path.read_text().split("\n")
    entry = as_ints(json.loads(lines[2]))
    change(entry)
    lines[2] = json.dumps({t: {str(p): o for p, o in ps.items()} for t, ps in entry.items()})
    path.write_text("\n".join(lines))
    crc = checkpoint / "offsets" / f".{batch}.crc"
    if crc.exists():
        crc.write_bytes(hadoop_crc(path.read_bytes()))


def test_verify_names_offsets_that_go_back_and_a_lost_partition(written, tmp_path):
    topic = written["topic"]
    assert verify_checkpoint(written["checkpoint"])["ok"], "Spark's own checkpoint is sound"
    last = max(written["batches"])
    before = written["batches"][last - 1][1][topic]

    back = tmp_path / "back"
    shutil.copytree(written["checkpoint"], back)
    _rewrite_offsets(back, last, lambda e: e[topic].update({0: before[0] - 1}))
    result = verify_checkpoint(back)
    assert not result["ok"]
    assert [(f["path"], f["problem"]) for f in result["findings"]] == [
        (
            f"offsets/{last}",
            f"Kafka source 0: {topic}[0] goes back from {before[0]} to {before[0] - 1} "
            f"since batch {last - 1}",
        )
    ]

    gone = tmp_path / "gone"
    shutil.copytree(written["checkpoint"], gone)
    _rewrite_offsets(gone, last, lambda e: e[topic].pop(1))
    proc = run_cli("verify", str(gone))
    assert proc.returncode == 1
    assert (
        f"ERROR    offsets/{last}: Kafka source 0: {topic}[1] is gone since batch {last - 1}"
        in proc.stdout.splitlines()
    ), proc.stdout


def dead_broker() -> str:
    """host:port of a port nothing listens on."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"


def status_of(registry: Path, *args: str):
    """``stateops status page_visits`` without backups, brokers given 2 s to answer."""
    return run_cli(
        "status",
        "page_visits",
        "--registry",
        str(registry),
        "--no-backups",
        *args,
        env={"STATEOPS_KAFKA_TIMEOUT": "2"},
    )


def test_status_with_the_broker_down_is_one_line_and_the_rest_is_shown(written, tmp_path):
    dead = dead_broker()
    checkpoint = tmp_path / "ckpt"
    shutil.copytree(written["checkpoint"], checkpoint)
    registry = write_registry(
        tmp_path,
        page_visits={
            "source": source(written["topic"], bootstrap_servers=dead),
            "checkpoint": str(checkpoint),
        },
    )
    proc = status_of(registry)
    assert proc.returncode == 1 and "Traceback" not in proc.stdout + proc.stderr, proc.stderr
    out = proc.stdout
    last = max(written["batches"])
    assert f"  last committed  batch {last} at " in out and "  operator 0 " in out, out
    assert (
        "  kafka source    topic a-status-visits, lag unknown (see the status's errors)" in out
    ), out
    [error] = [line for line in out.splitlines() if line.startswith("  error: ")]
    assert error.startswith(f"  error: kafka source: Kafka at {dead} does not answer"), error


def test_status_of_a_never_run_query_says_why_a_run_refuses_it(kafka, tmp_path):
    """Not 'no committed batch yet' alone: its topic is missing (or its broker is down), and
    the run refuses it at once; a topic that is there is the plain WARN."""
    dead = dead_broker()
    topic = kafka.create_topic("a-status-never-run")
    for given, says in (
        (source("a-status-no-such-topic"), "topic 'a-status-no-such-topic' does not exist"),
        (source(topic, bootstrap_servers=dead), f"Kafka at {dead} does not answer"),
    ):
        registry = write_registry(tmp_path, page_visits={"source": given})
        proc = status_of(registry, "--json")
        assert proc.returncode == 1, proc.stderr
        health = json.loads(proc.stdout)[0]["health"]
        assert health["verdict"] == "FAIL", health
        (reason,) = [r for r in health["reasons"] if "a run refuses to start it" in r]
        assert says in reason, reason
    registry = write_registry(tmp_path, page_visits={"source": source(topic)})
    status = query_status(load_registry(registry), "page_visits")
    assert status["refused"] is None
    assert "no committed batch yet (stream_start runs it)" in status["health"]["reasons"]
