"""A Kafka-to-Delta stateful query (the embedded broker, a Delta table Spark wrote): each batch
appended exactly once under the writer's application id; a rollback 3 batches back restores
the table with Delta's own RESTORE and a new application id, and the reprocessing continues to
the untouched run's table and state; a backfill with a changed option reports the rows it
changed; a table another writer appended to after the point is refused, the checkpoint and
the table byte-identical."""

from __future__ import annotations

import json
import shutil
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import pytest

from stateops.control.target import query_target
from stateops.core.checkpoint import load_checkpoint
from stateops.core.errors import StateOpsError
from stateops.core.plans import BackupFirst
from stateops.ops.backfill import plan_backfill, report_backfill, rollback_for_backfill
from tests.conftest import S3A_BUCKET, tree_digest, write_registry
from tests.spark.harness import copy_checkpoint, job_in_session, read_state, run_in_session
from tests.spark.test_kafka_rollback import READS, visits

pytestmark = pytest.mark.spark


def entry(topic: str, table: Path | str, **more) -> dict:
    """page_visits reading ``topic`` (10 records a batch) and writing the Delta table
    ``table``."""
    source = {
        "format": "kafka",
        "topic": topic,
        "schema": "user_id STRING, page STRING, event_time TIMESTAMP",
        "options": {"startingOffsets": "earliest", "maxOffsetsPerTrigger": 10},
    }
    return {"source": source, "sink": {"format": "delta", "path": str(table)}, **more}


def rows(spark, table: Path | str, version: int | None = None) -> Counter:
    """The table's rows (at ``version``: Delta's time travel), counted."""
    reader = spark.read.format("delta")
    if version is not None:
        reader = reader.option("versionAsOf", version)
    return Counter(tuple(r) for r in reader.load(str(table)).collect())


def commits(spark, table: Path) -> list[dict]:
    """Delta's own history of the table (its DataFrame API), oldest first: version,
    operation, the txn's batch of a streaming write, userMetadata."""
    jvm = spark._jvm
    from pyspark.sql import DataFrame

    found = DataFrame(
        jvm.io.delta.tables.DeltaTable.forPath(spark._jsparkSession, str(table)).history(),
        spark,
    ).collect()
    return sorted(
        (
            {
                "version": r["version"],
                "operation": r["operation"],
                "metadata": r["userMetadata"],
                "parameters": dict(r["operationParameters"] or {}),
            }
            for r in found
        ),
        key=lambda c: c["version"],
    )


def txn_batches(table: Path) -> list[tuple[str, int]]:
    """(application id, batch) of each commit's Delta transaction, in version order."""
    found = []
    for log in sorted((table / "_delta_log").glob("*.json")):
        for line in log.read_text().splitlines():
            action = json.loads(line)
            if "txn" in action:
                found.append((action["txn"]["appId"], action["txn"]["version"]))
    return found


@dataclass(frozen=True)
class Run:
    checkpoint: Path
    table: Path
    topic: str
    k: int
    version_at_k: int  # the table's version once batch k committed


@pytest.fixture(scope="module")
def run(spark, kafka, tmp_path_factory) -> Run:
    root = tmp_path_factory.mktemp("delta-sink")
    topic = kafka.create_topic("delta-sink-in", partitions=2, **{"retention.ms": "-1"})
    table = root / "tables" / "page_visits"
    registry = write_registry(root, page_visits=entry(topic, table))
    kafka.produce(topic, visits(30))
    run_in_session(spark, registry, "page_visits", "--mode", "available-now")
    checkpoint = root / "checkpoints" / "page_visits"
    k = load_checkpoint(checkpoint).last_committed_batch
    version_at_k = max(c["version"] for c in commits(spark, table))
    kafka.produce(topic, visits(30, start=30))
    run_in_session(spark, registry, "page_visits", "--mode", "available-now")
    assert load_checkpoint(checkpoint).last_committed_batch == k + 3, "10 records a batch"
    return Run(checkpoint, table, topic, k, version_at_k)


