"""The readiness window after a switch (issue 57, item 5): a code upgrade (or, where the
registry turns it on, a migration) switched a query to a new checkpoint and kept the old one,
retired, for exactly this. For ``health.upgrade_readiness`` (``migration_readiness``) after
the switch, the new query's runs are watched:

- a run on the new checkpoint that fails, ``health.failed_runs`` in a row, within the window;
- or, by the window's end, no batch of its own committed (after the batches the switch
  carried over) although input was there to read (a source that is quiet fails nothing)

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

from stateops.control.target import query_target
from stateops.core.errors import StateOpsError
from stateops.core.registry import Query, Registry
from stateops.core.storage import location
from stateops.core.times import format_span

__all__ = ["readiness", "roll_back_switch"]


def readiness(
    registry: Registry,
    query: Query,
    last_run: dict[str, Any] | None,
    committed: int | None,
    unread_before: Callable[[datetime], bool],
    now: datetime,
) -> dict[str, Any] | None:
    """Where ``query``'s last switch is in its readiness window (None: no window applies):
    ``state`` watching, ready or failed (``reason`` says why), the switch's ``operation``,
    ``run_id``, ``time`` and ``until``, and what :func:`roll_back_switch` needs. ``last_run``:
    its last run's summary (:func:`stateops.status.query_status`'s ``last_run``);
    ``committed``: its checkpoint's last committed batch; ``unread_before(t)``: whether input
    it has not read was there before ``t``."""
    history = registry.switch_history(query.name)
    switch = history[-1] if history else None
    limits = registry.health_limits(query)
    window = limits.readiness.get((switch or {}).get("operation", ""))
    if switch is None or window is None or not _same(query.checkpoint, switch["to"]["checkpoint"]):
        return None
    at = datetime.fromisoformat(switch["time"])
    found = {
        "operation": switch["operation"],
        "run_id": switch["run_id"],
        "time": switch["time"],
        "until": (at + window).isoformat(timespec="seconds"),
        "switch": switch,
    }
    carried = switch["to"].get("last_committed_batch", 0)
    limit = limits.failed_runs
    ran = last_run if last_run and _since(last_run, at, query.checkpoint) else None
    if ran and ran["status"] == "failed" and ran["failed_in_a_row"] >= limit:
        if datetime.fromisoformat(ran["started_at"]) < at + window:
            said = ran.get("error") or "see its log"
            runs = "its run" if limit == 1 else f"{ran['failed_in_a_row']} runs in a row"
            reason = f"{runs} on the new checkpoint failed: {said}"
            return found | {"state": "failed", "reason": reason}
    if now < at + window:
        return found | {"state": "watching", "reason": None}
    if (committed is None or committed <= carried) and unread_before(at + window):
        reason = (
            f"it committed no batch of its own in the {format_span(window)} after the switch, "
            "with input to read"
        )
        return found | {"state": "failed", "reason": reason}
    return found | {"state": "ready", "reason": None}


def roll_back_switch(
    registry: Registry, name: str, found: dict[str, Any], log: Callable[[str], None] = print
) -> dict[str, Any]:
    """Switch query ``name`` back from the switch that failed its readiness window (``found``,
    from :func:`readiness`), as the switch's own run would have rolled back a failed step."""
    from stateops.ops.migration import roll_back_migration

    switch = found["switch"]
    old = switch["from"]
    if "sink_batch_offset" not in old:
        raise StateOpsError(
            f"{name}: the switch of run {switch['run_id']} does not record the old output's "
            "numbering (switched by an older version): undo it by hand (docs/code-upgrades.md)"
        )
    plan = {
        "query": name,
        "run_id": switch["run_id"],
        "operation": switch["operation"],
        "source_name": switch["source_name"],
        "old": {k: old[k] for k in ("checkpoint", "source", "sink_batch_offset")},
        "new": {"checkpoint": switch["to"]["checkpoint"]},
    }
    reason = f"{found['operation']} switched back after its readiness window: {found['reason']}"
    log(f"{name}: {reason}")
    return roll_back_migration(query_target(registry, name), plan, log, reason=reason)


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
