"""Where a moved source starts in a carried-over checkpoint (pure logic, no broker): the
initial offsets log Spark's Kafka connector reads, which old source a new one goes on from,
and the start the form or the CLI names."""

from __future__ import annotations

import pytest

from stateops.core.errors import StateOpsError
from stateops.core.registry import Source
from stateops.kinds.base import start_at
from stateops.kinds.files import FILE_START, FILES
from stateops.kinds.kafka import KAFKA
from stateops.ops.transplant import _moved_source

pytestmark = pytest.mark.unit

SCHEMA = "user_id STRING, page STRING, event_time TIMESTAMP"
TOPIC = Source(format="kafka", topic="visits", schema=SCHEMA)
FOLDER = Source(format="json", path="/data/landing", schema=SCHEMA)


def test_a_kafka_start_is_logged_as_the_connector_writes_it_and_a_file_start_is_not():
    entry = '{"visits":{"0":8,"1":2}}'
    assert KAFKA.initial_log(entry) == '\x00v1\n{"visits":{"0":8,"1":2}}'
    assert KAFKA.initial(KAFKA.initial_log(entry)) == {"visits": {0: 8, 1: 2}}
    assert FILES.initial_log(FILE_START) is None
    assert KAFKA.initial("v2\n{}") is None


def test_a_kafka_source_is_matched_only_to_an_entry_of_exactly_its_topics():
    assert KAFKA.matches(TOPIC, {"visits": {"0": 3}})
    assert not KAFKA.matches(TOPIC, {"other": {"0": 3}})
    assert not KAFKA.matches(TOPIC, {"visits": {"0": 3}, "other": {"0": 1}})
    assert not FILES.matches(FOLDER, {"visits": {"0": 3}})
    assert not KAFKA.matches(TOPIC, {"logOffset": 4})


def test_the_start_is_earliest_latest_or_the_cutovers_epoch_ms():
    assert start_at(TOPIC, "earliest", None) == "earliest"
    assert start_at(TOPIC, "latest", "drain") == "latest"
    assert start_at(TOPIC, "cutover", "2026-09-21T12:00:00Z") == 1_789_992_000_000
    assert start_at(TOPIC, None, "2026-09-21T12:00:00.250Z") == 1_789_992_000_250


def test_a_start_at_the_cutover_needs_its_time_and_an_unknown_start_is_refused():
    with pytest.raises(StateOpsError, match="needs the cutover's time"):
        start_at(TOPIC, "cutover", "drain")
    with pytest.raises(StateOpsError, match="choose one of cutover, earliest, latest"):
        start_at(TOPIC, "now", None)


def test_a_move_between_a_folder_and_a_topic_drops_what_belongs_to_the_other_kind():
    moved = _moved_source(FOLDER, {"format": "kafka", "topic": "visits", "path": None})
    assert (moved.format, moved.topic, moved.path) == ("kafka", "visits", "")
    back = _moved_source(TOPIC, {"format": "parquet", "path": "/data/v2"})
    assert (back.format, back.topic, back.path) == ("parquet", None, "/data/v2")
    with pytest.raises(StateOpsError, match="^new source: a kafka source names topic"):
        _moved_source(FOLDER, {"format": "kafka"})
