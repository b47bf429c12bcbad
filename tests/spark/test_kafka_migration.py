"""Source migration with Kafka (issue 42 item 8): topic A -> topic B by either road, and a
folder -> topic, each equal in state and output to one query that read every event from one
topic, stopped and restarted at the cutover (the control). The new topic also holds records
stamped before the cutover (never to be read) and records stamped exactly at it (read once).
The refusals: a missing topic, a cutover the topic no longer retains, a broker that is down,
records left on the old topic after the drain; each in one line, the checkpoint unchanged.
"""

from __future__ import annotations

import json
import os
import re
import time
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path

import pytest
import yaml

from stateops.control.target import query_target
from stateops.core.checkpoint import load_checkpoint
from stateops.core.errors import OperationFailed, StateOpsError
from stateops.core.registry import load_registry
from stateops.ops.migration import format_migration_plan, plan_migration, run_migration
from tests.conftest import run_cli, tree_digest, write_registry
from tests.spark.harness import (
    PAGE_VISITS_READS,
    copy_query,
    job_runner,
    read_sink,
    read_state,
    run_in_session,
)

pytestmark = pytest.mark.spark

T0 = 1_790_000_000_000  # epoch ms of the first event (brokers refuse future timestamps)
CUTOVER = T0 + 30_000
CUTOVER_TEXT = datetime.fromtimestamp(CUTOVER / 1000, UTC).isoformat()
SCHEMA = "user_id STRING, page STRING, event_time TIMESTAMP"
NAME = "page_visits"


