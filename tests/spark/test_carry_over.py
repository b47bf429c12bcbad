"""Carry-over of user_sessions (list state and event-time timers), by both roads.

The roads a source migration takes: the old query stops at a cutover, and the query starts on
the new source with its state, exported and bootstrapped (initialState) or transplanted.
Sessions open at the cutover must close on the new source exactly as they would have in one
query that kept running on one source. The reference and the old query are built once per
timeout (:func:`before_the_cutover`); both roads only read them.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path

import pytest
import yaml

from stateops.core.checkpoint import load_checkpoint
from stateops.core.registry import load_registry
from tests.conftest import (
    ROOT,
    run_cli,
    tree_digest,
    write_registry,
)
from tests.spark.harness import (
    job_in_session,
    land,
    read_sink,
    read_state,
    run_in_session,
    summary_of,
)

pytestmark = [pytest.mark.spark, pytest.mark.whole]  # a shape: timers across a cutover

READS = [{"stateVarName": "events"}, {"readRegisteredTimers": "true"}]
PROCESSOR = yaml.safe_load((ROOT / "registry.yaml").read_text())["queries"]["user_sessions"][
    "processor"
]
DATA = 4  # output columns: user_id, session_start, session_end, num_events, data, closed_by
FIRST_OF_ROUND_1 = "events-r001-0000.json"


def _ok(proc) -> dict:
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _all_rows(sink) -> Counter:
    return Counter(row for rows in read_sink(Path(sink)).values() for row in rows)


def _add_late_event(path: Path) -> None:
    """One event long before the old query's watermark, the file's mtime kept."""
    mtime = path.stat().st_mtime
    event = {
        "user_id": "u00001",
        "data": "late",
        "is_last": False,
        "event_time": "2026-01-01T00:00:00Z",
    }
    with open(path, "a") as out:
        out.write(json.dumps(event) + "\n")
    os.utime(path, (mtime, mtime))


def _timed(timeout: int) -> dict:
    """user_sessions' registry entry with sessions timing out after ``timeout`` seconds."""
    return {"processor": {**PROCESSOR, "options": {"session_timeout_seconds": timeout}}}


@pytest.fixture(scope="module")
def before_the_cutover(spark, tmp_path_factory):
    """``timeout -> (whole, old)``, each built once: the registries of the reference query (one
    source, stopped at the cutover and started again) and of the old query (round 0 only)."""
    built: dict[int, tuple[Path, Path]] = {}

    def get(timeout: int) -> tuple[Path, Path]:
        if timeout not in built:
            root = tmp_path_factory.mktemp(f"carry-over-{timeout}")
            # The reference. (Each available-now run ends with a no-data batch that fires the
            # timers due at its watermark before the next input arrives; one run over both
            # rounds would fire them in the same batch as that input, after it: with a 300 s
            # timeout, other sessions.)
            whole = write_registry(root / "whole", user_sessions=_timed(timeout))
            land(root / "whole" / "landing", round_=0, files=3)
            run_in_session(spark, whole, "user_sessions")
            land(root / "whole" / "landing", round_=1, files=3)
            _add_late_event(root / "whole" / "landing" / "user_sessions" / FIRST_OF_ROUND_1)
            run_in_session(spark, whole, "user_sessions")
            # The same events split at a cutover: round 0 on the old source.
            old = write_registry(root / "old", user_sessions=_timed(timeout))
            land(root / "old" / "landing", round_=0, files=3)
            run_in_session(spark, old, "user_sessions")
            built[timeout] = whole, old
        return built[timeout]

    return get


# Each road gets a late event the old watermark drops, which its proof must drop too
# (tests/spark/test_initial_state_road.py: late events in the first two batches, and a cutover).
@pytest.mark.parametrize(
    "road, timeout", [("initial_state", 1800), ("initial_state", 300), ("transplant", 300)]
)
def test_open_sessions_carry_over_and_close_like_a_query_that_kept_running(
    spark, tmp_path, road, timeout, before_the_cutover
):
    whole, old = before_the_cutover(timeout)
    old_checkpoint = Path(load_registry(old).query("user_sessions").checkpoint)
    last = load_checkpoint(old_checkpoint).last_committed_batch
    before = tree_digest(old_checkpoint)
    # Round 1 on the new source.
    new = write_registry(tmp_path / "new", user_sessions=_timed(timeout))
    land(tmp_path / "new" / "landing", round_=1, files=3)
    _add_late_event(tmp_path / "new" / "landing" / "user_sessions" / FIRST_OF_ROUND_1)
    new_checkpoint = load_registry(new).query("user_sessions").checkpoint

    if road == "initial_state":
        export = tmp_path / "export"
        assert run_cli(
            "--registry", str(old), "export", "user_sessions", "--out", str(export), check=True
        )
        manifest = json.loads((export / "manifest.json").read_text())
        open_at_cutover = next(e["rows"] for e in manifest["entries"] if e["variable"] == "events")
        assert open_at_cutover > 0, "no session was open at the cutover: nothing is carried over"
        boot = summary_of(
            *job_in_session(
                spark,
                "bootstrap_state.py",
                "--registry",
                str(new),
                "--query",
                "user_sessions",
                "--initial-state",
                str(export),
            )
        )
        assert boot["bootstrap"] == "complete" and boot["proof"]["ok"], boot["proof"]
        run_in_session(spark, new, "user_sessions")  # the rest of the new source
    else:
        cli = [
            "--registry",
            str(new),
            "transplant",
            str(old_checkpoint),
            new_checkpoint,
            "--query",
            "user_sessions",
        ]
        dry = _ok(run_cli(*cli, "--dry-run"))
        assert dry["dry_run"] and dry["batch"] == last and not Path(new_checkpoint).exists()
        done = _ok(run_cli(*cli))
        assert done["batch"] == last and done["query_id"] != done["old_query_id"]
        assert tree_digest(old_checkpoint) == before, "the transplant wrote into the old checkpoint"
        assert load_checkpoint(new_checkpoint).last_committed_batch == last
        assert not list(Path(new_checkpoint).glob("sources/*")), "the new source starts empty"
        run = run_in_session(spark, new, "user_sessions")  # its first batch is proven
        assert run["carry_over"] == "transplant" and run["bootstrap"] == "complete"
        assert run["first_batch_id"] == last + 1 and run["proof"]["ok"], run["proof"]
    assert tree_digest(old_checkpoint) == before, "carrying the state over changed the old one"

    queries = {
        name: load_registry(reg).query("user_sessions")
        for name, reg in (("whole", whole), ("old", old), ("new", new))
    }
    assert read_state(spark, queries["new"].checkpoint, READS) == read_state(
        spark, queries["whole"].checkpoint, READS
    ), "state (open sessions and their timers) differs from the query that kept running"
    split = _all_rows(queries["old"].sink.path) + _all_rows(queries["new"].sink.path)
    assert split == _all_rows(queries["whole"].sink.path)
    # Sessions that began before the cutover (round 0 events are "e0-...") ended after it.
    carried = [r for r in _all_rows(queries["new"].sink.path) if r[DATA].startswith("e0-")]
    assert carried, "no carried-over session closed on the new source"
