"""Every operation on checkpoints Spark wrote reading the embedded broker (issue 42, item 9), for
three shapes (tests/spark/kafka_shapes.py): a transformWithStateInPandas processor, a windowed
aggregation on the HDFS-backed store, and a stream-stream join of a topic with a folder.

Per shape, Spark writes the checkpoint once (several batches: ``maxOffsetsPerTrigger``), and
``inspect``'s offsets of every batch equal those of Spark's own ``StreamingQueryProgress``.
Copies of it (checkpoint and output) are cleaned up, backed up and restored (into a lost
checkpoint), and repartitioned; each holds the state of the untouched original (the control),
and once more records are produced, each run again holds the state and has written the output
of the control run again on the same input. The HDFS-backed aggregation's repartition is
refused in one line with the checkpoint byte-identical (Spark repartitions RocksDB only).
Format v2 on a topic, a Kafka checkpoint on S3 (inspect, backup, restore) and the approval
steps are below."""

from __future__ import annotations

import shutil
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from stateops.control.lock import new_run_id
from stateops.control.target import query_target
from stateops.core.checkpoint import Checkpoint, load_checkpoint
from stateops.core.errors import StateOpsError
from stateops.core.registry import load_registry
from stateops.core.sources import kafka_offsets
from stateops.core.steps import REPARTITION_STATE
from stateops.ops.backup import backup_checkpoint
from stateops.ops.cleanup import run_cleanup
from stateops.ops.repartition import run_repartition
from stateops.ops.restore import plan_restore, run_restore
from tests.conftest import tree_digest
from tests.spark.harness import (
    copy_checkpoint,
    job_in_session,
    run_in_session,
    state_and_output,
)
from tests.spark.kafka_shapes import (
    SHAPES,
    kafka_registry,
    land_events,
    run_with_progress,
    visits,
)

pytestmark = pytest.mark.spark

ROUND0, ROUND1 = 40, 20  # records produced before the operations, and after them
OPERATIONS_RUN = ("cleanup", "restore", "repartition")
quiet = lambda _: None  # noqa: E731
# The events are stamped weeks ago (brokers refuse the future): the broker's default 7-day
# retention would delete them within seconds (its check runs every 5 s).
KEEP = {"retention.ms": "-1"}


def in_session(spark):
    """``submit`` for :func:`run_repartition`: the job's main in the shared session."""

    def submit(plan: dict) -> None:
        code, out = job_in_session(
            spark, REPARTITION_STATE, "--checkpoint", plan["checkpoint"], "--run-id", plan["run_id"]
        )
        assert code == 0, out

    return submit


def held_and_written(spark, registry: Path, name: str) -> tuple:
    """(state checksums, the output of each batch that wrote any, in order): a repartition's
    batch reads no input and writes nothing, so batch ids after it are one more."""
    _, state, output = state_and_output(spark, registry, name)
    return state, [rows for _, rows in sorted(output.items()) if rows]


@dataclass
class Story:
    name: str
    registry: Path  # the control's
    topic: str
    progress: list[dict]  # Spark's progress events of the run that wrote the checkpoint
    inspected: Checkpoint | None = None  # the checkpoint that run left
    copies: dict[str, Path] = field(default_factory=dict)  # operation -> its copy's registry
    done: dict[str, object] = field(default_factory=dict)  # operation -> its result
    after_operation: dict[str, tuple] = field(default_factory=dict)
    control: tuple = ()  # (state, output) of the control before round 1
    continued: dict[str, tuple] = field(default_factory=dict)  # after round 1, control too


def copy_query(control: Path, dest: Path, name: str) -> None:
    old, new = load_registry(control).query(name), load_registry(dest).query(name)
    copy_checkpoint(Path(old.checkpoint), Path(new.checkpoint))
    shutil.copytree(old.sink.path, new.sink.path)


def operate(spark, s3, story: Story, op: str) -> object:
    """``op`` on the copy of ``story``'s query (its registry ``story.copies[op]``)."""
    registry, name = story.copies[op], story.name
    target = query_target(registry, name)
    if op == "cleanup":
        return run_cleanup(target, 2, run_id=new_run_id("cleanup"), log=quiet)
    if op == "restore":  # backed up, then lost, then restored from the backup
        manifest = backup_checkpoint(
            target.checkpoint, target.backup_location(), s3.client(), log=quiet
        )
        shutil.rmtree(target.checkpoint)
        plan = plan_restore(
            name, s3.client(), backup=manifest["backup_id"], registry=load_registry(registry)
        )
        run_restore(plan, s3.client(), registry=load_registry(registry), log=quiet)
        return manifest
    before = tree_digest(Path(target.checkpoint))
    try:
        return run_repartition(
            target, 3, run_id=new_run_id("repartition"), log=quiet, submit=in_session(spark)
        )
    except StateOpsError as err:  # refused: nothing changed
        assert tree_digest(Path(target.checkpoint)) == before
        return err


