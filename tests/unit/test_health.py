"""The health verdict of `stateops status` and the Streaming state view (issue 20, item 5):
FAIL, WARN or OK with one reason per finding, on a registry without Spark (a Spark-written
checkpoint with input waiting and an interrupted rollback: tests/spark/test_backup.py)."""

from __future__ import annotations

import getpass
import json
import multiprocessing
import os
import socket
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import yaml

from stateops.control.lock import QueryLock
from stateops.control.markers import rollback_marker
from stateops.core.registry import HealthLimits, load_registry
from stateops.ops.carry import write_checkpoint_file
from stateops.ops.upgrade import EVOLVES, LOST, REWRITE, UNCHANGED, Change
from stateops.status import (
    _backup_age,
    _drill_failed,
    code_fit,
    health,
    query_status,
    unfinished_backfill,
)
from tests.conftest import run_cli, write_registry

pytestmark = pytest.mark.unit


def test_a_query_that_never_ran_is_warn_and_an_interrupted_rollback_is_fail(tmp_path):
    registry = load_registry(write_registry(tmp_path))
    never = "no committed batch yet (stream_start runs it)"
    assert query_status(registry, "page_visits")["health"] == {
        "verdict": "WARN",
        "reasons": [never],
        "findings": [{"rule": "no_commit_yet", "level": "WARN", "reason": never}],
    }
    with QueryLock(registry.lock_path("page_visits"), "page_visits", "cleanup", "run-7"):
        held = query_status(registry, "page_visits")["health"]
    assert "cleanup (run id run-7) holds the query" in held["reasons"]
    marker = rollback_marker(registry.query("page_visits").checkpoint)
    marker.parent.mkdir(parents=True)
    marker.write_text(json.dumps({"to_batch": 3, "run_id": "r-1"}))
    failed = query_status(registry, "page_visits")["health"]
    assert failed["verdict"] == "FAIL"
    assert failed["reasons"][0].startswith("a rollback was interrupted, the query refuses to start")


def test_backups_missing_or_older_than_twice_their_schedule_warn(tmp_path):
    registry = load_registry(write_registry(tmp_path))  # backups.schedule @daily
    within = registry.health_limits(registry.query("page_visits")).backup_within
    assert within == timedelta(days=2)
    now = datetime(2026, 11, 25, 12, tzinfo=UTC)
    backup = {"created_at": (now - timedelta(hours=30)).isoformat()}
    assert _backup_age("@daily", [], now, within) == [
        "no backup yet (stream_checkpoint_backup takes them)"
    ]
    assert _backup_age("@daily", [backup], now, within) == []
    old = {"created_at": (now - timedelta(days=3)).isoformat()}
    assert _backup_age("@daily", [old], now, within) == [
        "the last backup is 3 days old (schedule @daily, allowed: 2 days)"
    ]
    assert _backup_age("@daily", [old], now, None) == []  # a schedule of no known period


def test_a_query_s_own_schedules_set_its_health_windows(tmp_path):
    own = {"start": "5 minutes", "backup": "@hourly"}
    registry = load_registry(write_registry(tmp_path, page_visits={"schedules": own}))
    mine = registry.health_limits(registry.query("page_visits"))
    other = registry.health_limits(registry.query("user_sessions"))
    assert (mine.input_waiting, mine.backup_within) == (timedelta(minutes=10), timedelta(hours=2))
    assert (other.input_waiting, other.backup_within) == (timedelta(hours=1), timedelta(days=2))
    assert registry.schedule("cleanup", registry.query("page_visits")) == "@daily"


