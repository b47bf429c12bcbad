"""`airflow dags test stream_health` (issue 57, items 1-2): the health rules of a query Spark
ran, fired and recovered on real state, each change delivered once through Airflow's
HttpNotifier to a webhook on loopback (a real HTTP receiver)."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import yaml

from stateops.core.registry import load_registry
from tests.conftest import S3_KEY, S3_SECRET, write_registry
from tests.dag.test_stream_start_run import _airflow, _failed_tasks
from tests.spark.harness import land, run_in_session

pytestmark = pytest.mark.dag


class Webhook(ThreadingHTTPServer):
    """A receiver on loopback that keeps every JSON body POSTed to it."""

    def __init__(self) -> None:
        self.received: list[dict] = []
        webhook = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                body = self.rfile.read(int(self.headers["Content-Length"]))
                webhook.received.append({"path": self.path, **json.loads(body)})
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args) -> None:
                pass

        super().__init__(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.serve_forever, daemon=True).start()

    def taken(self) -> list[dict]:
        """What arrived since the last call."""
        out, self.received = self.received, []
        return out


@pytest.fixture
def webhook():
    server = Webhook()
    yield server
    server.shutdown()


def test_health_rules_fire_once_and_recover_once_through_the_notifier(
    spark, tmp_path, s3, webhook, no_jvm
):
    """page_visits, run once, then input landed and not read (long ago: land's mtimes), and
    no backup: two rules fire (input_waiting, backup_age), one message each, and the task
    fails naming both. Once the query read its input, the next check sends one message, that
    input_waiting recovered, and none for backup_age, which goes on firing (the task still
    fails). user_sessions never ran: work in progress, no rule, its task green. No check
    starts a JVM."""
    path = write_registry(tmp_path)
    raw = yaml.safe_load(path.read_text())
    raw["backups"] = {"url": "s3://backups/health", "conn_id": "aws_default"}
    raw["health"] = {"input_waiting": "30 minutes"}
    raw["alerts"] = {
        "notifier": "airflow.providers.http.notifications.HttpNotifier",
        "notifier_args": {
            "http_conn_id": "stateops_alerts",
            "endpoint": "alerts",
            "json": {f: f"{{{{ alert.{f} }}}}" for f in ("text", "query", "rule", "state")},
        },
    }
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    registry = load_registry(path)
    landing = tmp_path / "landing"
    land(landing, round_=0, files=1)
    run_in_session(spark, path, "page_visits")
    land(landing, round_=1, files=1)
    port = webhook.server_address[1]
    env = {
        "AIRFLOW_CONN_AWS_DEFAULT": json.dumps({
            "conn_type": "aws", "login": S3_KEY, "password": S3_SECRET,
            "extra": {"endpoint_url": s3.endpoint},
        }),
        "AIRFLOW_CONN_STATEOPS_ALERTS": json.dumps({
            "conn_type": "http", "host": "127.0.0.1", "port": port, "schema": "http",
        }),
    }  # fmt: skip

    def check() -> tuple[set[str], list[dict], str]:
        run = _airflow(tmp_path, "dags", "test", "stream_health", env=env)
        log = run.stdout + run.stderr
        return _failed_tasks(log), sorted(webhook.taken(), key=lambda m: m["rule"]), log

    failed, sent, log = check()
    assert failed == {"health_page_visits"}, log[-5000:]
    assert [(m["path"], m["query"], m["rule"], m["state"]) for m in sent] == [
        ("/alerts", "page_visits", "backup_age", "firing"),
        ("/alerts", "page_visits", "input_waiting", "firing"),
    ], log[-5000:]
    backup, waiting = (m["text"] for m in sent)
    said = waiting.removeprefix("[WARN] page_visits: ").removesuffix(
        " (stateops status page_visits)"
    )
    assert backup == (
        "[WARN] page_visits: no backup yet (stream_checkpoint_backup takes them) "
        "(stateops status page_visits)"
    )
    assert waiting.startswith("[WARN] page_visits: 1 input file of source landed and not read")
    assert "allowed: 30 min, health.input_waiting" in waiting
    assert "stateops run page_visits reads them" in waiting
    # the task fails in one line naming each rule
    assert "page_visits: input_waiting: 1 input file" in log and "backup_age: no backup" in log
    alerted = json.loads(registry.alerts_path("page_visits").read_text())["firing"]
    assert set(alerted) == {"backup_age", "input_waiting"}

    run_in_session(spark, path, "page_visits")
    failed, sent, log = check()
    assert failed == {"health_page_visits"}, log[-5000:]
    assert [(m["rule"], m["state"], m["text"]) for m in sent] == [
        (
            "input_waiting",
            "recovered",
            f"[OK] page_visits: input_waiting recovered (it said: {said})",
        )
    ]
    assert json.loads(registry.alerts_path("page_visits").read_text())["firing"] == {
        "backup_age": {
            "level": "WARN",
            "message": "no backup yet (stream_checkpoint_backup takes them)",
        }
    }
    assert no_jvm() == [], "a health check started a JVM"
