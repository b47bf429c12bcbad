"""The manual DAGs' trigger forms, checked where the operator types: an API-server middleware
(registered by the ``stateops_ui`` plugin) runs each DAG's rules that need no Spark on the
``conf`` of ``POST /api/v2/dags/{dag_id}/dagRuns`` (what the UI's trigger form and the REST API
both send) before Airflow creates the run, and answers a refusal with ``400 {"detail": "FIELD:
what is wrong; what to do"}``: the UI's trigger dialog shows that line, the REST caller reads
it. The DAG's first task checks the same rules again (the same library functions), so a run
created some other way is refused the same way, without retries.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
from collections.abc import Callable
from typing import Any

from stateops.core.errors import StateOpsError, domain_errors, one_line
from stateops.core.registry import Registry, load_registry

__all__ = ["FORM_CHECKS", "FormCheck", "form_problem"]

log = logging.getLogger(__name__)


def _backfill(registry: Registry, conf: dict[str, Any]) -> None:
    from stateops.ops.backfill import check_backfill_form

    check_backfill_form(registry, conf)


def _migration(registry: Registry, conf: dict[str, Any]) -> None:
    from stateops.control.target import query_target
    from stateops.ops.migration import check_migration_form

    check_migration_form(query_target(registry, conf["query"]), conf)


FORM_CHECKS: dict[str, Callable[[Registry, dict[str, Any]], None]] = {
    "stream_backfill": _backfill,
    "stream_source_migration": _migration,
}
_TRIGGER = re.compile(r"/api/v2/dags/(?P<dag_id>[^/]+)/dagRuns/?$")


def form_problem(dag_id: str, body: bytes) -> str | None:
    """The one line that refuses a trigger of ``dag_id`` with this request body, or None to let
    it through (Airflow's own checks of the params' schemas follow)."""
    try:
        conf = json.loads(body or b"{}").get("conf") or {}
    except (ValueError, AttributeError):
        return None  # not ours to say: Airflow answers a malformed request
    if not isinstance(conf, dict) or not isinstance(conf.get("query"), str):
        return None  # the form's schema names a missing or unknown query
    try:
        with domain_errors():
            FORM_CHECKS[dag_id](load_registry(), conf)
    except StateOpsError as err:
        return one_line(err)
    except (TypeError, ValueError):
        return None  # a value of the wrong type: the params' schemas name it
    return None


class FormCheck:
    """ASGI middleware: refuses a trigger whose form breaks its DAG's rules (see the module)."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        path = scope.get("path", "").removeprefix(scope.get("root_path", ""))
        found = _TRIGGER.search(path) if scope["type"] == "http" else None
        if not found or scope["method"] != "POST" or found["dag_id"] not in FORM_CHECKS:
            await self.app(scope, receive, send)
            return
        body, more = b"", True
        while more:
            message = await receive()
            body += message.get("body", b"")
            more = message.get("more_body", False)
        # The registry and the checkpoint are read from disk: off the event loop.
        problem = await asyncio.to_thread(form_problem, found["dag_id"], body)
        if problem is not None:
            log.info("trigger of %s refused: %s", found["dag_id"], problem)
            payload = json.dumps({"detail": problem}).encode()
            await send(
                {
                    "type": "http.response.start",
                    "status": 400,
                    "headers": [
                        (b"content-type", b"application/json"),
                        (b"content-length", str(len(payload)).encode()),
                    ],
                }
            )
            await send({"type": "http.response.body", "body": payload})
            return
        replayed = False

        async def replay() -> dict:
            nonlocal replayed
            if replayed:
                return await receive()
            replayed = True
            return {"type": "http.request", "body": body, "more_body": False}

        await self.app(scope, replay, send)