def test_the_newest_restore_drill_decides_and_a_backup_never_drilled_says_nothing(tmp_path):
    """backup_drill fires on the newest drill that failed, whichever backup it drilled, and is
    quiet again once a newer drill passed (tests/spark/test_backup.py: a real drill)."""
    registry = load_registry(write_registry(tmp_path))
    query = registry.query("page_visits")

    def backup(n: int, drill: tuple[bool, str] | None) -> dict:
        ok, at = drill or (None, None)
        record = drill and {"ok": ok, "drilled_at": at, "problem": None if ok else "corrupt"}
        return {"backup_id": f"b-{n}", "batch_id": n, "drill": record}

    assert _drill_failed(registry, query, []) == []
    assert _drill_failed(registry, query, [backup(1, None), backup(2, None)]) == []
    failed = [backup(1, (True, "2026-11-20T03:00:00+00:00")), backup(2, (False, "2026-11-27"))]
    assert _drill_failed(registry, query, failed) == [
        "backup b-2 (batch 2) failed its restore drill at 2026-11-27: corrupt; `stateops "
        f"backups verify {registry.backups.url}/page_visits/b-2` says which objects, "
        "`stateops drill page_visits` drills again"
    ]
    again = [backup(1, (True, "2026-11-28")), backup(2, (False, "2026-11-27"))]
    assert _drill_failed(registry, query, again) == []  # the older backup drilled since: passed


def _edited(path: Path, **top) -> Path:
    raw = yaml.safe_load(path.read_text())
    raw.update(top)
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


def test_health_thresholds_follow_the_schedules_unless_the_registry_or_the_query_sets_them(
    tmp_path,
):
    """Defaults from the schedules (input may wait two stream_start runs, a backup be two
    backup periods old); the registry's health: over them; a query's own over the registry's,
    its lag_records 0 lifting the registry's limit."""
    path = write_registry(
        tmp_path, page_visits={"health": {"input_waiting": "3 hours", "lag_records": 0}}
    )
    registry = load_registry(path)
    sessions, visits = registry.query("user_sessions"), registry.query("page_visits")
    assert registry.health_limits(sessions) == HealthLimits(
        input_waiting=timedelta(hours=1),  # start.schedule 30 minutes
        lag_records=None,
        retention_margin=0.1,
        backup_within=timedelta(days=2),  # backups.schedule @daily
    )
    assert registry.health_limits(visits).input_waiting == timedelta(hours=3)

    raw_backups = yaml.safe_load(path.read_text())["backups"]
    registry = load_registry(
        _edited(
            path,
            start={"schedule": "2 hours"},
            backups=raw_backups | {"schedule": "0 3 * * *"},
            health={"lag_records": 5000, "retention_margin": 0.25},
        )
    )
    assert registry.health_limits(registry.query("user_sessions")) == HealthLimits(
        timedelta(hours=4), 5000, 0.25, None
    )
    assert registry.health_limits(registry.query("page_visits")) == HealthLimits(
        timedelta(hours=3), None, 0.25, None
    )
    registry = load_registry(
        _edited(path, start={"schedule": "*/10 * * * *"}, health={"backup_within": "36 hours"})
    )
    limits = registry.health_limits(registry.query("user_sessions"))
    assert (limits.input_waiting, limits.backup_within) == (timedelta(hours=1), timedelta(hours=36))


def test_a_kafka_source_behind_more_than_its_lag_limit_fails_naming_it(tmp_path):
    """health.lag_records: a source further behind its topics' end fails, saying how far, the
    limit and the commands; at the limit, or without one, the lag is no finding."""
    path = write_registry(tmp_path, page_visits={"health": {"lag_records": 100}})
    registry = load_registry(path)
    query = registry.query("page_visits")
    status = query_status(registry, "page_visits")
    part = {"source": "source", "kind": "kafka", "topics": ["visits"], "lag_total": 100}
    part |= {"lag_unit": "records", "lost": [], "ahead": []}
    status["positions"] = [part | {"close": []}]
    assert health(registry, query, status, None, listed=False)["verdict"] == "WARN"  # no commit
    status["positions"] = [part | {"close": [], "lag_total": 101}]
    verdict = health(registry, query, status, None, listed=False)
    assert verdict["verdict"] == "FAIL" and verdict["findings"][0]["rule"] == "lag"
    assert verdict["reasons"][0] == (
        "kafka source: 101 records behind the end of visits, more than health.lag_records "
        "(100): the query does not keep up or is not run; stateops status page_visits shows "
        "each partition, stateops run page_visits reads them"
    )
    other = registry.query("user_sessions")
    assert health(registry, other, status, None, listed=False)["verdict"] == "WARN"


