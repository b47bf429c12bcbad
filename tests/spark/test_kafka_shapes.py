"""Every operation on checkpoints Spark wrote reading the embedded broker (issue 42, item 9), for
three shapes (tests/spark/kafka_shapes.py): a transformWithStateInPandas processor, a windowed
aggregation on the HDFS-backed store, and a stream-stream join of a topic with a folder.

Per shape, on a topic of its own, Spark writes the checkpoint once (several batches:
``maxOffsetsPerTrigger``), and the checkpoint model's offsets of every batch (what inspect
reads) equal those of Spark's own ``StreamingQueryProgress``. One copy of it (checkpoint and
output) is cleaned up, then backed up, lost and restored, then repartitioned: after each it
holds the state and output of the untouched original (the control); once more records are
produced, both run again and the copy holds the control's state and has written its output.
The HDFS-backed aggregation's repartition is refused in one line with the checkpoint
byte-identical (Spark repartitions RocksDB state only). Below: format v2 on a topic (the
repartition refused: Spark 4.2 reads v1 only), a Kafka checkpoint on S3 (inspected, backed up
from there, restored), the approval steps, which never look at the source, and last, a
restore refused in one line once retention passed the offsets its backup resumes at."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from stateops.control.approval import OPERATIONS, ApprovalRequest, without_approval
from stateops.control.lock import new_run_id
from stateops.control.target import query_target
from stateops.core.checkpoint import Checkpoint, load_checkpoint
from stateops.core.errors import StateOpsError
from stateops.core.files import relocate_checkpoint
from stateops.core.kafka import parse_offsets
from stateops.core.registry import load_registry
from stateops.core.report import checkpoint_report
from stateops.ops.backup import backup_checkpoint
from stateops.ops.cleanup import run_cleanup
from stateops.ops.repartition import run_repartition
from stateops.ops.restore import format_restore_plan, plan_restore, restore_backup, run_restore
from tests.conftest import tree_digest
from tests.spark.harness import (
    copy_query,
    in_session,
    run_in_session,
    state_and_output,
)
from tests.spark.kafka_shapes import (
    PER_TRIGGER,
    SHAPES,
    kafka_registry,
    land_events,
    run_with_progress,
    visits,
)

pytestmark = [pytest.mark.spark, pytest.mark.whole]

ROUND0, ROUND1 = 30, 10  # records produced before the operations, and after them
quiet = lambda _: None  # noqa: E731
# The events are stamped weeks ago (brokers refuse the future): the broker's default 7-day
# retention would delete them within seconds (its check runs every 5 s).
KEEP = {"retention.ms": "-1"}


def held_and_written(spark, registry: Path, name: str) -> tuple:
    """(state checksums, the output of each batch that wrote any, in order): a repartition's
    batch reads no input and writes nothing, so batch ids after it are one more."""
    _, state, output = state_and_output(spark, registry, name)
    return state, [rows for _, rows in sorted(output.items()) if rows]


@dataclass
class Story:
    name: str
    registry: Path  # the control's
    touched: Path  # the copy's, which every operation acts on in turn
    topic: str
    progress: list[dict]  # Spark's progress events of the run that wrote the checkpoint
    inspected: Checkpoint  # the checkpoint that run left
    control: tuple = ()  # (state, output) of the control before round 1
    done: dict[str, object] = field(default_factory=dict)  # operation -> its result
    after: dict[str, tuple] = field(default_factory=dict)  # operation -> (state, output)
    continued: dict[str, tuple] = field(default_factory=dict)  # after round 1: both


def operate(spark, s3, registry: Path, name: str, op: str) -> object:
    """``op`` on registered query ``name``: its result, or the refusal (nothing changed)."""
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
        return manifest, plan
    before = tree_digest(Path(target.checkpoint))
    try:
        return run_repartition(
            target,
            3,
            run_id=new_run_id("repartition"),
            log=quiet,
            submit=in_session(spark, registry),
        )
    except StateOpsError as err:  # refused: nothing changed
        assert tree_digest(Path(target.checkpoint)) == before
        return err


def written_once(
    spark, kafka, root: Path, name: str, **state_store: object
) -> tuple[Story, Callable[[], None]]:
    """``name`` on a topic of its own written by Spark (the control), a copy of it (to be
    touched), and what produces round 1."""
    topic = kafka.create_topic(f"D-{root.name}", partitions=2, **KEEP)
    events = root / "events"
    kafka.produce(topic, visits(0, ROUND0))
    land_events(events, 0, ROUND0 // 2, "round0-a")
    land_events(events, ROUND0 // 2, ROUND0 // 2, "round0-b")
    control = kafka_registry(root / "control", topic, events, **state_store)
    progress = run_with_progress(spark, control, name)
    inspected = load_checkpoint(load_registry(control).query(name).checkpoint)
    touched = kafka_registry(root / "touched", topic, events, **state_store)
    copy_query(control, touched, name)
    story = Story(name, control, touched, topic, progress, inspected)
    story.control = held_and_written(spark, control, name)

    def round1() -> None:
        kafka.produce(topic, visits(ROUND0, ROUND1))
        land_events(events, ROUND0, ROUND1, "round1")

    return story, round1


def go_on(spark, story: Story, round1: Callable[[], None]) -> None:
    """More records, then the control and the touched copy run again."""
    round1()
    for what, registry in (("control", story.registry), ("touched", story.touched)):
        run_in_session(spark, registry, story.name)
        story.continued[what] = held_and_written(spark, registry, story.name)


@pytest.fixture(scope="module", params=list(SHAPES))
def story(request, spark, kafka, s3, tmp_path_factory) -> Story:
    """Per shape: the control, and the copy cleaned up, backed up, lost and restored, and
    repartitioned in turn (each compared with the control as it goes), both run on round 1."""
    name = request.param
    story, round1 = written_once(spark, kafka, tmp_path_factory.mktemp(name), name)
    for op in ("cleanup", "restore", "repartition"):
        story.done[op] = operate(spark, s3, story.touched, name, op)
        story.after[op] = held_and_written(spark, story.touched, name)
    go_on(spark, story, round1)
    return story


def offsets_match_progress(story: Story) -> list[int]:
    """Asserts that every batch's offsets, as inspect reads them, are those of Spark's
    progress event of that batch; the records read up to each batch."""
    cp = story.inspected
    batches = {p["batchId"]: p for p in story.progress}
    assert sorted(cp.commits) == sorted(cp.offsets) == sorted(batches), (
        sorted(cp.commits),
        sorted(batches),
    )
    read = []
    for batch, progress in sorted(batches.items()):
        entry = cp.offsets[batch].source_offsets
        assert len(entry) == len(progress["sources"])
        for i, source in enumerate(progress["sources"]):
            spark_says = source["endOffset"]
            if "Kafka" in source["description"]:
                ours = parse_offsets(entry[i])
                assert ours == parse_offsets(spark_says) and ours, (batch, i, entry[i], spark_says)
                read.append(sum(ours[story.topic].values()))
            else:  # the join's folder
                assert entry[i] == spark_says, (batch, i, entry[i], spark_says)
    return read


def test_inspect_offsets_equal_spark_s_progress_of_every_batch(story: Story):
    read = offsets_match_progress(story)
    # Batch by batch the offsets go forward, up to every record of the topic.
    assert len(read) >= ROUND0 // PER_TRIGGER, f"too few batches to prove anything: {read}"
    assert read == sorted(read) and read[-1] == ROUND0 and read[0] <= PER_TRIGGER, read


def test_cleanup_leaves_the_state_of_the_untouched_query(story: Story):
    plan = story.done["cleanup"]
    assert plan["delete"]["files"] > 0, "cleanup had nothing to delete: the proof is void"
    assert story.after["cleanup"] == story.control


def test_a_lost_checkpoint_restored_from_its_backup_holds_the_untouched_state(story: Story):
    manifest, plan = story.done["restore"]
    # the broker was asked whether it still holds what the restored checkpoint reads next
    assert plan["input_retained"] == "yes", plan
    assert "input: still held from the backup's offsets on" in format_restore_plan(plan)
    assert manifest["batch_id"] == max(p["batchId"] for p in story.progress), manifest
    assert story.after["restore"] == story.control


def test_repartition_keeps_the_state_or_refuses_the_hdfs_store_in_one_line(story: Story):
    done = story.done["repartition"]
    if SHAPES[story.name] == "page_counts":  # the HDFS-backed store
        assert isinstance(done, StateOpsError), done
        assert "Spark repartitions RocksDB state only" in str(done) and "\n" not in str(done)
        # The replay it advises is a topic's (a folder's was advised): read from the first.
        assert "with its topics still holding every record from the first" in str(done)
        assert "`startingOffsets: earliest`" in str(done) and "input file" not in str(done)
    else:
        assert isinstance(done, dict) and done["proof"]["ok"], done
        assert (done["partitions_before"], done["partitions"]) == (2, 3)
        assert load_registry(story.touched).query(story.name).shuffle_partitions == 3
    assert story.after["repartition"] == story.control


def test_after_every_operation_more_records_go_on_like_the_untouched_query(story: Story):
    control, touched = story.continued["control"], story.continued["touched"]
    assert control[0] != story.control[0], "round 1 changed no state: the proof is void"
    assert touched == control


def test_the_approval_steps_ask_about_a_kafka_query_as_about_any(story: Story, s3):
    """Approval is decided by the registry's ``approval`` and worded from the operation's
    plan; neither looks at the source: a Kafka query asks (or not) like a folder's."""
    query = load_registry(story.touched).query(story.name)
    asks = query.model_copy(update={"approval": "required"})
    assert all(without_approval(asks, op) is None for op in OPERATIONS)
    assert "without approval" in without_approval(query, "repartition")
    restore = plan_restore(
        story.name, s3.client(), registry=load_registry(story.touched), replace=True
    )
    request = ApprovalRequest(asks, "replace it", format_restore_plan(restore, dry_run=False), "b")
    assert restore["backup"]["backup_id"] in request.body("nothing changes")
    assert "input: still held from the backup's" in request.body("nothing changes")


