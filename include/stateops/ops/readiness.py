"""The readiness window after a switch (issue 57, item 5): a code upgrade (or, where the
registry turns it on, a migration) switched a query to a new checkpoint and kept the old one,
retired, for exactly this. For ``health.upgrade_readiness`` (``migration_readiness``) after
the switch, the new query's runs are watched:

- a run on the new checkpoint that fails, ``health.failed_runs`` in a row, within the window;
- or a run started on it within the window that is still running at the window's end and has
  committed no batch of its own (after the batches the switch carried over) although input
  was there to read: stuck. A source that is quiet fails nothing, nor a query nobody ran.

and the switch **failed**: :func:`roll_back_switch` switches the query back to the old
checkpoint as the undo recipe does by hand (the old source and output numbering, the old
checkpoint unretired, the new one kept aside for the post-mortem, its output moved aside:
the old query reads again what the new one read), with the reason in the switch's history
and the old checkpoint's audit. stream_health does it at its next check and alerts; `stateops
status` says where a switch is in its window.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any

from stateops.control.lock import release_hold
from stateops.control.target import query_target
from stateops.core.errors import StateOpsError
from stateops.core.registry import HealthLimits, Query, Registry, load_registry
from stateops.core.storage import location
from stateops.core.times import format_span
from stateops.ops.start import checkpoint_state

__all__ = ["readiness", "roll_back_switch"]


def readiness(
    query: Query,
    limits: HealthLimits,
    switch: dict[str, Any] | None,
    last_run: dict[str, Any] | None,
    committed: int | None,
    running_since: datetime | None,
    unread_before: Callable[[datetime], bool],
    now: datetime,
) -> dict[str, Any] | None:
    """Where ``query``'s last switch (``switch``, the last record of its switch's history:
    :meth:`Registry.switch_history`) is in its readiness window (None: no window applies):
    ``state`` watching, ready or failed (``reason`` says why), the switch's ``operation``,
    ``run_id``, ``time`` and ``until``. ``limits``: the query's health limits; ``last_run``:
    its last run's summary (:func:`stateops.status.query_status`'s ``last_run``);
    ``committed``: its checkpoint's last committed batch; ``running_since``: when the run
    going on now started (None: none); ``unread_before(t)``: whether input it has not read
    was there before ``t``. A switch recorded before the window existed is not watched."""
    window = limits.readiness.get((switch or {}).get("operation", ""))
    if (
        switch is None
        or window is None
        or "sink_batch_offset" not in switch["from"]
        or "last_committed_batch" not in switch["to"]
        or not _same(query.checkpoint, switch["to"]["checkpoint"])
    ):
        return None
    at = datetime.fromisoformat(switch["time"])
    until = at + window
    found = {
        "operation": switch["operation"],
        "run_id": switch["run_id"],
        "time": switch["time"],
        "until": until.isoformat(timespec="seconds"),
        "committed": committed,
    }
    ran = last_run if last_run and _since(last_run, at, query.checkpoint) else None
    if ran and ran["status"] == "failed" and ran["failed_in_a_row"] >= limits.failed_runs:
        if datetime.fromisoformat(ran["started_at"]) < until:
            said = ran.get("error") or "see its log"
            n = ran["failed_in_a_row"]
            runs = "its run" if limits.failed_runs == 1 else f"{n} runs in a row"
            reason = f"{runs} on the new checkpoint failed: {said}"
            return found | {"state": "failed", "reason": reason}
    if now < until:
        return found | {"state": "watching", "reason": None}
    own = committed is not None and committed > switch["to"]["last_committed_batch"]
    if (
        not own
        and running_since is not None
        and at <= running_since < until
        and now < until + window  # judged at the window's end, not days later
        and unread_before(until)
    ):
        reason = (
            f"its run since {running_since.isoformat(timespec='seconds')} committed no batch "
            f"of its own in the {format_span(window)} after the switch, with input to read"
        )
        return found | {"state": "failed", "reason": reason}
    return found | {"state": "ready", "reason": None}


def roll_back_switch(
    registry: Registry,
    name: str,
    switch: dict[str, Any],
    found: dict[str, Any],
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Switch query ``name`` back from its last switch (``switch``), which failed its readiness
    window (``found``, from :func:`readiness`), as the switch's own run would have rolled back
    a failed step: under the switch's hold, once the switch and the new checkpoint's commits
    are seen as the check saw them (else nothing is done: the next check judges again)."""
    from stateops.ops.migration import prepare_migration, roll_back_migration

    old = switch["from"]
    plan = {
        "query": name,
        "run_id": switch["run_id"],
        "operation": switch["operation"],
        "source_name": switch["source_name"],
        "old": {k: old[k] for k in ("checkpoint", "source", "sink_batch_offset")},
        "new": {"checkpoint": switch["to"]["checkpoint"]},
    }
    target = query_target(registry, name)
    prepare_migration(target, plan)  # no other operation from here: then look again
    now = load_registry(registry.path)
    last = now.switch_history(name)[-1:]
    moved = not last or last[0]["run_id"] != switch["run_id"]
    new = switch["to"]["checkpoint"]
    committed = checkpoint_state(new)[0]
    if moved or not _same(now.query(name).checkpoint, new) or committed != found["committed"]:
        release_hold(target.lock_file, switch["run_id"])
        raise StateOpsError(
            f"{name}: its switch or its new checkpoint changed since the check; nothing was "
            "switched back (the next check judges again)"
        )
    reason = f"{found['operation']} switched back after its readiness window: {found['reason']}"
    log(f"{name}: {reason}")
    return roll_back_migration(target, plan, log, reason=reason)


def _same(a: str, b: str) -> bool:
    return str(location(a)) == str(location(b))


def _since(run: dict[str, Any], at: datetime, checkpoint: str) -> bool:
    """The run started on ``checkpoint`` at or after ``at``."""
    started = run.get("started_at")
    return (
        bool(started)
        and datetime.fromisoformat(started) >= at
        and _same(run.get("checkpoint") or "", checkpoint)
    )
