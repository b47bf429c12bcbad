"""A sink of the user's own (``sink: {function: module:write, undo: module:undo}``, a SQLite
store): each batch given to the function with its id; rolled back 3 batches (its undo called)
and reprocessed, the store equals the untouched run's; the same query without an undo is
refused in one line, the checkpoint and the store unchanged."""

from __future__ import annotations

import shutil
import sqlite3
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from stateops.control.target import query_target
from stateops.core.checkpoint import load_checkpoint
from stateops.core.errors import StateOpsError
from stateops.core.plans import BackupFirst
from stateops.ops.backfill import plan_backfill, report_backfill, rollback_for_backfill
from tests.conftest import tree_digest, write_registry
from tests.spark.harness import USER_CODE, copy_checkpoint, read_state, run_in_session
from tests.spark.test_kafka_rollback import READS, visits

# The whole proof's; the gate's proof of the kind is tests/unit/test_function_sink.py.
pytestmark = [pytest.mark.spark, pytest.mark.whole]

SINK = {"function": "sqlite_sink:write", "undo": "sqlite_sink:undo"}


def registry_of(root: Path, topic: str, sink: dict, **more) -> Path:
    source = {
        "format": "kafka",
        "topic": topic,
        "schema": "user_id STRING, page STRING, event_time TIMESTAMP",
        "options": {"startingOffsets": "earliest", "maxOffsetsPerTrigger": 10},
    }
    path = write_registry(root, page_visits={"source": source, "sink": sink, **more})
    raw = yaml.safe_load(path.read_text())
    raw["code_paths"] = [str(USER_CODE)]
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


def store(path: Path) -> list[tuple]:
    with sqlite3.connect(path) as db:
        return sorted(db.execute("SELECT batch, row FROM out"))


@dataclass(frozen=True)
class Run:
    checkpoint: Path
    store: Path
    topic: str
    k: int


@pytest.fixture(scope="module")
def run(spark, kafka, tmp_path_factory) -> Run:
    root = tmp_path_factory.mktemp("function-sink")
    topic = kafka.create_topic("function-sink-in", partitions=2, **{"retention.ms": "-1"})
    registry = registry_of(root, topic, SINK)
    kafka.produce(topic, visits(30))
    mp = pytest.MonkeyPatch()
    mp.setenv("STORE", str(root / "store.db"))
    try:
        run_in_session(spark, registry, "page_visits", "--mode", "available-now")
        k = load_checkpoint(root / "checkpoints" / "page_visits").last_committed_batch
        kafka.produce(topic, visits(30, start=30))
        run_in_session(spark, registry, "page_visits", "--mode", "available-now")
    finally:
        mp.undo()
    assert {b for b, _ in store(root / "store.db")} == set(range(k + 4)), "each batch, its id"
    return Run(root / "checkpoints" / "page_visits", root / "store.db", topic, k)


def _copy(run: Run, into: Path, sink: dict) -> tuple[Path, Path, Path]:
    checkpoint = copy_checkpoint(run.checkpoint, into / "checkpoint")
    shutil.copy(run.store, into / "store.db")
    registry = registry_of(into, run.topic, sink, checkpoint=str(checkpoint))
    return registry, checkpoint, into / "store.db"


def test_rolled_back_and_reprocessed_the_store_equals_the_untouched_runs(
    spark, run, tmp_path, monkeypatch
):
    registry, checkpoint, copied = _copy(run, tmp_path, SINK)
    monkeypatch.setenv("STORE", str(copied))
    target, lines = query_target(registry, "page_visits"), []
    plan = plan_backfill(target, "backfill-f1", to_batch=run.k, dry_run=False, log=lines.append)
    assert f"  sink: sqlite_sink:undo({run.k}) removes the later batches' output" in lines[0]
    rolled = rollback_for_backfill(target, plan, backup=BackupFirst(plan["backup_to"], lambda: "b"))
    assert {b for b, _ in store(copied)} == set(range(run.k + 1)), "undo(k) removed the rest"
    run_in_session(spark, registry, "page_visits", "--mode", "available-now", "--run-id",
                   plan["run_id"])  # fmt: skip
    report_backfill(target, plan, rolled, log=lines.append)
    assert load_checkpoint(checkpoint).last_committed_batch == run.k + 3
    assert store(copied) == store(run.store)
    assert read_state(spark, checkpoint, READS) == read_state(spark, run.checkpoint, READS)


def test_without_an_undo_the_rollback_is_refused_changing_nothing(spark, run, tmp_path):
    registry, checkpoint, copied = _copy(run, tmp_path, {"function": "sqlite_sink:write"})
    before = (tree_digest(checkpoint), copied.read_bytes())
    target = query_target(registry, "page_visits")
    with pytest.raises(StateOpsError) as refused:
        plan_backfill(target, "backfill-f2", to_batch=run.k, dry_run=False, log=lambda _: None)
    message = str(refused.value)
    assert "\n" not in message
    assert message.startswith("sink function sqlite_sink:write has no undo")
    assert "name it as the sink's undo (module:function); nothing changed" in message
    assert (tree_digest(checkpoint), copied.read_bytes()) == before
