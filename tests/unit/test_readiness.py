"""The readiness window after a switch (issue 57, item 5: stateops.ops.readiness): when a
switched query is watched, and what makes its switch fail. The switch back on real state, a
code upgrade whose new code raises: tests/spark/test_upgrade.py."""

from __future__ import annotations

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


def test_an_upgrade_is_watched_for_an_hour_and_a_run_that_fails_in_it_fails_it(tmp_path):
    registry, query = _switched(tmp_path, "upgrade")
    watching = readiness(registry, query, None, 0, waiting, _at(10))
    assert (watching["state"], watching["until"]) == ("watching", "2026-12-04T13:00:00+00:00")
    ok = readiness(registry, query, _run(query, "succeeded", 5), 3, waiting, _at(30))
    assert ok["state"] == "watching"  # a good run does not end the window early
    failed = readiness(registry, query, _run(query, "failed", 20), 0, waiting, _at(25))
    assert failed["state"] == "failed"
    assert failed["reason"] == "its run on the new checkpoint failed: boom"
    # A run that failed after the window is the run rules' (run_failed), not the switch's.
    late = readiness(registry, query, _run(query, "failed", 61), 4, waiting, _at(70))
    assert late["state"] == "ready"
    # A run of the old checkpoint before the switch is not the new query's.
    old = registry.switch_history(NAME)[-1]["from"]["checkpoint"]
    before = _run(query, "failed", -5) | {"checkpoint": old}
    assert readiness(registry, query, before, 0, waiting, _at(5))["state"] == "watching"


def test_a_switch_that_commits_nothing_of_its_own_in_its_window_fails(tmp_path):
    registry, query = _switched(tmp_path, "upgrade")
    idle = readiness(registry, query, None, 0, waiting, _at(60))  # only the carried-over batch 0
    assert idle["state"] == "failed"
    assert idle["reason"] == (
        "it committed no batch of its own in the 60 min after the switch, with input to read"
    )
    # A source that was quiet all the while fails nothing: the window ends.
    assert readiness(registry, query, None, 0, quiet, _at(60))["state"] == "ready"
    assert (
        readiness(registry, query, _run(query, "succeeded", 5), 1, waiting, _at(60))["state"]
        == "ready"
    )


def test_failed_runs_in_a_row_as_health_says(tmp_path):
    registry, query = _switched(tmp_path, "upgrade", {"failed_runs": 2})
    assert (
        readiness(registry, query, _run(query, "failed", 5), 0, waiting, _at(10))["state"]
        == "watching"
    )
    twice = readiness(registry, query, _run(query, "failed", 9, failed=2), 0, waiting, _at(10))
    assert twice["reason"] == "2 runs in a row on the new checkpoint failed: boom"


def test_a_migration_is_not_watched_unless_the_registry_says(tmp_path):
    registry, query = _switched(tmp_path / "default", "migration")
    assert readiness(registry, query, _run(query, "failed", 5), 0, waiting, _at(10)) is None
    registry, query = _switched(tmp_path / "on", "migration", {"migration_readiness": "2 hours"})
    assert readiness(registry, query, None, 0, waiting, _at(100))["state"] == "watching"
    assert readiness(registry, query, None, 0, waiting, _at(120))["state"] == "failed"
    registry, query = _switched(tmp_path / "off", "upgrade", {"upgrade_readiness": "off"})
    assert readiness(registry, query, _run(query, "failed", 5), 0, waiting, _at(10)) is None
