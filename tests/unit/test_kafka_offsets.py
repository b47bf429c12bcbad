"""A Kafka source's initial offsets file and where retention stands (pure logic; on a broker
and a Spark-written checkpoint: tests/spark/test_kafka_status.py)."""

from __future__ import annotations

import pytest

from stateops.kinds import kind_at
from stateops.kinds.files import FILES
from stateops.kinds.kafka import KAFKA, Lag, retention

pytestmark = pytest.mark.unit


def test_initial_offsets_are_read_past_the_nul_byte_and_the_version():
    text = '\x00v1\n{"visits":{"1":7,"0":12}}'
    assert KAFKA.initial(text) == {"visits": {1: 7, 0: 12}}


@pytest.mark.parametrize(
    "text",
    [
        'v1\n{"path":"file:///l/a.json","timestamp":1,"batchId":0}',  # a file source's log
        '\x00v1\n{"visits":{"0":"x"}}',
        '\x00{"visits":{"0":1}}',
        "",
    ],
)
def test_anything_else_is_not_initial_offsets(text):
    assert KAFKA.initial(text) is None and FILES.initial(text) is None


def test_each_entry_is_claimed_by_its_kind_alone():
    assert FILES.claims({"logOffset": 3}) and not FILES.claims({"t": {"0": 3}})
    assert KAFKA.claims({"t": {"0": 3}}) and not KAFKA.claims({"logOffset": 3})
    assert kind_at({"logOffset": 3}) is FILES and kind_at({"t": {"0": 3}}) is KAFKA
    assert kind_at(None) is None and kind_at({"sourceVersion": 1}) is None


def lag(committed: int, earliest: int, end: int) -> Lag:
    return Lag({"t": {0: committed}}, {"t": {0: end}}, {"t": {0: earliest}})


def test_retention_past_a_committed_offset_is_lost_records_named_by_range():
    kept = retention(lag(committed=10, earliest=14, end=40), 0.1)
    assert [str(m) for m in kept.lost] == ["t[0] offsets 10..13"] and not kept.close


@pytest.mark.parametrize(
    ("committed", "earliest", "end", "close"),
    [
        (10, 10, 40, True),  # at the earliest, 30 records unread
        (12, 10, 40, True),  # 2 of 30 retained: under 10%
        (13, 10, 40, False),  # 3 of 30: 10%, not under
        (40, 40, 40, False),  # all read and all deleted: nothing to lose
        (40, 0, 40, False),  # all read
    ],
)
def test_retention_close_to_a_committed_offset_is_under_a_tenth_of_what_is_retained(
    committed, earliest, end, close
):
    kept = retention(lag(committed, earliest, end), 0.1)
    assert not kept.lost and bool(kept.close) is close, kept


def test_how_close_is_close_is_the_querys_retention_margin():
    """health.retention_margin: 3 of 30 retained records is close under a 20% margin."""
    assert not retention(lag(13, 10, 40), 0.1).close
    assert retention(lag(13, 10, 40), 0.2).close == [
        "t[0] committed offset 13 is 3 records ahead of the earliest retained 10 (30 retained)"
    ]
