"""The readiness window after a switch (issue 57, item 5: stateops.ops.readiness): when a
switched query is watched, and what makes its switch fail. The switch back on real state, a
code upgrade whose new code raises: tests/spark/test_upgrade.py."""

from __future__ import annotations

import getpass
import json
import os
import socket
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

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


def _switched(tmp_path, operation: str, health: dict | None = None, at: datetime = SWITCHED):
    """page_visits switched by ``operation`` at ``at`` to ``<checkpoint>.v2``, whose batches
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
        "time": at.isoformat(timespec="seconds"),
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


# -- judged on real inputs: files landed, a checkpoint, the run's lease, its summaries ----------
# (the verdict through stateops.status.query_status, as stream_health judges it; the window
# ended 30 minutes ago)


def _commit(checkpoint: Path, batch: int) -> None:
    """Batch ``batch`` planned and committed in the hand-written ``checkpoint``."""
    from stateops.ops.carry import write_checkpoint_file

    meta = {"batchWatermarkMs": 0, "batchTimestampMs": 0, "conf": {}}
    offsets = f'v1\n{json.dumps(meta)}\n{{"logOffset":{batch}}}'
    write_checkpoint_file(checkpoint, f"offsets/{batch}", offsets)
    write_checkpoint_file(checkpoint, f"commits/{batch}", 'v1\n{"nextBatchWatermarkMs": 0}')


def _live(tmp_path):
    """The registry, switched by an upgrade 90 minutes ago to a checkpoint of its own (batch 0
    carried over, having read ``seen.json``), a function that lands a file ``minutes_ago``
    minutes ago in the query's landing folder, and the switch's time."""
    from stateops.ops.carry import write_checkpoint_file

    now = datetime.now(UTC)
    switched = now - timedelta(minutes=90)
    registry, query = _switched(tmp_path, "upgrade", at=switched)
    landing, new = Path(query.source.path), Path(query.checkpoint)
    landing.mkdir(parents=True, exist_ok=True)
    seen = landing / "seen.json"
    seen.write_text("{}\n")
    write_checkpoint_file(new, "metadata", json.dumps({"id": "q"}))
    _commit(new, 0)
    entry = {"path": f"file://{seen}", "timestamp": 0, "batchId": 0}
    write_checkpoint_file(new, "sources/0/0", f"v1\n{json.dumps(entry)}")

    def land(name: str, minutes_ago: float) -> None:
        at = (now - timedelta(minutes=minutes_ago)).timestamp()
        (landing / name).write_text("{}\n")
        os.utime(landing / name, (at, at))

    return registry, land, switched


def _running_since(registry, at: datetime) -> None:
    """The query's run, this live process, holding the lease since ``at`` (as the lease
    another host's run took then reads)."""
    from stateops.control.lock import LockInfo, process_start, this_machine

    owner = f"{getpass.getuser()}@{socket.gethostname()}:{os.getpid()}"
    held = LockInfo(NAME, "run", "start-1", owner, "t", at.timestamp(), time.time() + 600,
                    process_start(os.getpid()), None, this_machine())  # fmt: skip
    place = registry.lock_path(NAME)
    place.parent.mkdir(parents=True, exist_ok=True)
    place.write_text(json.dumps(held.__dict__))


def _verdict(registry) -> str:
    from stateops.status import query_status

    return query_status(registry, NAME)["readiness"]["state"]


def test_a_run_stuck_through_the_window_fails_it_only_for_input_landed_before_its_end(tmp_path):
    """Input landed after the window's end (and before the check) is the next window's
    business: judging it as of the check, not the window's end, switches a healthy upgrade
    back; and a file the carried batch read is no input waiting."""
    registry, land, switched = _live(tmp_path)
    _running_since(registry, switched + timedelta(minutes=5))
    assert _verdict(registry) == "ready"  # nothing unread: the file seen.json was read
    land("after-the-end.json", minutes_ago=10)
    assert _verdict(registry) == "ready"
    land("before-the-end.json", minutes_ago=40)
    assert _verdict(registry) == "failed"