def _hold(path, operation: str, ready) -> None:
    QueryLock(path, "page_visits", operation, f"{operation}-1").acquire()
    ready.set()
    time.sleep(120)  # killed long before


@pytest.mark.parametrize("operation", ["run", "backfill"])
def test_a_lock_whose_holder_was_killed_is_a_warning_at_the_next_check(tmp_path, operation):
    """Issue 40: a killed run (or backfill) left its lock, not expired, and `status` said OK
    (a run's lock was never looked at; another's only once it expired)."""
    path = write_registry(tmp_path)
    registry = load_registry(path)
    ready = multiprocessing.Event()
    holder = multiprocessing.Process(
        target=_hold, args=(registry.lock_path("page_visits"), operation, ready)
    )
    holder.start()
    assert ready.wait(60)
    live = query_status(registry, "page_visits")["health"]["reasons"]
    running = [] if operation == "run" else [f"{operation} (run id {operation}-1) holds the query"]
    assert live == [*running, "no committed batch yet (stream_start runs it)"]
    holder.kill()  # SIGKILL: nothing of its own runs
    holder.join(30)
    owner = f"{getpass.getuser()}@{socket.gethostname()}:{holder.pid}"
    lost = (
        f"{operation} (run id {operation}-1) was killed or crashed holding the lock (process "
        f"{owner} is gone): stateops lock release page_visits"
    )
    never = "no committed batch yet (stream_start runs it)"
    assert query_status(registry, "page_visits")["health"] == {
        "verdict": "WARN",
        "reasons": [lost, never],
        "findings": [
            {"rule": "lock_lost", "level": "WARN", "reason": lost},
            {"rule": "no_commit_yet", "level": "WARN", "reason": never},
        ],
    }
    if operation == "backfill":
        return
    shown = run_cli("--registry", str(path), "lock", "show", "page_visits", check=True).stdout
    assert shown == (
        f"page_visits: locked by run (run id run-1, {owner}), whose process is gone (killed "
        "or crashed): stateops lock release page_visits\n"
    )
    status = run_cli(
        "--registry", str(path), "status", "page_visits", "--no-backups", check=True
    ).stdout
    assert "  WARN            run (run id run-1) was killed or crashed" in status, status
    assert "  backups         not listed (--no-backups)\n" in status, status
    run_cli("--registry", str(path), "lock", "release", "page_visits", check=True)
    assert query_status(registry, "page_visits")["health"]["reasons"] == [
        "no committed batch yet (stream_start runs it)"
    ]


