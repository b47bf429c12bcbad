"""Airflow's own connections (issue 75 item 3): a task resolves the registry's connections
through Airflow (here: a secrets backend, the AWS hook) and hands what it resolved to the
library and its Spark jobs in their environment, never printed."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import yaml

from tests.conftest import ROOT, write_registry

pytestmark = pytest.mark.dag

SECRET = "backend-secret-not-for-logs"
KAFKA_SECRET = "kafka-pass-not-for-logs"


PUBLISH = """
import json, os, sys
from stateops.core.registry import load_registry
from stateops.core.s3 import checkpoint_settings
from stateops.core.kafka import kafka_settings
from stateops_airflow.connections import publish
publish(load_registry(sys.argv[1]))
s = checkpoint_settings()
k = kafka_settings(None, "kafka_eu")
print(json.dumps({
    "conn_id": os.environ["STATEOPS_CHECKPOINT_CONN_ID"],
    "s3": [s.endpoint_url, s.region, s.access_key, s.secret_key == %r],
    "kafka": [k.bootstrap_servers, k.security.get("sasl.password") == %r],
}))
"""


def _publish(tmp_path, registry, connections):
    backend = tmp_path / "connections.json"
    backend.write_text(json.dumps(connections))
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("AIRFLOW_CONN_", "STATEOPS_CHECKPOINT", "AWS_", "STATEOPS_KAFKA"))
    }
    env |= {
        "PYTHONPATH": os.pathsep.join([str(ROOT / "include"), str(ROOT)]),
        "AIRFLOW__SECRETS__BACKEND": "airflow.secrets.local_filesystem.LocalFilesystemBackend",
        "AIRFLOW__SECRETS__BACKEND_KWARGS": json.dumps({"connections_file_path": str(backend)}),
    }
    script = PUBLISH % (SECRET, KAFKA_SECRET)
    return subprocess.run(
        [sys.executable, "-c", script, str(registry)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_a_task_hands_the_connections_of_a_secrets_backend_to_the_library_unprinted(tmp_path):
    raw_source = yaml.safe_load((ROOT / "registry.yaml").read_text())["queries"]
    name = next(n for n, q in raw_source.items() if q.get("source", {}).get("format") == "kafka")
    own = {name: {"source": {**raw_source[name]["source"], "connection": "kafka_eu"}}}
    registry = write_registry(tmp_path, True, **own)
    raw = yaml.safe_load(registry.read_text())
    registry.write_text(yaml.safe_dump(raw | {"connections": {"checkpoint": "ckpt_store"}}))
    connections = {
        "ckpt_store": {
            "conn_type": "aws",
            "login": "AKFROMBACKEND",
            "password": SECRET,
            "extra": {"endpoint_url": "http://127.0.0.1:9999", "region_name": "eu-west-3"},
        },
        "kafka_eu": {
            "conn_type": "kafka",
            "extra": {
                "bootstrap.servers": "eu:9093",
                "security.protocol": "SASL_SSL",
                "sasl.mechanism": "SCRAM-SHA-256",
                "sasl.username": "svc",
                "sasl.password": KAFKA_SECRET,
            },
        },
    }
    done = _publish(tmp_path, registry, connections)
    assert done.returncode == 0, done.stderr[-3000:]
    said = json.loads(done.stdout.strip().splitlines()[-1])
    assert said == {
        "conn_id": "ckpt_store",
        "s3": ["http://127.0.0.1:9999", "eu-west-3", "AKFROMBACKEND", True],
        "kafka": ["eu:9093", True],
    }
    assert SECRET not in done.stdout + done.stderr
    assert KAFKA_SECRET not in done.stdout + done.stderr

    del connections["ckpt_store"]
    refused = _publish(tmp_path, registry, connections)
    assert refused.returncode != 0
    assert (
        "connection 'ckpt_store' (the registry's connections.checkpoint) is not defined in "
        "Airflow: add it (type aws)" in refused.stderr
    )


@pytest.mark.whole
def test_a_dag_run_takes_its_s3_from_a_secrets_backend_and_each_query_its_own_compute(
    s3a, tmp_path, monkeypatch
):
    """``airflow dags test stream_start`` of two queries. One's checkpoint is in S3, and the
    registry names the checkpoint store's connection, which only a local-filesystem secrets
    backend holds (the environment's keys and endpoint are the demo's, wrong for this server):
    Spark writes the checkpoint there, and the secret is in no task log line and on no
    spark-submit command line (the hook logs the command it runs). Each query has its own
    submit settings, and Spark's own configuration of each run says it ran with them."""
    from stateops.core.checkpoint import load_checkpoint
    from stateops.core.registry import load_registry
    from tests.conftest import S3_KEY, S3_SECRET
    from tests.dag.test_stream_start_run import _airflow
    from tests.spark.harness import land

    url = s3a.url(f"{tmp_path.name}/page_visits")
    small = {"driver_memory": "600m", "conf": {"spark.driver.maxResultSize": "100m"}}
    large = {"driver_memory": "700m", "conf": {"spark.driver.maxResultSize": "200m"}}
    registry = write_registry(
        tmp_path,
        page_visits={"checkpoint": url, "submit": small},
        user_sessions={"submit": large},
    )
    raw = yaml.safe_load(registry.read_text())
    raw["queries"] = {n: raw["queries"][n] for n in ("page_visits", "user_sessions")}
    raw["connections"] = {"checkpoint": "team_s3"}
    registry.write_text(yaml.safe_dump(raw, sort_keys=False))
    backend = tmp_path / "connections.json"
    team_s3 = {"login": S3_KEY, "password": S3_SECRET, "extra": {"endpoint_url": s3a.endpoint}}
    backend.write_text(json.dumps({"team_s3": {"conn_type": "aws", **team_s3}}))
    land(tmp_path / "landing", round_=0, files=2)
    env = {
        "AIRFLOW__SECRETS__BACKEND": "airflow.secrets.local_filesystem.LocalFilesystemBackend",
        "AIRFLOW__SECRETS__BACKEND_KWARGS": json.dumps({"connections_file_path": str(backend)}),
        "STATEOPS_CHECKPOINT_CONN_ID": "",
    }
    assert not any(S3_SECRET in v for k, v in os.environ.items() if k != "PYTEST_CURRENT_TEST")
    run = _airflow(tmp_path, "dags", "test", "stream_start", env=env)
    log = run.stdout + run.stderr
    assert run.returncode == 0, log[-5000:]
    s3a.set_env(monkeypatch)  # this process reads what Spark wrote, now the run is over
    assert load_checkpoint(url).last_committed_batch == 1  # Spark wrote S3 with those keys
    assert [line for line in log.splitlines() if "spark-submit" in line], "the hook logs it"
    assert S3_SECRET not in log, "a secret in the task log or a spark-submit command line"
    logs = tmp_path / "airflow" / "logs"
    assert not [p for p in logs.rglob("*") if p.is_file() and S3_SECRET in p.read_text()]

    loaded = load_registry(registry)
    for name, submit in [("page_visits", small), ("user_sessions", large)]:
        summary = json.loads(loaded.run_summary_path(name).read_text())
        launched = summary["launched_with"]
        assert launched["spark.driver.memory"] == submit["driver_memory"], (name, launched)
        assert (
            launched["spark.driver.maxResultSize"] == submit["conf"]["spark.driver.maxResultSize"]
        )
