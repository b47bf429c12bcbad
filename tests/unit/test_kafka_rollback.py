"""The pure logic of a rollback of a Kafka query: the records between two offsets, a batch's
offsets within a time's, which registry source an offsets entry is, the plan's Kafka lines
and the confirmation a Kafka sink's rewrite waits for (the broker side:
tests/spark/test_kafka_rollback.py)."""

from __future__ import annotations

import pytest

from stateops.core.errors import StateOpsError
from stateops.core.registry import Source
from stateops.kinds import source_at
from stateops.kinds.kafka import KAFKA, records_between, within
from stateops.ops.rollback import format_rollback_plan, refuse_unconfirmed_rewrite

pytestmark = pytest.mark.unit


def test_records_between_two_offsets_count_each_partition_and_a_new_one_from_zero():
    before = {"a": {0: 5, 1: 7}}
    after = {"a": {0: 9, 1: 7, 2: 3}, "b": {0: 2}}
    assert records_between(before, after) == 4 + 0 + 3 + 2
    assert records_between(None, {"a": {0: 4}}) == 4
    assert records_between({"a": {0: 9}}, {"a": {0: 4}}) == 0  # never negative


def test_within_is_every_partition_at_or_before_the_limit():
    limit = {"a": {0: 10, 1: 4}}
    assert within({"a": {0: 10, 1: 4}}, limit)
    assert within({"a": {0: 3}}, limit)
    assert not within({"a": {0: 11, 1: 0}}, limit)
    assert not within({"b": {0: 1}}, limit)
    assert within({"b": {0: 0}}, limit)


def test_an_offsets_entry_is_matched_to_the_registered_source_of_its_topics():
    files = Source.model_validate({"format": "json", "path": "/x", "schema": "a STRING"})
    mine = Source.model_validate(
        {"format": "kafka", "topics": ["u", "t"], "bootstrap_servers": "h:1", "schema": "a INT"}
    )
    assert source_at({"t": {"0": 1}, "u": {"0": 1}}, [files, mine]) is mine
    # a checkpoint no registered query owns: the same topics, on the default brokers
    stand_in = source_at({"t": {"0": 1}}, [files, mine])
    assert stand_in.subscribed == ["t"] and stand_in.bootstrap_servers is None
    assert source_at({"logOffset": 3}, [files, mine]) is None  # a folder's names none
    assert source_at(None, [files, mine]) is None


TOPIC = Source.model_validate({"format": "kafka", "topic": "t", "schema": "a INT"})
PLAN = {
    "operation": "rollback",
    "checkpoint": "/c",
    "to_batch": 4,
    "last_committed_batch": 7,
    "backup_to": "s3://b/q",
    "sink": None,
    "by_category": {},
    "delete": {"files": 0, "bytes": 0},
    "keep": {"files": 0, "bytes": 0},
    "rewinds": [
        {"source": 0, **KAFKA.rewind(TOPIC, {"t": {"0": 12, "1": 40}}, {"t": {"0": 21, "1": 40}})}
    ],
    "rewrites": {
        "sink": "Kafka topic out",
        "topic": "out",
        "first_batch": 5,
        "since_ms": 1,
        "records": 6,
    },
}


def test_the_plan_shows_the_rewind_offsets_and_the_records_written_again():
    lines = format_rollback_plan(PLAN, dry_run=True).splitlines()
    assert lines[1].startswith("  batch 4 becomes the last committed batch")
    assert lines[2] == "  source 0 (topic t): rewinds to t[0]=12 t[1]=40; 9 records read again"
    assert lines[3] == (
        "  sink Kafka topic out (at least once): reprocessing writes again the 6 records "
        "batches 5 on wrote (those stamped from batch 5's start on); confirm with "
        "--rewrite-output 6"
    )


def test_a_kafka_sinks_rewrite_waits_for_its_count():
    refuse_unconfirmed_rewrite(PLAN, 6)
    refuse_unconfirmed_rewrite({**PLAN, "rewrites": None}, None)  # a folder sink
    refuse_unconfirmed_rewrite({**PLAN, "rewrites": {**PLAN["rewrites"], "records": 0}}, None)
    with pytest.raises(StateOpsError) as err:
        refuse_unconfirmed_rewrite(PLAN, None)
    assert str(err.value) == (
        "/c: reprocessing writes again the 6 records batches 5 on wrote to Kafka topic out (at "
        "least once: its readers get them twice); confirm with --rewrite-output 6 (the backfill "
        "form: rewrite_output 6); nothing changed"
    )
    with pytest.raises(StateOpsError, match="^/c: --rewrite-output 5 does not match: "):
        refuse_unconfirmed_rewrite(PLAN, 5)
