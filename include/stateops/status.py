"""A registered query's state health in one read-only look: `stateops status` and the Airflow
"Streaming state" view both show :func:`query_status`.

Everything comes from files the lifecycle operations already write (the checkpoint, its audit
log and validations beside it, the last run's summary), for the backups from the backup
store's manifests, and for a Kafka source from its broker (end and earliest offsets: the lag
and the retention margin, :mod:`stateops.core.sources`); the deployed code is checked against
the checkpoint's state schemas (:func:`stateops.ops.upgrade.check_code_change`, pure Python).
Nothing here writes, takes a lock or starts Spark.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import asdict
from datetime import UTC, datetime, timedelta
from typing import Any

from stateops.control.audit import audit_dir, read_audit
from stateops.control.history import RUN_FIGURES, format_history, growth, read_history, run_point
from stateops.control.lock import LockInfo, lock_state, read_hold, read_lock
from stateops.control.markers import read_rollback
from stateops.control.target import query_target
from stateops.core.checkpoint import Checkpoint, interrupted_batch, load_checkpoint
from stateops.core.errors import StateOpsError, one_line
from stateops.core.registry import HealthLimits, Query, Registry
from stateops.core.report import checkpoint_report, format_bytes
from stateops.core.storage import location
from stateops.core.times import format_span
from stateops.kinds import Source, source_kind
from stateops.ops.backup import describe_drill, list_backups
from stateops.ops.readiness import readiness
from stateops.ops.start import failed_in_a_row
from stateops.ops.upgrade import (
    Change,
    blocking,
    check_code_change,
    first_of,
    plan_command,
    refuse_what_a_run_refuses,
)
from stateops.spark.expectations import data_docs_path, last_validation

__all__ = [
    "LINEAGE_OPERATIONS",
    "code_fit",
    "describe_cleanup",
    "describe_holder",
    "format_status",
    "health",
    "query_status",
    "unfinished_backfill",
]

# The operations that change where a query's state came from (shown as its lineage).
LINEAGE_OPERATIONS = ("bootstrap", "migration", "upgrade", "rollback", "restore", "backfill")

# The health rules: each finding of :func:`health` names one, with its level. Those of
# WORK_IN_PROGRESS say what an operator is doing or what the next run does; the health DAG
# (stream_health, stateops.alerts) pages for every other rule that fires.
RULES = {
    "registry": "FAIL",  # its registry entry is refused
    "checkpoint": "FAIL",  # the checkpoint cannot be read
    "rollback": "FAIL",  # an interrupted rollback
    "code": "FAIL",  # the deployed code does not fit the state
    "run_failed": "FAIL",  # health.failed_runs in a row
    "validation_failed": "FAIL",
    "retention_passed": "FAIL",  # Kafka records deleted unread
    "offsets_ahead": "FAIL",  # committed offsets past the topic's end
    "source_changed": "FAIL",  # the checkpoint read another place than the registry names
    "lag": "FAIL",  # health.lag_records
    "refused": "FAIL",  # never committed, and a run refuses to start it
    "unreadable": "WARN",  # a part of the status could not be read (a broker, the backups)
    "lock_lost": "WARN",  # the lock's holder is gone or hung
    "held": "WARN",  # an operation holds the query
    "retention_close": "WARN",  # health.retention_margin
    "planned": "WARN",  # a batch planned and not committed: the next run finishes it
    "run_retried": "WARN",  # runs failed, fewer than health.failed_runs in a row
    "malformed": "WARN",  # the last run skipped values that did not parse (malformed: count)
    "backfill": "WARN",  # an unfinished backfill
    "no_commit_yet": "WARN",
    "input_waiting": "WARN",  # health.input_waiting: input not read, nothing committed
    "backup_age": "WARN",  # health.backup_within
    "backup_drill": "FAIL",  # the newest restore drill failed
    "state_growth": "WARN",  # health.state_rows_per_hour, health.state_bytes_per_hour
    "switch_failed": "FAIL",  # a switch failed its readiness window: stream_health undoes it
    "switched_back": "FAIL",  # ... and was undone: until the query runs again
}
WORK_IN_PROGRESS = frozenset({"held", "planned", "backfill", "no_commit_yet", "run_retried"})


def query_status(
    registry: Registry,
    name: str,
    s3_client: Any = None,
    unlisted: str | None = None,
    history: timedelta | None = None,
) -> dict[str, Any]:
    """What an operator asks of a query's state. ``s3_client`` lists the backups (None: not
    listed; ``unlisted``: why they could not be, an error of the status); ``history``: the
    query's figures over that long are read too (:mod:`stateops.control.history`). A part
    that cannot be read is reported in ``errors`` and left empty; the rest is still shown. A
    query whose registry entry is refused is a FAIL that says why."""
    if name in registry.invalid:
        return _status(name, {}, "its registry entry is refused", "unknown") | {
            "health": _verdict([("registry", registry.invalid[name])])
        }
    target = query_target(registry, name)
    query = target.require_query(name)
    status = _status(name, query.inputs_brief, query.inputs_text, query.checkpoint)
    status["backups_listed"] = s3_client is not None
    status["errors"] += [unlisted] if unlisted else []
    cp = None
    if location(query.checkpoint).exists():
        try:
            cp = load_checkpoint(query.checkpoint)
            # Snapshot groups as the checkpoint model and the cleanup count them: by the
            # query's own minDeltasForSnapshot.
            _checkpoint_part(status, cp, query.state_store.min_deltas_for_snapshot)
            status["code"] = _code_part(status, query, cp)
        except StateOpsError as err:
            status["errors"].append(f"checkpoint: {err}")
    limits = registry.health_limits(query)
    try:
        status["positions"] = _positions(status, query, cp, limits.retention_margin)
    except StateOpsError as err:  # an unreadable sources/<i>/0: the rest is still shown
        status["positions"] = []
        status["errors"].append(f"sources: {err}")
    status["last_run"] = _last_run(registry, name, limits.failed_runs)
    records = _history(query.checkpoint)
    cleanups = [r for r in records if r["operation"] == "cleanup"]
    status["last_cleanup"] = cleanups[-1] if cleanups else None
    # A backfill records each step as it completes: its last record says how far it got.
    steps = {r.get("run_id"): r for r in records if r["operation"] == "backfill"}
    status["lineage"] = [
        r
        for r in records
        if r["operation"] in LINEAGE_OPERATIONS
        and (r["operation"] != "backfill" or steps[r.get("run_id")] is r)
    ]
    held = read_lock(target.lock_file)
    status["holder"] = _holder(held)
    holding = status["holder"] and status["holder"]["state"] == "held"
    running = held if holding else None  # a backfill's reprocessing
    status["unfinished_backfill"] = unfinished_backfill(
        name, records, running.run_id if running else None
    )
    status["last_validation"] = v = _last_validation(query)
    for op in status["operators"] if v else []:  # rows per store, read by the validation
        rows = [x["rows"] for x in v["variables"].values() if x["operator"] == op["operator_id"]]
        if rows:
            op["state_rows"], op["rows_as_of_batch"] = sum(rows), v["batch_id"]
    if s3_client is not None:
        try:
            where = target.backup_location()
            status["backups"] = list_backups(where, s3_client)
        except StateOpsError as err:
            status["errors"].append(f"backups: {err}")
    if history is not None:
        try:
            status["history"] = read_history(registry, name, datetime.now(UTC) - history)
        except StateOpsError as err:
            status["errors"].append(f"history: {err}")
    _readiness_part(status, registry, query, limits, cp, running)
    if status["last_committed_batch"] is None:
        try:
            refuse_what_a_run_refuses(query)
        except StateOpsError as err:
            status["refused"] = one_line(err)
    status["health"] = health(registry, query, status, cp, listed=s3_client is not None)
    return status


def _readiness_part(
    status: dict[str, Any],
    registry: Registry,
    query: Query,
    limits: HealthLimits,
    cp: Checkpoint | None,
    running: Any,
) -> None:
    """The query's last switch, and where it is in its readiness window (``running``: the
    lock of the run going on, if any); a part that cannot be read is an error of the status."""
    since = running and running.operation == "run" and running.acquired_at
    try:
        switches = registry.switch_history(query.name)
        status["last_switch"] = switches[-1] if switches else None
        status["readiness"] = readiness(
            query,
            limits,
            status["last_switch"],
            status["last_run"],
            status["last_committed_batch"],
            datetime.fromtimestamp(since, UTC) if since else None,
            _unread_before(query, cp, status["positions"]),
            datetime.now(UTC),
        )
    except (StateOpsError, OSError, ValueError, KeyError, TypeError) as err:
        status["errors"].append(f"readiness: {one_line(err)}")


def _status(name: str, sources: dict, inputs: str, checkpoint: str) -> dict[str, Any]:
    """A status with nothing read yet."""
    return {
        "query": name,
        "sources": sources,
        "inputs": inputs,
        "checkpoint": checkpoint,
        "last_committed_batch": None,
        "committed_at": None,
        "operators": [],
        "code": [],  # the deployed code against the checkpoint's state: Change, as dicts
        "positions": [],
        "changed_under": [],  # a source's place that changed under the checkpoint
        "last_run": None,
        "last_cleanup": None,
        "backups": [],
        "backups_listed": False,
        "last_validation": None,
        "lineage": [],
        "holder": None,
        "unfinished_backfill": None,
        "refused": None,  # never run: why a run refuses to start it (a topic, a broker)
        "history": None,  # the figures over time, when asked (stateops.control.history)
        "last_switch": None,  # the last record of its switch's history (None: never switched)
        "readiness": None,  # the last switch's readiness window (stateops.ops.readiness)
        "errors": [],
    }


def health(
    registry: Registry,
    query: Any,
    status: dict[str, Any],
    cp: Checkpoint | None,
    *,
    listed: bool,
    now: datetime | None = None,
) -> dict[str, Any]:
    """The verdict an on-call engineer wants first: FAIL (the query cannot run as it is, its
    code among others, or its last run or validation failed, or retention deleted records a
    Kafka source has not read, or it is further behind than its lag limit), WARN (it needs a
    look: input waiting, no recent backup, an operation holding it, no commit yet, retention
    close to a Kafka source's committed offsets, a broker that does not answer), else OK;
    with one reason per finding, and each finding's rule (:data:`RULES`). ``cp``: the
    checkpoint :func:`query_status` read (None when it could not)."""
    now = now or datetime.now(UTC)
    limits = registry.health_limits(query)
    found: list[tuple[str, str]] = [
        ("checkpoint" if e.startswith("checkpoint: ") else "unreadable", e)
        for e in status["errors"]
    ]
    root = query.checkpoint
    if read_rollback(root) is not None:
        found.append(
            (
                "rollback",
                f"a rollback was interrupted, the query refuses to start: finish it "
                f"(stateops rollback {query.name} --to-batch N, N as it says)",
            )
        )
    found += [("code", r) for r in code_fit(query, [Change(**c) for c in status["code"]])]
    found += _run_findings(status["last_run"], limits.failed_runs)
    found += _switch_findings(query, status)
    v = status["last_validation"]
    if v and not v["ok"]:
        found.append(
            (
                "validation_failed",
                f"the last validation (batch {v['batch_id']}) failed: {v['file']}",
            )
        )
    state = _lock_findings(registry, query.name, found)
    for part in status.get("positions", []):
        found += source_kind(part["kind"]).findings(query.name, part, limits)
    found += [("source_changed", _changed(c)) for c in status.get("changed_under", [])]
    if cp is not None and cp.uncommitted_batches and state != "held":
        found.append(("planned", _planned(query, cp, status["last_run"])))
    if status["unfinished_backfill"]:
        found.append(("backfill", status["unfinished_backfill"]))
    if status.get("refused"):
        found.append(
            (
                "refused",
                f"no committed batch yet, and a run refuses to start it: {status['refused']}",
            )
        )
    elif status["last_committed_batch"] is None:
        found.append(("no_commit_yet", "no committed batch yet (stream_start runs it)"))
    elif cp is not None:
        committed = datetime.fromisoformat(status["committed_at"])
        found += [("input_waiting", r) for r in _waiting_input(query, cp, now, limits)]
        found += [
            ("input_waiting", r)
            for r in _records_waiting(query.name, status["positions"], committed, now, limits)
        ]
    if listed and status["last_committed_batch"] is not None:
        schedule = registry.schedule("backup", query)
        backups = _backup_age(schedule, status["backups"], now, limits.backup_within)
        found += [("backup_age", r) for r in backups]
    if listed:
        found += [("backup_drill", r) for r in _drill_failed(registry, query, status["backups"])]
    if limits.state_rows_per_hour or limits.state_bytes_per_hour:
        try:
            points = read_history(registry, query.name, now - limits.growth_window)
        except StateOpsError as err:
            found.append(("unreadable", f"history: {err}"))
        else:
            found += [("state_growth", r) for r in growth(query.name, points, limits, now)]
    return _verdict(found)


def _changed(changed: dict[str, Any]) -> str:
    return (
        f"source {changed['source']}: the checkpoint read another place than "
        f"{changed['where']} (its entry: {changed['entry']}): the place was recreated, or the "
        "registry names another than the checkpoint read; a restart fails or reads from "
        "elsewhere: restore the place, or migrate the query to it"
    )


def _run_findings(run: dict[str, Any] | None, limit: int) -> list[tuple[str, str]]:
    """The last run failed: ``limit`` (health.failed_runs) runs in a row or more, a FAIL;
    fewer, a WARN that pages no one. It skipped values that did not parse: a WARN."""
    skipped = []
    if run and run.get("malformed_records"):
        n = run["malformed_records"]
        said = (
            f"the last run skipped {n} records whose values did not parse as their source's "
            "schema (malformed: count); fix the producer, or read them raw"
        )
        skipped.append(("malformed", said))
    if not run or run["status"] != "failed":
        return skipped
    said, n = run.get("error") or "see its log", run["failed_in_a_row"]
    if limit == 1:
        return [*skipped, ("run_failed", f"the last run failed: {said}")]
    if n >= limit:
        failed = f"the last {n} runs failed (health.failed_runs: {limit}): {said}"
        return [*skipped, ("run_failed", failed)]
    retried = f"the last run failed, {n} in a row (health.failed_runs: {limit} page): {said}"
    return [*skipped, ("run_retried", retried)]


def _switch_findings(query: Any, status: dict[str, Any]) -> list[tuple[str, str]]:
    """A switch that failed its readiness window (stream_health switches it back), or one that
    was switched back so, until the query's next run succeeds."""
    ready = status["readiness"]
    if ready and ready["state"] == "failed":
        old = status["last_switch"]["from"]["checkpoint"]
        return [
            (
                "switch_failed",
                f"the {ready['operation']} of run {ready['run_id']} failed its readiness window "
                f"(until {ready['until']}): {ready['reason']}; stream_health switches "
                f"{query.name} back to {old}",
            )
        ]
    undo = status["last_switch"] or {}
    run = status["last_run"]
    if not undo.get("reason") or (
        run
        and run["status"] == "succeeded"
        and run.get("checkpoint") == query.checkpoint
        and datetime.fromisoformat(run["started_at"]) >= datetime.fromisoformat(undo["time"])
    ):
        return []
    done = [
        r
        for r in status["lineage"]
        if r.get("run_id") == undo["run_id"] and r.get("result") == "rolled back"
    ]
    if not done:  # the switch was written back, and what follows it was not done
        return [
            (
                "switched_back",
                f"{undo['reason']} (at {undo['time']}), and switching back stopped before its "
                f"end: see stream_health's log, then finish it by hand (stateops unretire "
                f"{query.checkpoint}; docs/backfill-migration.md)",
            )
        ]
    aside = done[-1].get("moved_aside")
    kept = f"; its checkpoint is kept aside: {', '.join(aside)}" if aside else ""
    then = (
        "put the old code back in its registry entry to run it (the new code needs the "
        "state the upgrade rewrote), or fix the new code and upgrade again"
        if undo["operation"].startswith("upgrade")
        else "it runs on its old source again; fix the new one, then migrate again"
    )
    return [("switched_back", f"{undo['reason']} (at {undo['time']}){kept}: {then}")]


def _holder(held: LockInfo | None) -> dict[str, Any] | None:
    """Who holds the query's lease now, as any host reads it (the control store's object):
    the operation, its run, its process (user@host:pid), since and until when (its lease, as
    the store's clock says), and whether it is held, expired or its process gone."""
    if held is None:
        return None
    return {
        "operation": held.operation,
        "run_id": held.run_id,
        "owner": held.owner,
        "since": _iso(held.acquired_at),
        "until": _iso(held.expires_at),
        "state": lock_state(held),
    }


def describe_holder(who: dict[str, Any]) -> str:
    """A status's ``holder`` (:func:`_holder`) in words, as `stateops status` and the UI say it."""
    return (
        f"{who['operation']} (run {who['run_id']}, {who['owner']}) since {who['since']}, its "
        f"lease until {who['until']} ({who['state']})"
    )


def _iso(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, UTC).isoformat(timespec="seconds")


def _lock_findings(registry: Registry, name: str, found: list[tuple[str, str]]) -> str | None:
    """The query's lock and hold into ``found``: an operation holding it, or a holder gone or
    hung. Returns the lock's state (None: free)."""
    lock = query_target(registry, name).lock_file
    held = read_lock(lock)
    state = None if held is None else lock_state(held)
    if held is not None:
        who = f"{held.operation} (run id {held.run_id})"
        release = f"stateops lock release {name}"
        if state == "holder gone":
            why = f"was killed or crashed holding the lock (process {held.owner} is gone)"
            found.append(("lock_lost", f"{who} {why}: {release}"))
        elif state == "expired":
            found.append(
                (
                    "lock_lost",
                    f"{who} left the lock expired: its holder is gone or hung ({release})",
                )
            )
        elif held.operation != "run":
            found.append(("held", f"{who} holds the query"))
    hold = read_hold(lock)
    if hold is not None:
        who = f"{hold.operation} (run id {hold.run_id})"
        found.append(("held", f"{who} holds the query (other operations wait)"))
    return state


def _verdict(found: list[tuple[str, str]]) -> dict[str, Any]:
    """The verdict of ``found`` (rule, reason): the worst level among them, the FAIL reasons
    first."""
    findings = [{"rule": r, "level": RULES[r], "reason": why} for r, why in found]
    findings.sort(key=lambda f: f["level"] != "FAIL")  # stable: each level in its order
    levels = {f["level"] for f in findings}
    verdict = "FAIL" if "FAIL" in levels else "WARN" if levels else "OK"
    return {
        "verdict": verdict,
        "reasons": [f["reason"] for f in findings],
        "findings": findings,
    }


def _last_run(registry: Registry, name: str, limit: int) -> dict[str, Any] | None:
    """What the summary of the query's last run says (None: it never ran), and how many runs
    in a row failed, counted up to ``limit``."""
    summary = registry.run_summary_path(name)
    if not summary.exists():
        return None
    run = json.loads(summary.read_text())
    keys = (
        "status",
        "operation",
        "started_at",
        "last_committed_batch",
        "uncommitted_batches",
        "checkpoint",
        "error",
        "malformed_records",
    )
    failed = 0
    if run.get("status") == "failed":  # the latest is written last: the index lists it
        failed = max(failed_in_a_row(registry, name, limit), 1) if limit > 1 else 1
    figures = run_point(run)
    return {k: run.get(k) for k in keys} | {
        "failed_in_a_row": failed,
        "figures": {k: figures[k] for k in RUN_FIGURES},
    }


def _code_part(status: dict[str, Any], query: Any, cp: Checkpoint) -> list[dict[str, Any]]:
    """The deployed code's changes against the checkpoint's state; a state schema or code the
    check cannot read is an error of the status (a WARN), not a crash."""
    try:
        return [asdict(c) for c in check_code_change(cp, query)]
    except (StateOpsError, ValueError, KeyError, TypeError, OSError) as err:
        status["errors"].append(
            f"code check: {one_line(err)}; whether its code fits its checkpoint's state is "
            "not known"
        )
        return []


def code_fit(query: Any, changes: list[Change]) -> list[str]:
    """What the deployed code does to the checkpoint's state (``changes``), as FAIL reasons:
    a change Spark refuses, or state Spark would drop that the registry's
    initial_state.mapping keeps; ``stateops run`` and ``stream_start`` refuse both. Each names
    the change and the command that plans the rewrite."""
    needed = blocking(query, changes)
    if not needed:
        return []
    return [
        f"its code does not fit its checkpoint's state: {first_of(needed)}; it cannot "
        f"start: plan the state rewrite with {plan_command(query.name)}"
    ]


def _positions(
    status: dict[str, Any], query: Any, cp: Checkpoint | None, close: float
) -> list[dict[str, Any]]:
    """Per source that has one (:meth:`SourceKind.position`): where the checkpoint's entry for
    it (the last committed batch's; before any, the one it started at) stands against its
    input, its lag and what its kind finds (``close``: the share of the retained input that is
    close to its earliest). Servers that do not answer are one error naming them; the rest of
    the status is still read."""
    parts = []
    for name, source in query.inputs.items():
        batch = cp.last_committed_batch if cp is not None else None
        raw, stranger = _committed(cp, batch, source, query)
        try:
            part = source.kind.position(source, raw, close)
        except (StateOpsError, OSError, ValueError) as err:  # its log or servers unreadable
            status["errors"].append(f"{source.kind.name} {name}: {err}")
            part = source.kind.position(source, None, close)
            if part is not None:
                part.update(committed=raw, said="lag unknown (see the status's errors)")
        if part is not None:
            parts.append({"source": name, "committed_batch": batch, **part})
        if stranger is not None:  # shown whatever the kind's position says
            status["changed_under"].append(
                {"source": name, "where": source.where, "entry": source.kind.entry_text(stranger)}
            )
    return parts


def _committed(
    cp: Checkpoint | None, batch: int | None, source: Source, query: Any
) -> tuple[object | None, object | None]:
    """The checkpoint's entry for ``source`` as of committed ``batch`` (before any, the one it
    started at): None when it has none yet, or no one entry is ``source``'s (the checkpoint's
    sources follow Spark's plan, not the registry's order: a guess could show another
    source's). And the entry the checkpoint holds of ``source``'s kind that is not
    ``source``'s, where the query reads no other source of that kind: its place changed under
    the checkpoint (a table recreated, a topic renamed in the registry); else None."""
    if cp is None:
        return None, None
    kind = source.kind
    indexes = [i for i, k in cp.source_kinds().items() if k is kind]
    found = [cp.started(i) if batch is None else cp.entry(batch, i) for i in indexes]
    found = [raw for raw in found if raw is not None]
    said = [(raw, kind.matches(source, raw)) for raw in found]
    same = [raw for raw, match in said if match]
    alone = sum(1 for s in query.inputs.values() if s.kind is kind) == 1
    other = [raw for raw, match in said if match is False]  # its entry names another place
    stranger = other[0] if not same and alone and len(found) == len(other) == 1 else None
    return (same[0] if len(same) == 1 else None), stranger


def _planned_batch(name: str, batch: int, last: int | None) -> str:
    drop = f" (or drop it: stateops rollback {name} --to-batch {last})" if last is not None else ""
    return f"{interrupted_batch(batch)}: stateops run {name} finishes it{drop}"


def _planned(query: Any, cp: Checkpoint, run: dict[str, Any] | None) -> str:
    """What to do about the checkpoint's planned batch; one the last run planned and failed
    on is not run again as it is."""
    batch, last = cp.uncommitted_batches[0], cp.last_committed_batch
    failed_here = (
        run is not None
        and run["status"] == "failed"
        and run.get("checkpoint") == query.checkpoint
        and run.get("last_committed_batch") == last
        and batch in (run.get("uncommitted_batches") or [])
    )
    if not failed_here:
        return _planned_batch(query.name, batch, last)
    rollback = f"stateops rollback {query.name} --to-batch {last}"
    drop = f": drop it with {rollback}" if last is not None else ""
    return (
        f"batch {batch} is planned but not committed: the last run planned it and failed "
        f"(above), and a run fails the same way until that is mended{drop}, or run it once "
        "mended"
    )


def unfinished_backfill(
    name: str, records: list[dict[str, Any]], running: str | None = None
) -> str | None:
    """Why the last backfill of ``name`` is unfinished (killed or failed after its rollback),
    with what it had done and how to go on; None when it finished, or a successful run of the
    query with the backfill's logic came after its rollback (its reprocessing, or a run that
    did the same). A run with other logic (the query's own, on a host that did not see the
    backfill's registry) reprocessed its batches otherwise: said so, with the way back.
    ``records``: the checkpoint's audit records, oldest first (a backfill writes one as each
    of its steps completes: ``rolled back``, then ``succeeded``, or ``failed``); ``running``:
    the run id of the live lock's holder (a backfill that holds it is not unfinished yet)."""
    backfills = [i for i, r in enumerate(records) if r["operation"] == "backfill"]
    if not backfills or records[backfills[-1]]["result"] == "succeeded":
        return None
    last = records[backfills[-1]]
    if last["run_id"] == running:
        return None
    i = next(
        (
            i
            for i in backfills
            if records[i]["run_id"] == last["run_id"] and records[i]["result"] == "rolled back"
        ),
        None,
    )
    if i is None:
        return None
    rolled = records[i]
    runs = [r for r in records[i + 1 :] if r["operation"] == "run" and r["result"] == "succeeded"]
    wanted = rolled.get("logic")  # None: a record from before runs recorded their logic
    if any(wanted is None or r.get("logic") == wanted for r in runs):
        return None
    error = f": {last['error']}" if last.get("error") else ""
    if runs:
        return (
            f"backfill run {last['run_id']} did not finish ({last['result']}{error}): it rolled "
            f"back to batch {rolled['batch_after']} (backup {rolled.get('backup_id')}), and run "
            f"{runs[0]['run_id']} then processed those batches with other logic than the "
            f"backfill's ({'; '.join(rolled.get('changes') or [])}): backfill again to "
            "reprocess them with its changes (stateops backfill, or the stream_backfill DAG)"
        )
    registry = f" --registry {rolled['registry']}" if rolled.get("changes") else ""
    return (
        f"backfill run {last['run_id']} did not finish ({last['result']}{error}): it rolled "
        f"back to batch {rolled['batch_after']} (backup {rolled.get('backup_id')}) and "
        f"did not reprocess; unless its stream_backfill run is still going, stateops run "
        f"{name}{registry} --run-id {last['run_id']} reprocesses from there, as the "
        "backfill would have (its hold admits that run only)"
    )


def _waiting_input(query: Any, cp: Checkpoint, now: datetime, limits: HealthLimits) -> list[str]:
    """Input files landed more than ``limits.input_waiting`` ago and not read yet, per file
    source."""
    allowed = limits.input_waiting
    reasons = []
    for name, waiting in _unread_files(query, cp):
        oldest = min(waiting, default=None)
        if oldest is not None and now - datetime.fromtimestamp(oldest, UTC) > allowed:
            age = format_span(now - datetime.fromtimestamp(oldest, UTC))
            files = f"{len(waiting)} input file" + "s" * (len(waiting) != 1)
            reasons.append(
                f"{files} of {name} landed and not read, the oldest {age} ago "
                f"(allowed: {format_span(allowed)}, health.input_waiting); stateops run "
                f"{query.name} reads them"
            )
    return reasons


def _unread_files(query: Any, cp: Checkpoint) -> Iterator[tuple[str, list[float]]]:
    """Per source whose kind knows when its input landed (local files): the times of the
    input the query has not read."""
    for i, (name, source) in enumerate(query.inputs.items()):
        waiting = source.kind.waiting(source, cp, i)
        if waiting is not None:
            yield name, waiting


def _unread_before(
    query: Any, cp: Checkpoint | None, positions: list[dict[str, Any]]
) -> Callable[[datetime], bool]:
    """Whether input the query has not read was there before a time: files landed before it,
    or (their times unknown) input of a source behind its end (its lag)."""

    def before(when: datetime) -> bool:
        if any(part["lag_total"] for part in positions):
            return True
        limit = when.timestamp()
        return cp is not None and any(
            mtime < limit for _, waiting in _unread_files(query, cp) for mtime in waiting
        )

    return before


def _records_waiting(
    name: str, parts: list[dict[str, Any]], committed: datetime, now: datetime, limits: HealthLimits
) -> list[str]:
    """Per source with input to read (its lag): none committed for longer than
    ``limits.input_waiting`` (the query is stalled, or not run)."""
    if now - committed <= limits.input_waiting:
        return []
    return [
        f"{part['kind']} {part['source']}: {part['lag_total']} {part['lag_unit']} waiting and "
        "no batch committed "
        f"for {format_span(now - committed)} (allowed: {format_span(limits.input_waiting)}, "
        f"health.input_waiting): the query is stalled or not run; stateops run {name} reads "
        "them"
        for part in parts
        if part["lag_total"]
    ]


def _backup_age(
    schedule: str, backups: list[dict[str, Any]], now: datetime, within: timedelta | None
) -> list[str]:
    """No backup, or none newer than ``within`` (None: any age will do); ``schedule``: the
    query's backup schedule, as the line says it."""
    if not backups:
        return ["no backup yet (stream_checkpoint_backup takes them)"]
    last = max(datetime.fromisoformat(b["created_at"]) for b in backups)
    if within is not None and now - last > within:
        return [
            f"the last backup is {format_span(now - last)} old (schedule "
            f"{schedule}, allowed: {format_span(within)})"
        ]
    return []


def _drill_failed(registry: Registry, query: Query, backups: list[dict[str, Any]]) -> list[str]:
    """The newest restore drill failed: that backup would not restore."""
    drilled = [b for b in backups if b["drill"] is not None]
    if not drilled:
        return []
    last = max(drilled, key=lambda b: b["drill"]["drilled_at"])
    if last["drill"]["ok"]:
        return []
    return [
        f"backup {last['backup_id']} (batch {last['batch_id']}) failed its restore drill at "
        f"{last['drill']['drilled_at']}: {last['drill']['problem']}; `stateops backups verify "
        f"{registry.backups.url_for(query.name)}/{last['backup_id']}` says which objects, "
        f"`stateops drill {query.name}` drills again"
    ]


def _checkpoint_part(status: dict[str, Any], cp: Checkpoint, min_deltas: int) -> None:
    report = checkpoint_report(cp, min_deltas)
    last = report["last_committed_batch"]
    status["last_committed_batch"] = last
    if last is not None:
        mtime = (cp.root / "commits" / str(last)).stat().st_mtime
        status["committed_at"] = datetime.fromtimestamp(mtime, UTC).isoformat(timespec="seconds")
    status["operators"] = [
        {
            "operator_id": op["operator_id"],
            "operator_name": op["operator_name"],
            "partitions": op["num_partitions"],
            "bytes": op["total_bytes"],
            "state_rows": None,
            "rows_as_of_batch": None,
            "snapshot_groups": [
                {
                    "group_id": g["group_id"],
                    "versions": [g["min_version"], g["max_version"]],
                    "bytes": g["bytes"],
                }
                for g in op["snapshot_groups"]
            ],
        }
        for op in report["operators"]
    ]


def _history(checkpoint: str) -> list[dict[str, Any]]:
    """The audit records of this checkpoint and of those it was derived from, oldest first."""
    records: list[dict[str, Any]] = []
    seen: set[str] = set()
    while checkpoint and checkpoint not in seen:
        seen.add(checkpoint)
        own = [dict(r, checkpoint=checkpoint) for r in read_audit(checkpoint)]
        records = own + records
        checkpoint = next((r["derived_from"] for r in own if r.get("derived_from")), None)
    return sorted(records, key=lambda r: r["time"])


def _last_validation(query: Any) -> dict[str, Any] | None:
    last = last_validation(audit_dir(query.checkpoint))
    if last is None:
        return None
    path, result = last
    docs = data_docs_path(query)
    stores = result["variables"]
    many = len({v.get("operator_id", 0) for v in stores}) > 1  # two stores may be `default`
    return {
        "batch_id": result["batch_id"],
        "ok": result["ok"],
        "variables": {
            (f"operator {v['operator_id']} " if many else "") + v["variable"]: {
                "rows": v["rows"],
                "ok": v["ok"],
                "operator": v.get("operator_id", 0),  # a result before operators were named
            }
            for v in stores
        },
        "file": str(path),
        "data_docs": str(docs) if docs.exists() else None,
    }


def describe_cleanup(c: dict[str, Any] | None) -> str:
    if not c:
        return "never"
    return (
        f"{c['time']}: {c['result']}, {c.get('deleted_files') or 0} files, "
        f"{format_bytes(c.get('deleted_bytes') or 0)} deleted"
    )


def _position_lines(s: dict[str, Any]) -> list[str]:
    """Per source with a position: where it reads, its lag, and its kind's table."""
    lines = []
    for part in s.get("positions", []):
        lines.append(f"  {part['kind']} {part['source']:<9} {part['where']}, {part['said']}")
        table = part.get("table") or {"columns": [], "rows": []}
        for first, *rest in table["rows"]:
            named = zip(table["columns"][1:], rest, strict=True)
            lines.append("    " + "  ".join([str(first), *(f"{c} {v}" for c, v in named)]))
    return lines


def format_status(status: dict[str, Any]) -> str:
    """The readable form `stateops status` prints."""
    s = status
    h = s["health"]
    lines = [f"{s['query']}: {h['verdict']}  {s['inputs']}"]
    lines += [f"  {h['verdict']:<15} {reason}" for reason in h["reasons"]]
    lines.append(f"  checkpoint      {s['checkpoint']}")
    if s.get("holder"):
        lines.append(f"  held by         {describe_holder(s['holder'])}")
    last = s["last_committed_batch"]
    committed = "none yet" if last is None else f"batch {last} at {s['committed_at']}"
    lines.append(f"  last committed  {committed}")
    ready = s["readiness"]
    if ready and ready["state"] == "watching":
        lines.append(
            f"  readiness       {ready['operation']} of run {ready['run_id']}: its runs watched "
            f"until {ready['until']} (a failure switches it back)"
        )
    lines += _position_lines(s)
    for op in s["operators"]:
        rows = (
            f"{op['state_rows']} rows (batch {op['rows_as_of_batch']})"
            if op["state_rows"] is not None
            else "rows unknown"
        )
        groups = ", ".join(
            f"{g['group_id']}: {format_bytes(g['bytes'])}" for g in op["snapshot_groups"]
        )
        size = format_bytes(op["bytes"])
        lines.append(
            f"  operator {op['operator_id']}      {op['operator_name']}, "
            f"{op['partitions']} partitions, {size}, {rows}"
        )
        lines.append(f"    snapshot groups {groups or 'none'}")
    lines.append(f"  last cleanup    {describe_cleanup(s['last_cleanup'])}")
    unlisted = any(e.startswith("backups: ") for e in s["errors"])
    lines.append(
        "  backups         unknown (the error below)"
        if unlisted
        else "  backups         not listed (--no-backups)"
        if not s["backups_listed"]
        else f"  backups         {len(s['backups'])}"
        + "".join(
            f"\n    {b['backup_id']}  batch {b['batch_id']}  {format_bytes(b['bytes'])}  "
            + describe_drill(b["drill"])
            for b in s["backups"]
        )
    )
    v = s["last_validation"]
    lines.append(
        "  last validation "
        + (
            f"batch {v['batch_id']}: {'passed' if v['ok'] else 'FAILED'} "
            + ", ".join(f"{k} {x['rows']} rows" for k, x in v["variables"].items())
            + (f"; Data Docs {v['data_docs']}" if v["data_docs"] else "")
            if v
            else "none"
        )
    )
    lines.append("  lineage" + ("         none" if not s["lineage"] else ""))
    lines += [
        f"    {r['time']}  {r['operation']:<10} {r['result']}  ({r['run_id']})"
        for r in s["lineage"]
    ]
    if s["history"] is not None:
        lines += format_history(s["history"])
    lines += [f"  error: {e}" for e in s["errors"]]
    return "\n".join(lines)