def test_a_run_started_after_the_window_is_not_stuck_in_it(tmp_path):
    registry, land, switched = _live(tmp_path)
    land("before-the-end.json", minutes_ago=40)
    _running_since(registry, switched + timedelta(minutes=70))  # 10 minutes after its end
    assert _verdict(registry) == "ready"
    _running_since(registry, switched + timedelta(minutes=59))
    assert _verdict(registry) == "failed"


def test_a_run_that_lost_its_lease_in_the_window_switches_nothing_back(tmp_path):
    """A run on the new checkpoint whose lease was taken over or released (a stall, an
    operator) failed for no fault of the new code."""
    from stateops.ops.start import write_summary

    registry, _, switched = _live(tmp_path)
    query = registry.query(NAME)
    started = (switched + timedelta(minutes=20)).isoformat(timespec="seconds")
    run = {"query": NAME, "run_id": "start-2", "status": "failed", "started_at": started,
           "checkpoint": query.checkpoint, "error": "lost the query's lease"}  # fmt: skip
    write_summary(registry, run | {"lock_lost": True})
    assert _verdict(registry) == "ready"
    write_summary(registry, run | {"run_id": "start-3"})  # a failure of its own: the code's
    assert _verdict(registry) == "failed"


def test_a_commit_between_the_check_and_the_switch_back_switches_nothing_back(tmp_path):
    """The check judged the run stuck; before the switch back took the hold, the run
    committed a batch of its own: the switch back looks again under the hold and does
    nothing (the next check judges again)."""
    from stateops.core.errors import StateOpsError
    from stateops.ops.readiness import roll_back_switch
    from stateops.status import query_status

    registry, land, switched = _live(tmp_path)
    land("before-the-end.json", minutes_ago=40)
    _running_since(registry, switched + timedelta(minutes=5))
    status = query_status(registry, NAME)
    found = status["readiness"]
    assert found["state"] == "failed"
    new = Path(registry.query(NAME).checkpoint)
    _commit(new, 1)
    registry.lock_path(NAME).unlink()  # and ended
    with pytest.raises(StateOpsError, match="changed since the check; nothing was switched back"):
        roll_back_switch(registry, NAME, status["last_switch"], found, log=lambda line: None)
    after = load_registry(registry.path)
    assert after.query(NAME).checkpoint == str(new), "switched back"
    assert after.switch_history(NAME)[-1]["run_id"] == "upgrade-1"
    from stateops.control.lock import read_hold

    assert read_hold(after.lock_path(NAME)) is None, "the hold it took is released"


def test_a_switch_back_that_cannot_be_made_is_said_and_the_status_stays_switch_failed(tmp_path):
    """stream_health's check finds the window failed, and the switch back is refused: another
    run holds the query (a backfill started by hand in the incident). The check says why in
    one line, the status goes on saying switch_failed (FAIL) and nothing was switched (the
    next check tries again)."""
    from stateops.alerts import watch_readiness
    from stateops.control.lock import hold_query

    registry, land, switched = _live(tmp_path)
    new = registry.query(NAME).checkpoint
    land("before-the-end.json", minutes_ago=40)
    _running_since(registry, switched + timedelta(minutes=5))
    hold_query(registry.lock_path(NAME), NAME, "backfill", "backfill-9")
    said: list[str] = []
    status = watch_readiness(registry, NAME, log=said.append)
    assert len(said) == 1, said
    assert said[0].startswith(
        f"{NAME}: switching back failed: query {NAME!r} is held by backfill (run backfill-9)"
    ), said
    assert status["readiness"]["state"] == "failed"
    assert [
        (f["rule"], f["level"])
        for f in status["health"]["findings"]
        if f["rule"] == "switch_failed"
    ] == [("switch_failed", "FAIL")]
    assert load_registry(registry.path).query(NAME).checkpoint == new, "nothing switched"