def test_an_unfinished_backfill_is_said_until_it_or_a_run_with_its_logic_finishes():
    def record(operation: str, result: str, run_id: str = "bf-1", **more) -> dict:
        return {"operation": operation, "result": result, "run_id": run_id, **more}

    rolled = record(
        "backfill",
        "rolled back",
        batch_after=4,
        backup_id="b-9",
        registry="/d/_stateops/backfill/bf-1/registry.yaml",
        changes=['watermark.delay: "10 minutes" -> "1 hour"'],
    )
    failed = record(
        "backfill", "failed", error="run_query.py exited with code 1 (its output is above)"
    )
    assert unfinished_backfill("q", [record("run", "succeeded", "r0"), rolled, failed]) == (
        "backfill run bf-1 did not finish (failed: run_query.py exited with code 1 (its output "
        "is above)): it rolled back to batch 4 (backup b-9) and did not reprocess; unless its "
        "stream_backfill run is still going, stateops run q --registry "
        "/d/_stateops/backfill/bf-1/registry.yaml --run-id bf-1 reprocesses from there, as the "
        "backfill would have (its hold admits that run only)"
    )
    assert unfinished_backfill("q", [rolled], running="bf-1") is None  # reprocessing now
    assert unfinished_backfill("q", [rolled, record("run", "succeeded", "bf-1")]) is None
    assert unfinished_backfill("q", [rolled, record("run", "failed", "r2")]).startswith(
        "backfill run bf-1 did not finish (rolled back): it rolled back to batch 4 (backup b-9)"
    )
    assert unfinished_backfill("q", [rolled, record("backfill", "succeeded")]) is None
    assert unfinished_backfill("q", [record("run", "succeeded", "r0")]) is None
    # Its logic recorded: only a run with the backfill's logic finishes it; a run with the
    # query's own (a host that did not see the backfill's registry) is said.
    with_logic = {**rolled, "logic": "backfilled"}
    assert (
        unfinished_backfill(
            "q", [with_logic, record("run", "succeeded", "bf-1", logic="backfilled")]
        )
        is None
    )
    said = unfinished_backfill("q", [with_logic, record("run", "succeeded", "r3", logic="own")])
    assert said == (
        "backfill run bf-1 did not finish (rolled back): it rolled back to batch 4 (backup b-9), "
        "and run r3 then processed those batches with other logic than the backfill's "
        '(watermark.delay: "10 minutes" -> "1 hour"): backfill again to reprocess them with '
        "its changes (stateops backfill, or the stream_backfill DAG)"
    )


def test_code_that_does_not_fit_the_state_or_drops_mapped_state_fails(tmp_path):
    """The deployed code against the checkpoint (issue 44; the changes as the check finds them
    on Spark-written checkpoints: tests/spark/test_upgrade.py): what `stateops run` refuses
    fails the status."""
    registry = load_registry(write_registry(tmp_path))
    query = registry.query("page_visits")  # no initial_state.mapping
    key = Change("key", UNCHANGED, "(user_id string)")
    retyped = Change("state 'count'", REWRITE, "(visits long) in the checkpoint, (visits ...")
    kinds = Change("state 'pages'", REWRITE, "ListState in the checkpoint, ValueState ...")
    dropped = Change("state 'count'", EVOLVES, f"removed: Spark drops its state{LOST}", True)
    added = Change("state 'views'", EVOLVES, "added: Spark starts it empty")
    command = "plan the state rewrite with `stateops upgrade page_visits --dry-run`"
    assert code_fit(query, [key, retyped, kinds, added]) == [
        f"its code does not fit its checkpoint's state: {retyped.line()} (and 1 more); it "
        f"cannot start: {command}"
    ]
    assert code_fit(query, [key, dropped, added]) == [], "nothing says to keep it"
    mapped = query.model_copy(
        update={"initial_state": query.initial_state.model_copy(update={"mapping": "m:f"})}
    )
    assert code_fit(mapped, [dropped, added]) == [
        f"its code does not fit its checkpoint's state: {dropped.line()}; it cannot start: "
        f"{command}"
    ]
    assert code_fit(mapped, [key, added]) == []


def test_a_state_schema_the_code_check_cannot_read_is_said_not_a_crash(tmp_path):
    registry = load_registry(write_registry(tmp_path))
    root = Path(registry.query("page_visits").checkpoint)
    write_checkpoint_file(root, "metadata", json.dumps({"id": "q"}))
    meta = {"batchWatermarkMs": 0, "batchTimestampMs": 0, "conf": {}}
    write_checkpoint_file(root, "offsets/0", f"v1\n{json.dumps(meta)}\n-")
    write_checkpoint_file(root, "commits/0", 'v1\n{"nextBatchWatermarkMs": 0}')
    schema = "state/0/_stateSchema/default/0_abc"
    operator = {
        "operatorInfo": {"operatorId": 0, "operatorName": "transformWithStateInPandasExec"},
        "stateStoreInfo": [{"storeName": "default", "stateSchemaFilePaths": [f"{root}/{schema}"]}],
    }
    write_checkpoint_file(root, "state/0/_metadata/v2/0", "v2\n" + json.dumps(operator))
    write_checkpoint_file(root, schema, "\x00\x02v3\x00")  # cut short
    status = query_status(registry, "page_visits")
    assert status["code"] == [] and status["health"]["verdict"] == "WARN"
    (reason,) = status["health"]["reasons"]
    assert reason.startswith(f"code check: {root}/{schema}: unreadable state schema file"), reason
    assert reason.endswith("whether its code fits its checkpoint's state is not known")


