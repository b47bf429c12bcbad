"""The trigger forms' checks before a run is created (issue 20, item 1): the middleware's
logic on a real registry, with a stand-in for the Airflow app behind it. The real API
server, its trigger dialog and REST: tests/e2e/test_airflow.py."""

from __future__ import annotations

import asyncio
import json

import pytest

from stateops_airflow.forms import FormCheck, form_problem
from tests.conftest import write_registry

pytestmark = pytest.mark.unit


@pytest.fixture
def registry(tmp_path, monkeypatch):
    path = write_registry(tmp_path)
    monkeypatch.setenv("STATEOPS_REGISTRY", str(path))
    return path


def _body(**conf) -> bytes:
    return json.dumps({"logical_date": None, "conf": conf}).encode()


BAD = [
    (
        "stream_backfill",
        {"query": "page_visits"},
        "to_batch, input_before: give one of them, the last batch to keep or a time (the last "
        "batch whose input is older), not neither",
    ),
    (
        "stream_backfill",
        {"query": "page_visits", "to_batch": 3, "input_before": "2026-01-01"},
        "to_batch, input_before: give one of them",
    ),
    (
        "stream_backfill",
        {"query": "page_visits", "input_before": "yesterday 3am"},
        "input_before 'yesterday 3am' is not a time; write it like",
    ),
    (
        "stream_backfill",
        {"query": "page_visits", "to_batch": 3, "overrides": {"sink": {}}},
        "overrides: sink cannot be changed by a backfill (only processor, ",
    ),
    (
        "stream_source_migration",
        {"query": "page_visits", "new_source_path": "nowhere"},
        "new_source_path: new source path ",
    ),
    *[  # found by a bad-input trial: an empty folder for a file source
        (
            "stream_source_migration",
            {"query": "page_visits", "new_source_format": fmt, "new_source_path": path},
            f"new_source_path: empty: a {shown} source reads a folder: give the new source's "
            "folder (--new-source-path)",
        )
        for fmt, shown in [("json", "json"), ("auto", "parquet")]
        for path in ("", None, "  ")
    ],
    (
        "stream_source_migration",
        {"query": "page_visits", "new_source_path": "nowhere", "cutover": "yesterday 3am"},
        "cutover 'yesterday 3am' is not a time; write it like",
    ),
]


@pytest.mark.parametrize(("dag_id", "conf", "start"), BAD)
def test_a_bad_form_is_refused_in_one_line_that_names_the_field(registry, dag_id, conf, start):
    problem = form_problem(dag_id, _body(**conf))
    assert problem is not None and problem.startswith(start), problem
    assert "\n" not in problem


def test_what_the_params_schemas_name_is_left_to_them(registry):
    assert form_problem("stream_backfill", _body(query="nope", to_batch=1)) is not None
    assert form_problem("stream_backfill", _body()) is None  # no query: the schema says so
    assert form_problem("stream_backfill", b"not json") is None


class _App:
    """Stands in for Airflow's app: records the request it got."""

    def __init__(self) -> None:
        self.body: bytes | None = None

    async def __call__(self, scope, receive, send) -> None:
        self.body, more = b"", True
        while more:
            message = await receive()
            self.body, more = self.body + message["body"], message["more_body"]
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"{}"})


def _post(path: str, body: bytes) -> tuple[_App, list[dict]]:
    app, sent = _App(), []
    chunks = [body[:5], body[5:]]  # a body in two parts, as a client may send it

    async def receive() -> dict:
        return {"type": "http.request", "body": chunks.pop(0), "more_body": bool(chunks)}

    async def send(message: dict) -> None:
        sent.append(message)

    scope = {"type": "http", "method": "POST", "path": path, "root_path": ""}
    asyncio.run(FormCheck(app)(scope, receive, send))
    return app, sent


def test_the_middleware_answers_400_before_airflow_sees_a_bad_trigger(registry):
    app, sent = _post("/api/v2/dags/stream_backfill/dagRuns", _body(query="page_visits"))
    assert app.body is None, "Airflow never got it: no run was created"
    assert sent[0]["status"] == 400
    assert json.loads(sent[1]["body"])["detail"].startswith("to_batch, input_before: ")


def test_the_middleware_passes_a_good_trigger_on_with_its_whole_body(registry, tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    landed = tmp_path / "landing_v2"
    landed.mkdir()
    event = {"user_id": ["u1"], "page": ["/"], "event_time": pa.array([0], pa.timestamp("us"))}
    pq.write_table(pa.table(event), landed / "part-0.parquet")
    good = _body(query="page_visits", new_source_path="landing_v2", dry_run=True)
    app, sent = _post("/api/v2/dags/stream_source_migration/dagRuns", good)
    assert app.body == good and sent[0]["status"] == 200
    other = _body(query="page_visits", dry_run=True)
    app, sent = _post("/api/v2/dags/stream_restore/dagRuns", other)  # a DAG it does not check
    assert app.body == other and sent[0]["status"] == 200
