"""Rollback and backfill of a query reading a Kafka topic and writing one (the embedded broker,
checkpoints Spark wrote in the shared session): the plan shows the offsets each source rewinds
to, a rollback 3 batches back and reprocessed continues to the untouched run's state and output,
a rollback past the broker's retention or with the broker down is refused in one line with
the checkpoint byte-identical, and the records a Kafka sink gets again must be confirmed."""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import pytest

from stateops.control.audit import read_audit
from stateops.control.target import query_target
from stateops.core.checkpoint import load_checkpoint
from stateops.core.errors import StateOpsError
from stateops.core.kafka import offsets_text, parse_offsets
from stateops.core.plans import BackupFirst
from stateops.ops.backfill import (
    backfill_point,
    plan_backfill,
    report_backfill,
    rollback_for_backfill,
)
from tests.conftest import run_cli, tree_digest, write_registry
from tests.spark.harness import copy_checkpoint, read_state, run_in_session

pytestmark = pytest.mark.spark

T0 = 1_790_000_000_000  # epoch ms of the first event (in the past: brokers refuse the future)
READS = [{"stateVarName": "pages"}, {"stateVarName": "count"}]


def visits(n: int, start: int = 0) -> list[tuple[str, dict, int]]:
    """``n`` page visits of 5 users, one a second from T0 + ``start`` s."""
    return [
        (
            f"u{i % 5}",
            {"user_id": f"u{i % 5}", "page": f"/p{i % 7}", "event_time": T0 // 1000 + i},
            T0 + i * 1000,
        )
        for i in range(start, start + n)
    ]


def entry(root: Path, in_topic: str, out_topic: str, **more) -> dict:
    """page_visits reading ``in_topic`` (10 records a batch) and writing ``out_topic``."""
    source = {
        "format": "kafka",
        "topic": in_topic,
        "schema": "user_id STRING, page STRING, event_time TIMESTAMP",
        "options": {"startingOffsets": "earliest", "maxOffsetsPerTrigger": 10},
        **more,
    }
    return {"source": source, "sink": {"format": "kafka", "topic": out_topic, "key": "user_id"}}


def read_topic(kafka, topic: str, start: dict[int, int], end: dict[int, int]) -> list[str]:
    """The values of ``topic``'s records from ``start`` to ``end`` (per partition), sorted."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer(
        {
            "bootstrap.servers": kafka.bootstrap_servers,
            "group.id": "b-kafka-rollback",
            "enable.auto.commit": False,
            "log_level": 0,
        }
    )
    consumer.assign([TopicPartition(topic, p, start.get(p, 0)) for p in end])
    wanted, found = sum(end[p] - start.get(p, 0) for p in end), []
    deadline = time.time() + 30
    while len(found) < wanted and time.time() < deadline:
        message = consumer.poll(1.0)
        if (
            message is not None
            and not message.error()
            and message.offset() < end[message.partition()]
        ):
            found.append(message.value().decode())
    consumer.close()
    assert len(found) == wanted, f"{topic}: read {len(found)} of {wanted} records"
    return sorted(found)


@dataclass(frozen=True)
class Run:
    """The untouched run: batches 0..k read the first 30 records, k+1..k+3 the next 30."""

    registry: Path
    checkpoint: Path
    in_topic: str
    out_topic: str
    k: int
    input_at_k: dict[int, int]  # the input topic's end once batch k had read everything
    output_at_k: dict[int, int]  # the sink topic's end after batch k
    output_end: dict[int, int]  # the sink topic's end after the last batch


@pytest.fixture(scope="module")
def run(spark, kafka, tmp_path_factory) -> Run:
    root = tmp_path_factory.mktemp("b-kafka-rollback")
    # Kept for good: the records are stamped months ago, and the broker's default retention
    # (7 days, by record time) deletes them at its next check.
    in_topic = kafka.create_topic("b-rollback-in", partitions=2, **{"retention.ms": "-1"})
    out_topic = kafka.create_topic("b-rollback-out", partitions=2)
    registry = write_registry(root, page_visits=entry(root, in_topic, out_topic))
    kafka.produce(in_topic, visits(30))
    run_in_session(spark, registry, "page_visits", "--mode", "available-now")
    checkpoint = root / "checkpoints" / "page_visits"
    k = load_checkpoint(checkpoint).last_committed_batch
    input_at_k, output_at_k = kafka.offsets(in_topic), kafka.offsets(out_topic)
    kafka.produce(in_topic, visits(30, start=30))
    run_in_session(spark, registry, "page_visits", "--mode", "available-now")
    assert load_checkpoint(checkpoint).last_committed_batch == k + 3, "10 records a batch"
    return Run(
        registry,
        checkpoint,
        in_topic,
        out_topic,
        k,
        input_at_k,
        output_at_k,
        kafka.offsets(out_topic),
    )


def test_rollback_3_batches_and_reprocess_continue_to_the_untouched_run(
    spark, kafka, run, tmp_path
):
    copy = copy_checkpoint(run.checkpoint, tmp_path / "copy")
    out = kafka.create_topic("b-rollback-reprocessed", partitions=2)
    registry = write_registry(
        tmp_path, page_visits={**entry(tmp_path, run.in_topic, out), "checkpoint": str(copy)}
    )
    # The backfill's steps (stateops.ops.backfill.run_backfill less its Great Expectations run,
    # which costs half a minute and knows nothing of Kafka): rollback 3, reprocess, report.
    target, lines = query_target(registry, "page_visits"), []
    plan = plan_backfill(target, "backfill-b1", to_batch=run.k, dry_run=False, log=lines.append)
    # offsets/k: where the first run's last batch had read to, the input topic's end then
    rewound = {run.in_topic: run.input_at_k}
    assert plan["rewinds"] == [
        {
            "source": 0,
            "where": f"topic {run.in_topic}",
            "line": f"rewinds to {offsets_text(rewound)}; 30 records read again",
            "offsets": rewound,
            "reads_again": 30,
            "missing": "",
        }
    ]
    assert (
        f"  source 0 (topic {run.in_topic}): rewinds to {offsets_text(rewound)}; "
        "30 records read again" in lines[0].splitlines()
    )
    rolled = rollback_for_backfill(
        target, plan, backup=BackupFirst(plan["backup_to"], lambda: "b-1")
    )
    assert load_checkpoint(copy).last_committed_batch == run.k
    # the DAG's reprocess task: the backfill's own run (its hold admits no other)
    run_in_session(spark, registry, "page_visits", "--mode", "available-now", "--run-id",
                   plan["run_id"])  # fmt: skip
    report = report_backfill(target, plan, rolled, log=lines.append)
    assert load_checkpoint(copy).last_committed_batch == run.k + 3
    assert read_state(spark, copy, READS) == read_state(spark, run.checkpoint, READS)
    # the reprocessed batches wrote what the untouched run's last 3 batches wrote
    again = read_topic(kafka, out, {}, kafka.offsets(out))
    assert again == read_topic(kafka, run.out_topic, run.output_at_k, run.output_end)
    assert report["records_written"] == len(again) and report["records_written_before"] == 0
    assert read_audit(copy)[-1]["output"] == {
        "records_written": len(again),
        "records_written_before": 0,
    }


def test_a_kafka_sink_rewrite_is_confirmed_and_the_backfill_window_reads_record_times(
    kafka, run, tmp_path, monkeypatch
):
    copy = copy_checkpoint(run.checkpoint, tmp_path / "copy")
    registry = write_registry(
        tmp_path,
        page_visits={**entry(tmp_path, run.in_topic, run.out_topic), "checkpoint": str(copy)},
    )
    # Counted apart: the sink topic's records written after batch k, by the run that wrote them.
    n = sum(run.output_end[p] - run.output_at_k[p] for p in run.output_end)
    assert n > 0
    args = (
        "--registry",
        str(registry),
        "rollback",
        "page_visits",
        "--to-batch",
        str(run.k),
        "--no-backup",
    )
    dry = run_cli(*args, "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert f"rewinds to {offsets_text({run.in_topic: run.input_at_k})}" in dry.stdout
    assert f"reprocessing writes again the {n} records batches {run.k + 1} on wrote" in dry.stdout
    assert f"confirm with --rewrite-output {n}" in dry.stdout

    before = tree_digest(copy)
    for extra in ((), ("--rewrite-output", str(n + 1))):
        refused = run_cli(*args, *extra)
        assert refused.returncode == 2 and len(refused.stderr.splitlines()) == 1, refused.stderr
        assert f"confirm with --rewrite-output {n} " in refused.stderr
        assert refused.stderr.rstrip().endswith("nothing changed")
        assert tree_digest(copy) == before

    # The backfill: the same figure, the same refusal, the window of a time on record stamps.
    target = query_target(registry, "page_visits")
    plan = plan_backfill(target, "b-1", to_batch=run.k, dry_run=True, log=lambda _: None)
    assert plan["rewrites"]["records"] == n and plan["rewinds"][0]["offsets"] == {
        run.in_topic: run.input_at_k
    }
    with pytest.raises(StateOpsError, match=f"confirm with --rewrite-output {n} "):
        plan_backfill(target, "b-1", to_batch=run.k, dry_run=False, log=lambda _: None)
    plan_backfill(
        target, "b-1", to_batch=run.k, rewrite_output=n, dry_run=False, log=lambda _: None
    )
    # the stream_backfill DAG's plan step: its rewrite_output field must match
    from airflow.sdk.exceptions import AirflowFailException

    from stateops_airflow.tasks import backfill_plan

    monkeypatch.setenv("STATEOPS_REGISTRY", str(registry))
    params = {"query": "page_visits", "to_batch": run.k, "dry_run": False}
    with pytest.raises(AirflowFailException, match=f"rewrite_output {n}"):
        backfill_plan({**params, "rewrite_output": n - 1}, "manual__b")
    assert backfill_plan({**params, "rewrite_output": n}, "manual__b")["rewrites"]["records"] == n
    second_chunk = datetime.fromtimestamp((T0 + 30 * 1000) / 1000, UTC).strftime(
        "%Y-%m-%dT%H:%M:%SZ"
    )
    assert backfill_point(target.registry, "page_visits", None, second_chunk) == run.k
    assert tree_digest(copy) == before

    done = run_cli(*args, "--rewrite-output", str(n))
    assert done.returncode == 0, done.stderr
    assert load_checkpoint(copy).last_committed_batch == run.k


def test_a_rollback_past_retention_is_refused_in_one_line(kafka, run, monkeypatch):
    cp = load_checkpoint(run.checkpoint)
    # Retention passes batch k-1's offsets: rolling back to k still works, to k-1 no longer.
    at_k, before_k = (
        parse_offsets(cp.offsets[b].source_offsets[0])[run.in_topic] for b in (run.k, run.k - 1)
    )
    kafka.delete_records(run.in_topic, at_k)
    gone = [
        f"{run.in_topic}[{p}] offsets {before_k[p]}..{at_k[p] - 1}"
        for p in sorted(at_k)
        if before_k[p] < at_k[p]
    ]
    assert gone
    before = tree_digest(run.checkpoint)
    args = (
        "--registry",
        str(run.registry),
        "rollback",
        "page_visits",
        "--to-batch",
        str(run.k - 1),
        "--no-backup",
    )
    refused = run_cli(*args, "--rewrite-output", "1")
    assert refused.returncode == 2 and len(refused.stderr.splitlines()) == 1, refused.stderr
    lost = f"refused, nothing changed: topic {run.in_topic} no longer holds what the query"
    assert lost in refused.stderr
    for missing in gone:
        assert missing in refused.stderr
    assert tree_digest(run.checkpoint) == before

    target = query_target(run.registry, "page_visits")
    with pytest.raises(StateOpsError, match=f"topic {run.in_topic} no longer holds what") as err:
        plan_backfill(target, "b-2", to_batch=run.k - 1, dry_run=True, log=lambda _: None)
    assert all(missing in str(err.value) for missing in gone)
    # the stream_backfill DAG's plan step: the same refusal, in one line
    from airflow.sdk.exceptions import AirflowFailException

    from stateops_airflow.tasks import backfill_plan

    monkeypatch.setenv("STATEOPS_REGISTRY", str(run.registry))
    params = {"query": "page_visits", "to_batch": run.k - 1, "dry_run": True}
    with pytest.raises(AirflowFailException) as failed:
        backfill_plan(params, "manual__b")
    assert "\n" not in str(failed.value) and all(m in str(failed.value) for m in gone)
    assert tree_digest(run.checkpoint) == before


def test_a_broker_that_does_not_answer_is_refused_in_one_line(kafka, run, tmp_path, monkeypatch):
    from stateops.core import kafka as kafka_module
    from stateops.dev.s3server import free_port

    down = f"127.0.0.1:{free_port()}"
    registry = write_registry(
        tmp_path,
        page_visits={
            **entry(tmp_path, run.in_topic, run.out_topic, bootstrap_servers=down),
            "checkpoint": str(run.checkpoint),
        },
    )
    before = tree_digest(run.checkpoint)
    refused = run_cli(
        "--registry",
        str(registry),
        "rollback",
        "page_visits",
        "--to-batch",
        str(run.k),
        "--no-backup",
        env={"STATEOPS_KAFKA_TIMEOUT": "1"},
    )
    assert refused.returncode == 2 and len(refused.stderr.splitlines()) == 1, refused.stderr
    assert (
        f"Kafka at {down} does not answer" in refused.stderr and "Traceback" not in refused.stderr
    )
    assert tree_digest(run.checkpoint) == before

    monkeypatch.setattr(kafka_module, "TIMEOUT", 1.0)
    with pytest.raises(
        StateOpsError, match=f"refused, nothing changed: .*Kafka at {down} does not answer"
    ):
        plan_backfill(
            query_target(registry, "page_visits"),
            "b-3",
            to_batch=run.k,
            dry_run=True,
            log=lambda _: None,
        )
    assert tree_digest(run.checkpoint) == before