def test_failed_runs_page_once_health_failed_runs_of_them_failed_in_a_row(tmp_path):
    """By default the last run failed is a FAIL; with health.failed_runs: 3, one or two
    failures in a row are a WARN that pages no one (rule run_retried, work in progress), the
    third a FAIL, and a success in between starts the count again."""
    from stateops.ops.start import write_summary

    path = write_registry(tmp_path, page_visits={"health": {"failed_runs": 3}})
    registry = load_registry(path)

    def ran(run_id: str, status: str) -> None:
        error = "boom" if status == "failed" else None
        write_summary(registry, {"query": "page_visits", "run_id": run_id, "status": status,
                                 "error": error})  # fmt: skip

    def findings(name: str = "page_visits") -> list[tuple[str, str, str]]:
        found = query_status(registry, name)["health"]["findings"]
        return [(f["rule"], f["level"], f["reason"]) for f in found if "run" in f["rule"]]

    ran("r1", "failed")
    assert findings() == [
        (
            "run_retried",
            "WARN",
            "the last run failed, 1 in a row (health.failed_runs: 3 page): boom",
        )
    ]
    ran("r2", "failed")
    assert findings()[0][0] == "run_retried" and "2 in a row" in findings()[0][2]
    ran("r3", "failed")
    assert findings() == [
        ("run_failed", "FAIL", "the last 3 runs failed (health.failed_runs: 3): boom")
    ]
    ran("r4", "succeeded")
    assert findings() == []
    ran("r5", "failed")
    assert findings()[0][:2] == ("run_retried", "WARN")
    # A run that lost its lease (stalled, taken over) failed for no fault of the query's: it
    # is neither the last run nor one in the row (finding 11: readiness switched a healthy
    # upgrade back for it).
    write_summary(registry, {"query": "page_visits", "run_id": "r6", "status": "failed",
                             "error": "lost the query's lease", "lock_lost": True})  # fmt: skip
    assert findings()[0][:2] == ("run_retried", "WARN") and "1 in a row" in findings()[0][2]
    assert "boom" in findings()[0][2]
    ran("r7", "failed")
    assert "2 in a row" in findings()[0][2]
    # user_sessions keeps the default: its one failed run is a FAIL
    write_summary(registry, {"query": "user_sessions", "run_id": "s1", "status": "failed",
                             "error": "bad"})  # fmt: skip
    assert findings("user_sessions") == [("run_failed", "FAIL", "the last run failed: bad")]


def test_the_status_says_who_holds_the_query_now_and_until_when(tmp_path):
    """Seen from any host (the lease's place; here the local one): the operation, its run,
    its process, since and until when."""
    from stateops.status import format_status

    registry = load_registry(write_registry(tmp_path))
    assert query_status(registry, "page_visits")["holder"] is None
    with QueryLock(registry.lock_path("page_visits"), "page_visits", "rollback", "rb-7"):
        status = query_status(registry, "page_visits")
    who = status["holder"]
    assert (who["operation"], who["run_id"], who["state"]) == ("rollback", "rb-7", "held")
    assert who["owner"].endswith(f"@{socket.gethostname()}:{os.getpid()}")
    assert datetime.fromisoformat(who["until"]) > datetime.fromisoformat(who["since"])
    line = f"  held by         rollback (run rb-7, {who['owner']}) since {who['since']}, "
    assert line + f"its lease until {who['until']} (held)" in format_status(status)
