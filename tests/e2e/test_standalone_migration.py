"""stream_source_migration triggered through the REST API v2 of a real ``airflow standalone``
(SQLite, LocalExecutor, simple auth manager) on loopback; the run must reach ``success`` and
the migrated user_sessions (auto: the transplant road) must equal an uninterrupted run. Then
everything is stopped and no process of it may be left."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tests.conftest import ROOT
from tests.dag.test_migration import Migration, _assert_migrated, _uninterrupted
from tests.e2e.test_cluster import _free_port
from tests.spark.harness import read_sink

pytestmark = pytest.mark.e2e

PASSWORD = "stateops-test-admin"


def _request(url: str, method: str = "GET", body: dict | None = None, token: str = "") -> dict:
    request = urllib.request.Request(
        url,
        method=method,
        data=None if body is None else json.dumps(body).encode(),
        headers={"Content-Type": "application/json"}
        | ({"Authorization": f"Bearer {token}"} if token else {}),
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.loads(response.read() or b"{}")


def _alive(session: int) -> list[str]:
    """Processes of the session still alive (zombies waiting for a reaper are not)."""
    out = subprocess.run(["ps", "-o", "pid=,stat=,args=", "-s", str(session)],
                         capture_output=True, text=True).stdout  # fmt: skip
    return [line.strip() for line in out.splitlines() if line.split()[1][0] != "Z"]


def _until(what: str, check, timeout: float, log) -> object:
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            result = check()
            if result:
                return result
        except (OSError, urllib.error.HTTPError, KeyError):
            pass
        time.sleep(2)
    raise AssertionError(f"{what} within {timeout:.0f} s; standalone log:\n{log()[-5000:]}")


def test_migration_triggered_through_the_rest_api_of_airflow_standalone(spark, s3, tmp_path):
    whole = _uninterrupted(tmp_path, "user_sessions")["user_sessions"]
    m = Migration(tmp_path, "user_sessions", s3)
    port = _free_port()
    base = f"http://127.0.0.1:{port}"
    passwords = tmp_path / "passwords.json"
    passwords.write_text(json.dumps({"admin": PASSWORD}))
    env = {
        **os.environ,
        **m.env,
        "AIRFLOW_HOME": str(tmp_path / "airflow"),
        "STATEOPS_REGISTRY": str(m.path),
        "STATEOPS_DATA_DIR": str(tmp_path),
        "AIRFLOW__API__HOST": "127.0.0.1",
        "AIRFLOW__API__PORT": str(port),
        "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"{base}/execution/",
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": "admin:admin",
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(passwords),
        "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
    }
    log_path = tmp_path / "standalone.log"
    with open(log_path, "w") as log_file:
        proc = subprocess.Popen(
            ["bash", "-c", "source scripts/env.sh && exec airflow standalone"],
            cwd=ROOT, env=env, stdout=log_file, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
    log = log_path.read_text
    try:
        token = _until(
            "no token from POST /auth/token",
            lambda: _request(f"{base}/auth/token", "POST",
                             {"username": "admin", "password": PASSWORD})["access_token"],
            180, log,
        )  # fmt: skip
        dag_url = f"{base}/api/v2/dags/stream_source_migration"
        _until("the DAG was not parsed", lambda: _request(dag_url, token=token), 180, log)
        _request(dag_url, "PATCH", {"is_paused": False}, token=token)
        run = _request(f"{dag_url}/dagRuns", "POST",
                       {"logical_date": None, "conf": m.conf()}, token=token)  # fmt: skip
        run_url = f"{dag_url}/dagRuns/{run['dag_run_id']}"
        state = _until(
            "the run did not finish",
            lambda: (s := _request(run_url, token=token)["state"]) in ("success", "failed") and s,
            900, log,
        )  # fmt: skip
        tasks = _request(f"{run_url}/taskInstances", token=token)["task_instances"]
        states = {t["task_id"]: t["state"] for t in tasks}
        assert state == "success", states
        assert states["roll_back"] == "skipped" and states["switch"] == "success", states
        assert states["transplant"] == "success" and states["bootstrap"] == "skipped", states
    finally:
        os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C: standalone stops its components
        try:
            proc.wait(timeout=90)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    deadline = time.time() + 60
    while (left := _alive(proc.pid)) and time.time() < deadline:
        time.sleep(2)
    assert not left, f"processes left after stopping airflow standalone: {left}"

    log_text = "\n".join(
        p.read_text() for p in (tmp_path / "airflow" / "logs").rglob("*.log")
    )  # the task logs: the switch and the proof are logged there
    first_new = _assert_migrated(spark, m, whole, log_text, "transplant")
    sink = read_sink(Path(m.query().sink.path))
    carried = [r for b, rows in sink.items() if b >= first_new for r in rows
               if r[4].startswith("e0-")]  # fmt: skip
    assert carried, (
        "no session open at the cutover (round 0 events: e0-...) closed on the new source"
    )
