"""The last task of the scheduled DAGs (backup, cleanup): a line per query, and a run that
did nothing at all is not green (issue 20, item 4)."""

from __future__ import annotations

import pytest
from airflow.sdk.exceptions import AirflowFailException

from stateops_airflow.tasks import scheduled_outcome

pytestmark = pytest.mark.unit


def test_each_query_says_what_was_done_or_why_it_was_skipped():
    lines = scheduled_outcome("backup", {"b": None, "a": "backup b-1 of batch 4"})
    assert lines == [
        "a: backup b-1 of batch 4",
        "b: skipped, no committed batch yet (stream_start runs it)",
    ]


def test_a_run_that_skipped_every_query_fails_saying_so():
    with pytest.raises(
        AirflowFailException,
        match="no backup was done: no registered query "
        "has a committed batch yet; run stream_start first",
    ):
        scheduled_outcome("backup", {"a": None, "b": None})