# Format v2 (RocksDB, ``checkpoint_format: 2``) on a topic, and the checkpoint on S3.
BUCKET = "d-kafka-checkpoints"


@pytest.fixture(scope="module")
def v2(spark, kafka, s3, tmp_path_factory) -> Story:
    """kafka_visits in format v2: cleaned up; uploaded to S3, inspected there, backed up from
    there and restored over the lost local copy; the repartition refused; then round 1."""
    name = "kafka_visits"
    story, round1 = written_once(
        spark, kafka, tmp_path_factory.mktemp("v2"), name, checkpoint_format=2
    )
    s3.client().create_bucket(Bucket=BUCKET)
    checkpoint = Path(load_registry(story.touched).query(name).checkpoint)
    with pytest.MonkeyPatch.context() as mp:
        for key, value in s3.env().items():
            mp.setenv(key, value)
        story.done["cleanup"] = operate(spark, s3, story.touched, name, "cleanup")
        url = s3.upload(checkpoint, BUCKET, "v2")
        local, remote = load_checkpoint(checkpoint), load_checkpoint(url)
        story.done["s3"] = (local.offsets, remote.offsets, checkpoint_report(remote, 2))
        manifest = backup_checkpoint(url, f"s3://backups/{BUCKET}-v2", s3.client(), log=quiet)
        shutil.rmtree(checkpoint)
        restore_backup(
            f"s3://backups/{BUCKET}-v2/{manifest['backup_id']}", checkpoint, s3.client(), log=quiet
        )
        relocate_checkpoint(checkpoint)
        story.done["restore"] = manifest
    story.after["restore"] = held_and_written(spark, story.touched, name)
    story.done["repartition"] = operate(spark, s3, story.touched, name, "repartition")
    go_on(spark, story, round1)
    return story


