"""`airflow dags test stream_health` (issue 57, items 1-2): the health rules of a query Spark
ran, fired and recovered on real state, each change delivered once through Airflow's
HttpNotifier to a webhook on loopback (a real HTTP receiver)."""

from __future__ import annotations

import json
import socket
import threading
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import yaml
from airflow.sdk.observability import stats
from airflow.sdk.observability.metrics.stats_utils import get_stats_factory

from stateops.control.history import read_history
from stateops.core.registry import load_registry
from stateops.status import query_status
from stateops_airflow.tasks import _record_check, backup_lister
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


class StatsD:
    """A StatsD receiver on loopback (UDP): the gauges Airflow's metrics send, by name."""

    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.settimeout(0.2)
        self.port = self.sock.getsockname()[1]

    def gauges(self) -> dict[str, float]:
        """The gauges that arrived since the last call (the last value of each)."""
        got = {}
        while True:
            try:
                packet = self.sock.recv(65536).decode()
            except TimeoutError:
                return got
            for line in packet.splitlines():
                name, _, rest = line.partition(":")
                value, _, kind = rest.partition("|")
                if kind.startswith("g"):
                    got[name] = float(value)


@pytest.fixture
def statsd():
    receiver = StatsD()
    yield receiver
    receiver.sock.close()


def test_health_rules_fire_once_and_recover_once_through_the_notifier(
    spark, tmp_path, s3, webhook, statsd, no_jvm, monkeypatch
):
    """page_visits, run once, then input landed and not read (long ago: land's mtimes), and
    no backup: two WARN rules fire (input_waiting, backup_age), one message each, and the task
    names both in its log and stays green (a WARN notifies, only a FAIL rule fails the task).
    Once the query read its input, the next check sends one message, that input_waiting
    recovered, and none for backup_age, which goes on firing. user_sessions never ran: work
    in progress, no rule, its task green. Each check records its figures in the query's
    history, beside its runs', and sends them, with the last run's, as StatsD gauges. No
    check starts a JVM."""
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
    since = datetime.now(UTC) - timedelta(minutes=1)

    def figures(batch: int, sources: list[str]) -> None:
        """The history's points so far, each check's batch ``batch``."""
        points = read_history(registry, "page_visits", since)
        assert [p["source"] for p in points] == sources, points
        run, check = points[-2:]
        assert check["batch"] == run["batch"] == batch and check["verdict"] == "WARN", check
        assert check["lag_records"] is None and check["checkpoint_bytes"] > 0, check

    def check() -> tuple[set[str], list[dict], str]:
        run = _airflow(tmp_path, "dags", "test", "stream_health", env=env)
        log = run.stdout + run.stderr
        return _failed_tasks(log), sorted(webhook.taken(), key=lambda m: m["rule"]), log

    failed, sent, log = check()
    assert failed == set(), log[-5000:]
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
    # the task's log names each rule with its level
    assert "page_visits: [WARN] input_waiting: 1 input file" in log
    assert "page_visits: [WARN] backup_age: no backup" in log
    alerted = json.loads(registry.alerts_path("page_visits").read_text())["firing"]
    assert set(alerted) == {"backup_age", "input_waiting"}
    figures(0, ["run", "check"])

    run_in_session(spark, path, "page_visits")
    failed, sent, log = check()
    assert failed == set(), log[-5000:]
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
    figures(1, ["run", "check", "run", "check"])

    # The check's figures, with its last run's, as StatsD gauges where [metrics] turns them
    # on. Airflow's task runner sets its metrics up from that section before each task;
    # ``dags test`` runs tasks in-process without it, so here it is done as the runner does.
    for name, value in {**env, "AIRFLOW__METRICS__STATSD_ON": "True",
                        "AIRFLOW__METRICS__STATSD_HOST": "127.0.0.1",
                        "AIRFLOW__METRICS__STATSD_PORT": str(statsd.port)}.items():  # fmt: skip
        monkeypatch.setenv(name, value)
    stats.initialize(factory=get_stats_factory(), export_legacy_names=False)
    try:
        for query in ("page_visits", "user_sessions"):
            _record_check(registry, query, query_status(registry, query, *backup_lister(registry)))
    finally:
        monkeypatch.undo()
        stats.initialize(factory=get_stats_factory(), export_legacy_names=False)
    gauges = statsd.gauges()
    *_, run, _, check = read_history(registry, "page_visits", since)
    ours = {k.removeprefix("airflow.stateops.page_visits."): v for k, v in gauges.items()
            if k.startswith("airflow.stateops.page_visits.")}  # fmt: skip
    assert ours == {
        "batch": 1,
        "checkpoint_bytes": check["checkpoint_bytes"],
        "state_rows": run["state_rows"],
        "state_bytes": run["state_bytes"],
        "input_rows": run["input_rows"],
        "batch_seconds": run["batch_seconds"],
        "health": 1,
    }, gauges
    assert gauges["airflow.stateops.user_sessions.health"] == 1, gauges  # never run: WARN
    assert no_jvm() == [], "a health check started a JVM"