@pytest.fixture(scope="module", params=list(SHAPES))
def story(request, spark, kafka, s3, tmp_path_factory) -> Story:
    name = request.param
    root = tmp_path_factory.mktemp(f"kafka-{name}")
    topic = kafka.create_topic(f"D-shapes-{name}", partitions=2, **KEEP)
    events = root / "events"
    kafka.produce(topic, visits(0, ROUND0))
    land_events(events, 0, ROUND0 // 2, "round0-a")
    land_events(events, ROUND0 // 2, ROUND0 // 2, "round0-b")
    control = kafka_registry(root / "control", topic, events)
    story = Story(name, control, topic, run_with_progress(spark, control, name))
    story.inspected = load_checkpoint(load_registry(control).query(name).checkpoint)
    story.control = held_and_written(spark, control, name)
    for op in OPERATIONS_RUN:
        story.copies[op] = kafka_registry(root / op, topic, events)
        copy_query(control, story.copies[op], name)
        story.done[op] = operate(spark, s3, story, op)
        story.after_operation[op] = held_and_written(spark, story.copies[op], name)

    kafka.produce(topic, visits(ROUND0, ROUND1))
    land_events(events, ROUND0, ROUND1, "round1")
    for what, registry in {"control": control, **story.copies}.items():
        run_in_session(spark, registry, name)
        story.continued[what] = held_and_written(spark, registry, name)
    return story


def test_inspect_offsets_equal_spark_s_progress_of_every_batch(story: Story):
    cp = story.inspected
    batches = {p["batchId"]: p for p in story.progress}
    assert sorted(cp.commits) == sorted(cp.offsets) == sorted(batches), (
        sorted(cp.commits),
        sorted(batches),
    )
    assert len(batches) >= ROUND0 // 10, "too few batches to prove anything"
    read = []
    for batch, progress in sorted(batches.items()):
        entry = cp.offsets[batch].source_offsets
        assert len(entry) == len(progress["sources"])
        for i, source in enumerate(progress["sources"]):
            spark_says = source["endOffset"]
            if "Kafka" in source["description"]:
                ours = kafka_offsets(entry[i])
                assert ours == kafka_offsets(spark_says) and ours, (batch, i, entry[i], spark_says)
                read.append(sum(ours[story.topic].values()))
            else:  # the join's folder
                assert entry[i] == spark_says, (batch, i, entry[i], spark_says)
    # Batch by batch the offsets go forward, up to every record of the topic.
    assert read == sorted(read) and read[-1] == ROUND0 and read[0] <= 10, read


def test_cleanup_then_a_restart_goes_on_like_the_untouched_query(story: Story):
    plan = story.done["cleanup"]
    assert plan["delete"]["files"] > 0, "cleanup had nothing to delete: the proof is void"
    assert story.after_operation["cleanup"] == story.control
    assert story.continued["cleanup"] == story.continued["control"]


def test_backup_and_restore_then_a_restart_go_on_like_the_untouched_query(story: Story):
    manifest = story.done["restore"]
    assert manifest["batch_id"] == max(p["batchId"] for p in story.progress), manifest
    assert story.after_operation["restore"] == story.control
    assert story.continued["restore"] == story.continued["control"]


def test_repartition_goes_on_like_the_untouched_query_or_refuses_hdfs(story: Story):
    done = story.done["repartition"]
    if SHAPES[story.name] == "page_counts":  # the HDFS-backed store
        assert isinstance(done, StateOpsError), done
        assert "Spark repartitions RocksDB state only" in str(done) and "\n" not in str(done)
        assert story.continued["repartition"] == story.continued["control"]
        return
    assert isinstance(done, dict) and done["proof"]["ok"], done
    assert (done["partitions_before"], done["partitions"]) == (2, 3)
    copy = load_registry(story.copies["repartition"]).query(story.name)
    assert copy.shuffle_partitions == 3
    assert story.after_operation["repartition"] == story.control
    assert story.continued["repartition"] == story.continued["control"]
