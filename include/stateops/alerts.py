"""Health rules that page (issue 57): what the health DAG (stream_health) sends, and when.

Each run of the DAG checks every registered query (:func:`stateops.status.query_status`, no
Spark) and keeps, per query, the rules that fire (:func:`firing`: every finding but those of
work in progress, :data:`stateops.status.WORK_IN_PROGRESS`). What it sends is the change
against what it alerted last (:func:`changes`): a rule that starts firing, once, and a rule
that recovers, once; a rule that goes on firing says nothing more, however its figures move,
so an on-call engineer gets one message per query and rule until it changes. What was
alerted is kept where the query's lease is (:meth:`Registry.alerts_path`, the control store
on a fleet), written once the alerts went out: a notifier that failed sends them again at
the next check.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from stateops.control.markers import read_record, write_record
from stateops.core.errors import StateOpsError, one_line
from stateops.core.registry import Registry, load_registry

__all__ = [
    "Alert",
    "changes",
    "firing",
    "notifier_for",
    "read_alerted",
    "watch_readiness",
    "write_alerted",
]


@dataclass(frozen=True)
class Alert:
    """One change of one rule of one query, as a notifier's templates see it (``alert``)."""

    query: str
    rule: str
    state: str  # "firing" or "recovered"; "requested" for an approval (rule "approval")
    level: str  # the rule's level while firing (FAIL, WARN); OK once recovered; ASK
    message: str  # what the rule saw (recovered: what it had seen)

    @property
    def text(self) -> str:
        """The one line a person reads."""
        if self.state == "recovered":
            return f"[OK] {self.query}: {self.rule} recovered (it said: {self.message})"
        if self.state == "requested":
            return f"[ASK] {self.query}: {self.message} (Airflow's required actions)"
        return f"[{self.level}] {self.query}: {self.message} (stateops status {self.query})"

    def as_dict(self) -> dict[str, str]:
        return asdict(self) | {"text": self.text}


def firing(health: dict[str, Any]) -> dict[str, dict[str, str]]:
    """The rules a query's ``health`` (:func:`stateops.status.health`) fires, each with its
    level and its reasons in one line (two Kafka sources over their limit: one rule)."""
    from stateops.status import WORK_IN_PROGRESS  # not at import: the DAG file imports this

    rules: dict[str, dict[str, str]] = {}
    for f in health["findings"]:
        if f["rule"] in WORK_IN_PROGRESS:
            continue
        seen = rules.setdefault(f["rule"], {"level": f["level"], "message": ""})
        seen["message"] = "; ".join(filter(None, (seen["message"], f["reason"])))
    return rules


def changes(
    query: str, alerted: dict[str, dict[str, str]], now: dict[str, dict[str, str]]
) -> list[Alert]:
    """What changed from the rules ``alerted`` last to the rules firing ``now``."""
    fired = [
        Alert(query, rule, "firing", seen["level"], seen["message"])
        for rule, seen in now.items()
        if rule not in alerted
    ]
    recovered = [
        Alert(query, rule, "recovered", "OK", seen["message"])
        for rule, seen in alerted.items()
        if rule not in now
    ]
    return fired + recovered


def read_alerted(registry: Registry, query: str) -> dict[str, dict[str, str]]:
    """The rules of ``query`` alerted last (none before its first check)."""
    return (read_record(registry.alerts_path(query)) or {"firing": {}})["firing"]


def write_alerted(registry: Registry, query: str, now: dict[str, dict[str, str]]) -> None:
    write_record(registry.alerts_path(query), {"firing": now})


def notifier_for(registry: Registry) -> Any:
    """A new instance of the registry's notifier (``alerts.notifier``): a notifier renders its
    templated fields in place, so each alert gets its own. None when the registry names
    none."""
    path = registry.alerts.notifier
    if path is None:
        return None
    module, _, name = path.rpartition(".")
    try:
        cls = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as err:
        raise StateOpsError(
            f"alerts.notifier: {path} cannot be imported ({err}); install its provider or "
            "correct the path"
        ) from err
    try:
        return cls(**registry.alerts.notifier_args)
    except TypeError as err:
        raise StateOpsError(f"alerts.notifier_args: {path} refuses them: {err}") from err


def watch_readiness(
    registry: Registry,
    name: str,
    s3_client: Any = None,
    unlisted: str | None = None,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """:func:`stateops.status.query_status`, after switching the query back where its last
    switch failed its readiness window (:mod:`stateops.ops.readiness`): stream_health's check.
    Where switching back fails, it says why and the status goes on saying ``switch_failed``."""
    from stateops.ops.readiness import roll_back_switch
    from stateops.status import query_status

    status = query_status(registry, name, s3_client, unlisted)
    ready = status["readiness"]
    if not ready or ready["state"] != "failed":
        return status
    try:
        roll_back_switch(registry, name, status["last_switch"], ready, log)
    except Exception as err:  # noqa: BLE001 - the check goes on: its rules say what is left
        log(f"{name}: switching back failed: {one_line(err)}")
        return status
    return query_status(load_registry(registry.path), name, s3_client, unlisted)
