"""The readiness window after a switch (issue 57, item 5: stateops.ops.readiness): when a
switched query is watched, and what makes its switch fail. The switch back on real state, a
code upgrade whose new code raises: tests/spark/test_upgrade.py."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest
import yaml

from stateops.core.registry import load_registry, write_switch
from stateops.ops.readiness import readiness
from tests.conftest import write_registry

pytestmark = pytest.mark.unit
NAME = "page_visits"
SWITCHED = datetime(2026, 12, 4, 12, tzinfo=UTC)


def waiting(before: datetime) -> bool:
    """Input was there to read before any time asked."""
    return True


def quiet(before: datetime) -> bool:
    """No input the query has not read."""
    return False


def _switched(tmp_path, operation: str, health: dict | None = None):
    """page_visits switched by ``operation`` at SWITCHED to ``<checkpoint>.v2``, whose batches
    up to 0 the switch carried over; its registry with ``health``."""
    path = write_registry(tmp_path)
    if health:
        raw = yaml.safe_load(path.read_text())
        raw["health"] = health
        path.write_text(yaml.safe_dump(raw))
    registry = load_registry(path)
    query = registry.query(NAME)
    source = query.source.model_dump(by_alias=True)
    lineage = {
        "operation": operation,
        "run_id": f"{operation}-1",
        "time": SWITCHED.isoformat(timespec="seconds"),
        "source_name": "source",
        "from": {"checkpoint": query.checkpoint, "source": source, "sink_batch_offset": 0},
        "to": {"checkpoint": f"{query.checkpoint}.v2", "source": source, "last_committed_batch": 0},
    }
    write_switch(registry, NAME, source, f"{query.checkpoint}.v2", lineage, sink_batch_offset=5)
    registry = load_registry(path)
    return registry, registry.query(NAME)


def _run(query, status: str, minutes: int, failed: int = 1, error: str = "boom") -> dict:
    """A last run's summary: started ``minutes`` after the switch on the query's checkpoint."""
    started = (SWITCHED + timedelta(minutes=minutes)).isoformat(timespec="seconds")
    return {
        "status": status,
        "started_at": started,
        "checkpoint": query.checkpoint,
        "error": error if status == "failed" else None,
        "failed_in_a_row": failed if status == "failed" else 0,
    }


def _at(minutes: int) -> datetime:
    return SWITCHED + timedelta(minutes=minutes)


def _judge(registry, query, run, committed, minutes, running=None, unread=waiting):
    """``readiness`` ``minutes`` after the switch; ``running``: the minute the run going on
    now started (None: none)."""
    since = None if running is None else _at(running)
    switches = registry.switch_history(NAME)
    limits = registry.health_limits(query)
    return readiness(query, limits, switches[-1], run, committed, since, unread, _at(minutes))


def test_an_upgrade_is_watched_for_an_hour_and_a_run_that_fails_in_it_fails_it(tmp_path):
    registry, query = _switched(tmp_path, "upgrade")
    watching = _judge(registry, query, None, 0, 10)
    assert (watching["state"], watching["until"]) == ("watching", "2026-12-04T13:00:00+00:00")
    ok = _judge(registry, query, _run(query, "succeeded", 5), 3, 30)
    assert ok["state"] == "watching"  # a good run does not end the window early
    failed = _judge(registry, query, _run(query, "failed", 20), 0, 25)
    assert failed["state"] == "failed"
    assert failed["reason"] == "its run on the new checkpoint failed: boom"
    assert _judge(registry, query, _run(query, "succeeded", 5), 1, 60)["state"] == "ready"
    # A run that failed after the window is the run rules' (run_failed), not the switch's.
    assert _judge(registry, query, _run(query, "failed", 61), 4, 70)["state"] == "ready"
    # A run of the old checkpoint before the switch is not the new query's.
    old = registry.switch_history(NAME)[-1]["from"]["checkpoint"]
    before = _run(query, "failed", -5) | {"checkpoint": old}
    assert _judge(registry, query, before, 0, 5)["state"] == "watching"


def test_a_run_stuck_through_the_window_with_input_to_read_fails_it(tmp_path):
    registry, query = _switched(tmp_path, "upgrade")
    stuck = _judge(registry, query, None, 0, 60, running=2)  # only the carried-over batch 0
    assert stuck["state"] == "failed"
    assert stuck["reason"] == (
        "its run since 2026-12-04T12:02:00+00:00 committed no batch of its own in the 60 min "
        "after the switch, with input to read"
    )
    # A quiet source, a query nobody ran, a run that committed: each fails nothing.
    assert _judge(registry, query, None, 0, 60, running=2, unread=quiet)["state"] == "ready"
    assert _judge(registry, query, None, 0, 60)["state"] == "ready"
    assert _judge(registry, query, None, 1, 60, running=2)["state"] == "ready"
    # Judged at the window's end, not when input comes days later to a run started in it.
    assert _judge(registry, query, None, 0, 3000, running=2)["state"] == "ready"


def test_failed_runs_in_a_row_as_health_says(tmp_path):
    registry, query = _switched(tmp_path, "upgrade", {"failed_runs": 2})
    assert _judge(registry, query, _run(query, "failed", 5), 0, 10)["state"] == "watching"
    twice = _judge(registry, query, _run(query, "failed", 9, failed=2), 0, 10)
    assert twice["reason"] == "2 runs in a row on the new checkpoint failed: boom"


def test_a_migration_is_not_watched_unless_the_registry_says(tmp_path):
    registry, query = _switched(tmp_path / "default", "migration")
    assert _judge(registry, query, _run(query, "failed", 5), 0, 10) is None
    registry, query = _switched(tmp_path / "on", "migration", {"migration_readiness": "2 hours"})
    assert _judge(registry, query, None, 0, 100, running=1)["state"] == "watching"
    assert _judge(registry, query, None, 0, 120, running=1)["state"] == "failed"
    registry, query = _switched(tmp_path / "off", "upgrade", {"upgrade_readiness": "off"})
    assert _judge(registry, query, _run(query, "failed", 5), 0, 10) is None


def test_a_switch_recorded_before_the_window_existed_is_not_watched(tmp_path):
    registry, query = _switched(tmp_path, "upgrade")
    path = registry.switch_path(NAME)
    switch = json.loads(path.read_text())
    del switch["history"][-1]["to"]["last_committed_batch"]
    path.write_text(json.dumps(switch))
    assert _judge(load_registry(registry.path), query, _run(query, "failed", 5), 0, 10) is None