def visit(i: int, stamp: int, page: str | None = None) -> tuple[str, dict, int]:
    user = f"u{i % 5}"
    value = {"user_id": user, "page": page or f"/p{i % 7}", "event_time": stamp // 1000}
    return user, value, stamp


OLD = [visit(i, T0 + i * 1000) for i in range(30)]  # before the cutover
# From the cutover on: one visit per user stamped exactly at it, then one a second.
NEW = [visit(i, CUTOVER, "/at-cutover") for i in range(5)] + [
    visit(i, CUTOVER + (i - 29) * 1000) for i in range(30, 50)
]
# On the new topic before the cutover: read, they would count twice.
STALE = [visit(i, T0 + i * 1000, "/stale") for i in range(20, 30)]


# The events are older than the broker's default retention (7 days): kept for good here.
KEEP = {"retention.ms": "-1"}


def kafka_source(topic: str) -> dict:
    return {"format": "kafka", "topic": topic, "schema": SCHEMA}


def from_earliest(topic: str) -> dict:
    """A query's source reading ``topic`` from its first record."""
    return kafka_source(topic) | {"options": {"startingOffsets": "earliest"}}


def registry(root: Path, source: dict) -> Path:
    path = write_registry(root, **{NAME: {"source": source}})
    raw = yaml.safe_load(path.read_text())
    raw["backups"] = {"url": f"s3://backups/{root.name}"}  # not used: no backup here
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


def state_and_output(spark, path: Path) -> tuple[list, Counter]:
    query = load_registry(path).query(NAME)
    state = [
        sorted(re.sub(r", partition_id=\d+\)$", ")", r) for r in rows)
        for rows in read_state(spark, Path(query.checkpoint), PAGE_VISITS_READS)
    ]
    output = Counter(row for rows in read_sink(Path(query.sink.path)).values() for row in rows)
    return state, output


@pytest.fixture(scope="module")
def control(spark, kafka, tmp_path_factory):
    """One topic, read to the cutover, then (restarted) on."""
    root = tmp_path_factory.mktemp("control")
    topic = kafka.create_topic("C-control", **KEEP)
    path = registry(root, from_earliest(topic))
    kafka.produce(topic, OLD)
    run_in_session(spark, path, NAME)
    kafka.produce(topic, NEW)
    run_in_session(spark, path, NAME)
    return state_and_output(spark, path)


def read_old(spark, kafka, root: Path, label: str) -> Path:
    """The old query (its registry under ``root``) has read topic ``C-LABEL-old``, which holds
    the events before the cutover."""
    topic = kafka.create_topic(f"C-{label}-old", **KEEP)
    path = registry(root, from_earliest(topic))
    kafka.produce(topic, OLD)
    run_in_session(spark, path, NAME)
    return path


@pytest.fixture(scope="module")
def old_read(spark, kafka, tmp_path_factory) -> Path:
    """:func:`read_old` once for the tests that migrate from its topic without writing to it:
    each starts from a copy (:func:`old_on_topic`)."""
    return read_old(spark, kafka, tmp_path_factory.mktemp("old"), "shared")


# A cap no batch here reaches: a migration carries the old source's options to the new.
CAP = {"maxOffsetsPerTrigger": 10_000}


def old_on_topic(old_read: Path, root: Path) -> Path:
    """A copy of the old query under ``root``: its registry (the source capped by ``CAP``),
    checkpoint and output."""
    source = from_earliest(load_registry(old_read).query(NAME).source.topic)
    path = registry(root, source | {"options": source["options"] | CAP})
    copy_query(old_read, path, NAME)
    return path


def new_topic(kafka, label: str) -> str:
    topic = kafka.create_topic(f"C-{label}-new", **KEEP)
    kafka.produce(topic, STALE + NEW)
    return topic


def migrate(spark, path: Path, spec: dict, road: str, cutover: str = CUTOVER_TEXT, run_job=None):
    target = query_target(path, NAME)
    plan = plan_migration(target, spec, "", f"mig-{road}", cutover, road)
    return run_migration(
        target,
        plan,
        backup=lambda: "no-backup-in-this-test",
        run_job=run_job or job_runner(spark),
        log=print,
    )


# The gate: the initialState road (the transplant road runs in the gate on files and on S3).
@pytest.mark.parametrize(
    "road", [pytest.param("transplant", marks=pytest.mark.whole), "initial_state"]
)
def test_topic_to_topic_equals_one_topic_restarted_at_the_cutover(
    spark, kafka, tmp_path, control, old_read, road
):
    path = old_on_topic(old_read, tmp_path)
    topic = new_topic(kafka, road)
    at_cutover = kafka.offsets(topic, CUTOVER)
    assert sum(at_cutover.values()) == len(STALE)  # the stale records come first

    spec = kafka_source(topic) | {"start": "cutover"}
    plan = plan_migration(query_target(path, NAME), spec, "", "mig-plan", CUTOVER_TEXT, road)
    assert (
        "  new source options: maxOffsetsPerTrigger=10000 (the old source's); not carried: "
        "startingOffsets (the migration starts the new topic)\n"
    ) in format_migration_plan(plan, dry_run=True)
    lineage = migrate(spark, path, spec, road)

    assert lineage["carry_over"] == road
    query = load_registry(path).query(NAME)
    assert query.source.topic == topic
    assert query.source.options["maxOffsetsPerTrigger"] == CAP["maxOffsetsPerTrigger"]
    new = load_checkpoint(query.checkpoint)
    if road == "transplant":  # the cutover's offsets are written into the new checkpoint
        first = min(b for b in new.offsets if b in new.commits and b + 1 in new.offsets)
        assert new.offsets[first].source_offsets[0] == {
            topic: {str(p): o for p, o in at_cutover.items()}
        }
        assert (Path(query.checkpoint) / "sources/0/0").read_bytes() == b"\x00v1\n" + json.dumps(
            {topic: {str(p): o for p, o in at_cutover.items()}}
        ).encode()
    last = new.offsets[new.last_committed_batch].source_offsets[0]
    assert last == {topic: {str(p): o for p, o in kafka.offsets(topic).items()}}
    assert state_and_output(spark, path) == control


@pytest.mark.whole
def test_folder_to_topic_equals_one_topic_restarted_at_the_cutover(spark, kafka, tmp_path, control):
    landing = tmp_path / "landing" / NAME
    landing.mkdir(parents=True)
    for k in range(3):  # three files, all modified before the cutover
        f = landing / f"part-{k}.json"
        f.write_text("".join(json.dumps(v) + "\n" for _, v, _ in OLD[k * 10 : k * 10 + 10]))
        os.utime(f, (T0 / 1000 + k, T0 / 1000 + k))
    path = registry(
        tmp_path,
        {"format": "json", "path": str(landing), "schema": SCHEMA, "options": {}},
    )
    run_in_session(spark, path, NAME)
    topic = new_topic(kafka, "folder")

    lineage = migrate(spark, path, kafka_source(topic) | {"start": "cutover"}, "transplant")

    assert lineage["carry_over"] == "transplant"
    assert load_registry(path).query(NAME).source.topic == topic
    assert state_and_output(spark, path) == control


@pytest.mark.whole
def test_a_topic_migrates_to_a_delta_table_at_a_cutover_every_event_once(
    spark, tmp_path, control, old_read
):
    """The new source is a Delta table Spark wrote: a version committed before the cutover
    (the stale events: read, they would count twice), then the visits stamped at the cutover
    and the rest, each a version committed after it. The transplant starts the table at the
    first version committed at or after the cutover; state and output equal the control's."""
    path = old_on_topic(old_read, tmp_path)
    table = tmp_path / "tables" / "visits"
    cutover = _stale_then_new(spark, table)
    _migrate_to_table(spark, path, table, cutover)
    assert state_and_output(spark, path) == control


@pytest.mark.whole
def test_a_delta_table_migrates_to_another_at_a_cutover_every_event_once(spark, tmp_path, control):
    """Delta to Delta: the old query read a table (the events before the cutover, one
    version); the new table as above. The old table is read to its end, the new one started
    at the first version committed at or after the cutover; state and output equal the
    control's."""
    old_table, table = tmp_path / "tables" / "old", tmp_path / "tables" / "new"
    _commit(spark, old_table, OLD)
    path = registry(
        tmp_path,
        {"format": "delta", "path": str(old_table), "schema": SCHEMA,
         "options": {"startingVersion": 0}},
    )  # fmt: skip
    run_in_session(spark, path, NAME)
    cutover = _stale_then_new(spark, table)
    _migrate_to_table(spark, path, table, cutover)
    assert state_and_output(spark, path) == control


def _commit(spark, table: Path, records: list) -> None:
    """``records`` (:func:`visit`'s) as one version of the Delta table ``table``."""
    rows = [(v["user_id"], v["page"], v["event_time"]) for _, v, _ in records]
    df = spark.createDataFrame(rows, "user_id STRING, page STRING, seconds BIGINT")
    df = df.selectExpr("user_id", "page", "timestamp_seconds(seconds) AS event_time")
    df.coalesce(1).write.format("delta").mode("append").save(str(table))


def _stale_then_new(spark, table: Path) -> datetime:
    """A version of STALE committed before the returned cutover, then NEW's visits stamped
    at the cutover and the rest, a version each, committed after it."""
    _commit(spark, table, STALE)
    time.sleep(1.5)  # a table's cutover is when its versions were committed
    cutover = datetime.now(UTC)
    time.sleep(1.5)
    _commit(spark, table, NEW[:5])
    _commit(spark, table, NEW[5:])
    return cutover


def _migrate_to_table(spark, path: Path, table: Path, cutover: datetime) -> None:
    """The transplant to ``table`` at ``cutover``: the new checkpoint starts it at version 1."""
    lineage = migrate(
        spark, path, {"format": "delta", "path": str(table)}, "transplant", cutover.isoformat()
    )
    assert lineage["carry_over"] == "transplant"
    query = load_registry(path).query(NAME)
    assert (query.source.format, query.source.path) == ("delta", str(table))
    new = load_checkpoint(query.checkpoint)
    first = min(b for b in new.offsets if b in new.commits and b + 1 in new.offsets)
    start = new.offsets[first].source_offsets[0]
    assert (start["reservoirVersion"], start["index"]) == (1, -1), start


@pytest.mark.whole
def test_topic_to_folder_equals_one_topic_restarted_at_the_cutover(
    spark, tmp_path, control, old_read
):
    path = old_on_topic(old_read, tmp_path)
    folder = tmp_path / "landing_v2"
    folder.mkdir()
    (folder / "part-0.json").write_text("".join(json.dumps(v) + "\n" for _, v, _ in NEW))
    spec = {"format": "json", "path": str(folder), "options": {}}

    lineage = migrate(spark, path, spec, "auto", cutover="drain")

    assert lineage["carry_over"] == "transplant"
    query = load_registry(path).query(NAME)
    assert (query.source.format, query.source.path) == ("json", str(folder))
    assert state_and_output(spark, path) == control


def test_refusals_change_nothing(kafka, tmp_path, old_read, monkeypatch):
    path = old_on_topic(old_read, tmp_path)
    checkpoints = tmp_path / "checkpoints"
    before = tree_digest(checkpoints)
    target = query_target(path, NAME)
    gone = new_topic(kafka, "retention")
    at_cutover = kafka.offsets(gone, CUTOVER)
    kafka.delete_records(gone, {p: o + 1 for p, o in at_cutover.items()})
    cases = [
        (kafka_source("C-no-such-topic"), "topic 'C-no-such-topic' does not exist"),
        (kafka_source(gone), "the cutover is no longer retained"),
        (
            kafka_source(gone) | {"bootstrap_servers": "127.0.0.1:1"},
            "Kafka at 127.0.0.1:1 does not answer",
        ),
    ]
    for spec, said in cases:
        if "bootstrap_servers" in spec:
            # A broker that never answers is refused after the client's timeout: 1 s here, not
            # 5. For it only: at the suite's load the running broker can take over a second to
            # answer, and the other refusals would read "does not answer".
            monkeypatch.setattr("stateops.core.kafka.TIMEOUT", 1.0)
        with pytest.raises(StateOpsError) as refused:
            plan_migration(target, spec | {"start": "cutover"}, "", "mig-x", CUTOVER_TEXT)
        assert said in str(refused.value) and "\n" not in str(refused.value)

    def cli(topic: str, *more: str):
        return run_cli(
            "--registry",
            str(path),
            "migrate",
            NAME,
            "--new-source-format",
            "kafka",
            "--new-source-topic",
            topic,
            "--carry-over",
            "transplant",
            *more,
            "--dry-run",
        )

    dry = cli(gone, "--new-source-start", "earliest")
    assert dry.returncode == 0, dry.stderr
    plan = json.loads(dry.stdout)
    assert (plan["new"]["source"]["topic"], plan["new"]["start"]) == (gone, "earliest")
    assert f"-> kafka topic {gone}" in dry.stderr
    missing = cli("C-no-such-topic", "--cutover", CUTOVER_TEXT)
    assert missing.returncode != 0
    assert missing.stderr.strip().count("\n") == 0 and "does not exist" in missing.stderr
    assert tree_digest(checkpoints) == before


def test_records_left_on_the_old_topic_after_the_drain_are_refused(spark, kafka, tmp_path):
    # Its own old topic: it writes to it.
    path = read_old(spark, kafka, tmp_path, "unread")
    old_topic = load_registry(path).query(NAME).source.topic
    topic = new_topic(kafka, "unread")
    drained = {}
    run = job_runner(spark)

    def run_job(job: str, registry_file: str, args: list[str]) -> None:
        run(job, registry_file, args)
        if "--cutover" in args:  # the drain: a producer that did not stop
            drained.update(tree_digest(tmp_path / "checkpoints" / NAME))
            kafka.produce(old_topic, [visit(i, CUTOVER + i * 1000) for i in range(3)])

    with pytest.raises(OperationFailed) as failed:
        migrate(spark, path, kafka_source(topic) | {"start": "cutover"}, "auto", run_job=run_job)
    message = str(failed.value)
    assert "3 records left unread on the old topic after the drain" in message, message
    assert f"{old_topic}[" in message and "\n" not in message
    assert load_registry(path).query(NAME).source.topic == old_topic
    assert tree_digest(tmp_path / "checkpoints" / NAME) == drained