def _copy(run: Run, into: Path, **more) -> tuple[Path, Path, Path]:
    """A copy of the run's checkpoint and table, and a registry of page_visits on them."""
    checkpoint = copy_checkpoint(run.checkpoint, into / "checkpoint")
    table = into / "table"
    shutil.copytree(run.table, table)
    registry = write_registry(
        into, page_visits={**entry(run.topic, table, **more), "checkpoint": str(checkpoint)}
    )
    return registry, checkpoint, table


def test_each_batch_is_one_delta_commit_of_the_writers_application_id(spark, run):
    assert txn_batches(run.table) == [("stateops", b) for b in range(run.k + 4)]
    writes = [c for c in commits(spark, run.table) if c["operation"] == "WRITE"]
    assert len(writes) == run.k + 4


@pytest.mark.whole  # the gate: a folder sink's rollback (test_rollback), this sink's commits
def test_rollback_3_batches_and_reprocess_continue_to_the_untouched_run(spark, run, tmp_path):
    registry, checkpoint, table = _copy(run, tmp_path)
    target, lines = query_target(registry, "page_visits"), []
    plan = plan_backfill(target, "backfill-d1", to_batch=run.k, dry_run=False, log=lines.append)
    latest = max(c["version"] for c in commits(spark, table))
    assert (
        f"  sink {table} (Delta): RESTORE to version {run.version_at_k} (of {latest}), "
        f"undoing batches {run.k + 1}..{run.k + 3} ("
    ) in lines[0]
    rolled = rollback_for_backfill(target, plan, backup=BackupFirst(plan["backup_to"], lambda: "b"))
    # Delta's own RESTORE, then the writer's new application id, both marked as the undo's
    restore, props = commits(spark, table)[-2:]
    assert restore["operation"] == "RESTORE"
    assert restore["parameters"]["version"] == str(run.version_at_k)
    assert props["operation"] == "SET TBLPROPERTIES"
    assert restore["metadata"] == props["metadata"] == f"stateops undo {rolled['run_id']}"
    assert rows(spark, table) == rows(spark, run.table, run.version_at_k)
    assert load_checkpoint(checkpoint).last_committed_batch == run.k

    run_in_session(spark, registry, "page_visits", "--mode", "available-now", "--run-id",
                   plan["run_id"])  # fmt: skip
    report = report_backfill(target, plan, rolled, log=lines.append)
    assert load_checkpoint(checkpoint).last_committed_batch == run.k + 3
    assert rows(spark, table) == rows(spark, run.table)
    assert read_state(spark, checkpoint, READS) == read_state(spark, run.checkpoint, READS)
    new_id = f"stateops-{rolled['run_id']}"
    assert txn_batches(table)[-3:] == [(new_id, b) for b in range(run.k + 1, run.k + 4)]
    undone = rows(spark, run.table) - rows(spark, run.table, run.version_at_k)
    assert (
        report["rows_before"] == report["rows_after"] == report["unchanged"] == sum(undone.values())
    )
    assert (report["added"], report["removed"], report["changed_keys"]) == (0, 0, 0)


