"""A query's figures over time (issue 57, item 3: stateops.control.history): the points runs
and health checks record, kept a day a file and pruned, `stateops status --history`, and the
state growth rule on them (a real leak, Spark's own figures: tests/spark/test_expectations.py)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest

from stateops.control.history import check_point, growth, read_history, record, run_point
from stateops.core.registry import load_registry
from stateops.spark.streaming import progress_summary
from stateops.status import query_status
from tests.conftest import run_cli, write_registry

pytestmark = pytest.mark.unit
NOW = datetime(2026, 12, 3, 12, tzinfo=UTC)
KEEP = timedelta(days=30)


def _progress(rows: int, memory: int, read: int, ms: int) -> dict:
    """A progress event as Spark reports it (the fields the summary reads)."""
    return {
        "numInputRows": read,
        "durationMs": {"triggerExecution": ms},
        "stateOperators": [
            {"operatorName": "transformWithStateInPandasExec", "numRowsTotal": rows,
             "memoryUsedBytes": memory},
        ],
    }  # fmt: skip


def _run(run_id: str, rows: int, memory: int = 1000) -> dict:
    """A run summary's fields a point reads: two batches that read 40 and 20 rows, in 2 and
    1 s, and an idle trigger (it reads nothing and counts for no duration)."""
    figures = progress_summary(
        [_progress(rows - 5, memory, 40, 2000), _progress(rows, memory, 20, 1000),
         {"numInputRows": 0, "durationMs": {"triggerExecution": 5}}]
    )  # fmt: skip
    return {"operation": "run", "run_id": run_id, "status": "succeeded",
            "last_committed_batch": 7, **figures}  # fmt: skip


def test_a_run_point_takes_sparks_state_figures_and_a_check_point_the_status_figures():
    point = run_point(_run("r1", rows=120, memory=4096), NOW)
    assert point == {
        "at": "2026-12-03T12:00:00+00:00",
        "source": "run",
        "operation": "run",
        "run_id": "r1",
        "status": "succeeded",
        "batch": 7,
        "input_rows": 60,
        "batch_seconds": 1.5,
        "state_rows": 120,
        "state_bytes": 4096,
        "operators": [
            {"operator": 0, "name": "transformWithStateInPandasExec", "rows": 120, "bytes": 4096}
        ],
    }
    # a run that failed before its first batch has no state figures: none, not 0
    assert run_point({"operation": "run", "status": "failed"}, NOW)["state_rows"] is None
    status = {
        "positions": [
            {"lag_total": 30, "lag_unit": "records"},
            {"lag_total": 12, "lag_unit": "records"},
            {"lag_total": None, "lag_unit": "records"},
        ],
        "committed_at": (NOW - timedelta(minutes=10)).isoformat(),
        "last_committed_batch": 7,
        "operators": [{"bytes": 100}, {"bytes": 50}],
        "health": {"verdict": "WARN"},
    }
    assert check_point(status, NOW) == {
        "at": "2026-12-03T12:00:00+00:00",
        "source": "check",
        "verdict": "WARN",
        "batch": 7,
        "lag_records": 42,
        "waiting_seconds": 600,
        "checkpoint_bytes": 150,
    }
    caught_up = status | {"positions": [{"lag_total": 0, "lag_unit": "records"}]}
    assert check_point(caught_up, NOW)["waiting_seconds"] == 0
    files = status | {"positions": []}  # no Kafka source: no lag, not 0
    assert (check_point(files, NOW)["lag_records"], check_point(files, NOW)["waiting_seconds"]) == (
        None,
        None,
    )


def test_points_are_kept_a_day_a_file_read_since_a_time_and_pruned_after_keep_history(tmp_path):
    registry = load_registry(write_registry(tmp_path))
    for days_ago, run_id in ((40, "old"), (1, "yesterday"), (0, "today")):
        record(
            registry,
            "page_visits",
            run_point(_run(run_id, 10), NOW - timedelta(days=days_ago)),
        )
    folder = registry.history_path("page_visits")
    assert folder == tmp_path / "_stateops" / "history" / "page_visits"
    # the 40 days old file went when today's point was written
    assert sorted(p.name for p in folder.iterdir()) == ["2026-12-02.jsonl", "2026-12-03.jsonl"]
    since = read_history(registry, "page_visits", NOW - timedelta(hours=30))
    assert [p["run_id"] for p in since] == ["yesterday", "today"]
    assert [p["run_id"] for p in read_history(registry, "page_visits", NOW)] == ["today"]
    # a line a writer left half written is left out, the rest is read
    with open(folder / "2026-12-03.jsonl", "a") as torn:
        torn.write('{"at": "2026-12-03T12:00:01+00:00", "sou')
    assert [p["run_id"] for p in read_history(registry, "page_visits", NOW)] == ["today"]
    assert read_history(registry, "user_sessions", NOW - KEEP) == []


def _points(*rows: int, every: timedelta = timedelta(minutes=30)) -> list[dict]:
    """Runs ``every`` apart, ending at NOW, with these state rows (and 100 bytes a row)."""
    start = NOW - every * (len(rows) - 1)
    return [
        run_point(_run(f"r{i}", n, memory=100 * n), start + every * i) for i, n in enumerate(rows)
    ]


def test_state_growing_faster_than_its_limit_over_the_window_is_said_with_the_figures(tmp_path):
    path = write_registry(
        tmp_path,
        user_sessions={"health": {"state_rows_per_hour": 100, "growth_window": "2 hours"}},
    )
    registry = load_registry(path)
    limits = registry.health_limits(registry.query("user_sessions"))
    leak = _points(400, 500, 600, 700, 800)  # 200 rows an hour, from 2 hours ago
    assert growth("user_sessions", leak, limits, NOW) == [
        "state rows grew from 400 to 800 in 2 h (5 runs): 200 rows an hour, more than "
        "health.state_rows_per_hour (100): state that is never removed (expired entries "
        "kept?); stateops status user_sessions --history shows it"
    ]
    # the same rows up and down (sessions that time out and are removed): no finding
    assert growth("user_sessions", _points(400, 700, 300, 650, 400), limits, NOW) == []
    # at the limit, not over it; one run in the window; points before the window left out
    assert growth("user_sessions", _points(400, 450, 500), limits, NOW) == []
    assert growth("user_sessions", _points(400, 800)[1:], limits, NOW) == []
    assert (
        growth("user_sessions", _points(0, 0, 800, 800, 800, every=timedelta(hours=1)), limits, NOW)
        == []
    )
    # checks and runs without state figures count for nothing
    checks = [{"at": p["at"], "source": "check", "state_rows": None} for p in leak]
    assert growth("user_sessions", checks, limits, NOW) == []
    # bytes: their own limit, shown as bytes; no limit (the default): no finding
    by_bytes = limits.__class__(**{**limits.__dict__, "state_rows_per_hour": None,
                                   "state_bytes_per_hour": 10_000})  # fmt: skip
    [said] = growth("user_sessions", leak, by_bytes, NOW)
    assert said.startswith("state bytes grew from 39.1 KB to 78.1 KB in 2 h (5 runs): ")
    assert "20,000 bytes an hour, more than health.state_bytes_per_hour (10,000)" in said
    default = registry.health_limits(registry.query("page_visits"))
    assert (default.state_rows_per_hour, default.growth_window) == (None, timedelta(hours=6))
    assert growth("page_visits", leak, default, NOW) == []


def test_status_fires_state_growth_from_the_recorded_runs_and_history_prints_them(tmp_path):
    path = write_registry(tmp_path, page_visits={"health": {"state_rows_per_hour": 100}})
    registry = load_registry(path)
    now = datetime.now(UTC)
    for i, rows in enumerate((100, 300, 500)):
        at = now - timedelta(hours=2) + timedelta(hours=i)
        record(registry, "page_visits", run_point(_run(f"r{i}", rows), at))
    check = {"positions": [], "committed_at": None, "last_committed_batch": 7,
             "operators": [{"bytes": 2048}], "health": {"verdict": "WARN"}}  # fmt: skip
    record(registry, "page_visits", check_point(check, now))
    found = query_status(registry, "page_visits")["health"]["findings"]
    [rule] = [f for f in found if f["rule"] == "state_growth"]
    assert rule["level"] == "WARN" and rule["reason"].startswith(
        "state rows grew from 100 to 500 in 2 h (3 runs): 200 rows an hour"
    )
    assert query_status(registry, "page_visits")["history"] is None  # only when asked
    shown = query_status(registry, "page_visits", history=timedelta(hours=1, minutes=30))
    assert [p["source"] for p in shown["history"]] == ["run", "run", "check"]

    out = run_cli("--registry", str(path), "status", "page_visits", "--no-backups", "--history")
    # the query after --history is the query, not a duration
    after = run_cli("--registry", str(path), "status", "--no-backups", "--history", "page_visits")
    assert after.returncode == out.returncode and after.stdout == out.stdout, after.stderr
    lines = out.stdout.splitlines()
    at = lines.index("  history         4 points, oldest first")
    assert lines[at + 1].split() == ["time", "source", "batch", "state", "rows", "state",
                                     "bytes", "input", "rows", "batch", "s", "lag", "waiting",
                                     "s", "files"]  # fmt: skip
    first, last = lines[at + 2].split(), lines[at + 5].split()
    assert first[2:7] == ["run", "7", "100", "1000", "B"] and first[-4:] == ["1.5", "-", "-", "-"]
    assert last[2:] == ["check", "7", "-", "-", "-", "-", "-", "-", "2.0", "KB"], last
    as_json = json.loads(
        run_cli(
            "--registry",
            str(path),
            "status",
            "page_visits",
            "--no-backups",
            "--json",
            "--history",
            "2 hours",
        ).stdout  # fmt: skip
    )
    assert [p["source"] for p in as_json[0]["history"]] == ["run", "run", "check"]
    never = run_cli("--registry", str(path), "status", "user_sessions", "--no-backups", "--history")
    assert "  history         none recorded yet (its runs and health checks record it)" in (
        never.stdout.splitlines()
    )
    bad = run_cli("--registry", str(path), "status", "page_visits", "--history", "a week")
    assert bad.returncode != 0 and bad.stderr.strip().splitlines()[-1] == (
        "error: --history: expected a duration (90 minutes, 2 hours, 1 day), got 'a week'"
    )