def test_format_v2_on_a_topic_runs_and_every_operation_works_or_refuses(v2: Story):
    assert v2.inspected.format_version == 2
    assert offsets_match_progress(v2)[-1] == ROUND0
    assert v2.done["cleanup"]["delete"]["files"] > 0
    assert v2.after["restore"] == v2.control
    refused = v2.done["repartition"]
    assert isinstance(refused, StateOpsError), refused
    assert "checkpoint format v2: repartition reads format v1 only" in str(refused)
    assert v2.continued["touched"] == v2.continued["control"]


def test_a_kafka_checkpoint_on_s3_is_inspected_backed_up_and_restored(v2: Story):
    local, remote, report = v2.done["s3"]
    assert remote == local and any(parse_offsets(e.source_offsets[0]) for e in remote.values())
    assert report["checkpoint"].startswith("s3://") and report["format_version"] == 2
    # the backup taken from S3 restored the state (compared above) and went on (below)
    assert v2.continued["touched"] == v2.continued["control"]


def test_a_restore_whose_offsets_the_broker_no_longer_holds_is_refused_in_one_line(
    v2: Story, kafka, s3
):
    """Run last: retention passes the offsets the v2 backup resumes at, on one partition."""
    name, manifest = v2.name, v2.done["restore"]
    checkpoint = Path(load_registry(v2.touched).query(name).checkpoint)
    resumes = parse_offsets(v2.inspected.offsets[manifest["batch_id"]].source_offsets[0])
    partition, offset = sorted(resumes[v2.topic].items())[0]
    kafka.delete_records(v2.topic, {partition: offset + 1})
    before = tree_digest(checkpoint)
    url = f"s3://backups/{BUCKET}-v2/{manifest['backup_id']}"
    with pytest.raises(StateOpsError) as refused:
        plan_restore(
            url, s3.client(), to=checkpoint, registry=load_registry(v2.touched), replace=True
        )
    text = str(refused.value)
    assert f"{v2.topic}[{partition}] offsets {offset}..{offset} deleted" in text, text
    assert "no longer holds" in text and "\n" not in text, text
    assert tree_digest(checkpoint) == before