@pytest.mark.whole
def test_a_backfill_with_a_changed_option_reports_the_rows_it_changed(spark, run, tmp_path):
    registry, checkpoint, table = _copy(run, tmp_path)
    target, lines = query_target(registry, "page_visits"), []
    plan = plan_backfill(
        target,
        "backfill-d2",
        to_batch=run.k,
        overrides={"processor": {"options": {"max_pages": 2}}},
        dry_run=False,
        log=lines.append,
    )
    rolled = rollback_for_backfill(target, plan, backup=BackupFirst(plan["backup_to"], lambda: "b"))
    job = ("--registry", plan["registry"], "--query", "page_visits", "--mode", "available-now")
    code, _ = job_in_session(spark, "run_query.py", *job, "--run-id", plan["run_id"])
    assert code == 0
    report = report_backfill(target, plan, rolled, log=lines.append)
    # counted apart: the rows the untouched run's last 3 batches wrote, against this run's
    before = rows(spark, run.table) - rows(spark, run.table, run.version_at_k)
    after = rows(spark, table) - rows(spark, table, run.version_at_k)
    changed = {r[0] for r in before - after} & {r[0] for r in after - before}
    assert changed, "max_pages 2 changes distinct_pages of some users"
    assert report["changed_keys"] == len(changed)
    assert (report["rows_before"], report["rows_after"]) == (
        sum(before.values()),
        sum(after.values()),
    )
    assert report["unchanged"] == sum((before & after).values())


@pytest.mark.whole
def test_a_table_another_writer_appended_to_is_refused_changing_nothing(spark, run, tmp_path):
    registry, checkpoint, table = _copy(run, tmp_path)
    spark.createDataFrame([("x", 1, "/p", 1)], "user_id STRING, visits LONG, last_page STRING, "
                          "distinct_pages INT").write.format("delta").mode("append").save(
        str(table)
    )  # fmt: skip
    before = (tree_digest(checkpoint), tree_digest(table))
    target = query_target(registry, "page_visits")
    with pytest.raises(StateOpsError) as refused:
        plan_backfill(target, "backfill-d3", to_batch=run.k, dry_run=False, log=lambda _: None)
    message = str(refused.value)
    assert "\n" not in message and "written by another writer after batch" in message
    assert message.endswith("roll back to a later batch")
    assert (tree_digest(checkpoint), tree_digest(table)) == before
    assert commits(spark, table)[-1]["operation"] == "WRITE"  # the other writer's, last


@pytest.mark.whole
def test_a_table_and_checkpoint_in_s3_roll_back_and_reprocess_to_the_same_rows(
    spark, kafka, s3a_env, tmp_path
):
    """The same story with the checkpoint and the table in S3 (Spark's S3A, the library's
    S3 client for the plan, the undo job's Spark on the rollback's host)."""
    from stateops.core.storage import location

    topic = kafka.create_topic("delta-sink-s3-in", partitions=2, **{"retention.ms": "-1"})
    prefix = f"s3://{S3A_BUCKET}/delta-{tmp_path.name}"
    table_url = f"s3a://{S3A_BUCKET}/delta-{tmp_path.name}/table"
    registry = write_registry(
        tmp_path,
        page_visits={
            **entry(topic, f"{prefix}/table"),
            "checkpoint": f"{prefix}/checkpoint",
        },
    )
    kafka.produce(topic, visits(30))
    run_in_session(spark, registry, "page_visits", "--mode", "available-now")
    k = load_checkpoint(f"{prefix}/checkpoint").last_committed_batch
    at_k = rows(spark, table_url)
    kafka.produce(topic, visits(30, start=30))
    run_in_session(spark, registry, "page_visits", "--mode", "available-now")
    whole = rows(spark, table_url)
    target, lines = query_target(registry, "page_visits"), []
    plan = plan_backfill(target, "backfill-d4", to_batch=k, dry_run=False, log=lines.append)
    assert "(Delta): RESTORE to version " in lines[0]
    rolled = rollback_for_backfill(target, plan, backup=BackupFirst(plan["backup_to"], lambda: "b"))
    assert rows(spark, table_url) == at_k
    run_in_session(spark, registry, "page_visits", "--mode", "available-now", "--run-id",
                   plan["run_id"])  # fmt: skip
    report = report_backfill(target, plan, rolled, log=lines.append)
    assert rows(spark, table_url) == whole
    assert report["unchanged"] == sum((whole - at_k).values()) and report["changed_keys"] == 0
    log = location(f"{prefix}/table") / "_delta_log"
    assert (log / "00000000000000000000.json").exists()
