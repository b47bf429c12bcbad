"""`airflow dags test stream_start` end to end: SQLite, local Spark through spark-submit."""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from stateops.checkpoint import load_checkpoint
from stateops.registry import load_registry
from tests.conftest import ROOT, write_registry
from tests.spark.harness import land

pytestmark = pytest.mark.dag


def _airflow(tmp_path, *args: str) -> subprocess.CompletedProcess:
    env = {
        **os.environ,
        "AIRFLOW_HOME": str(tmp_path / "airflow"),
        "STATEOPS_REGISTRY": str(tmp_path / "registry.yaml"),
        "STATEOPS_DATA_DIR": str(tmp_path),
    }
    return subprocess.run(
        ["bash", "-c", 'source scripts/env.sh && exec airflow "$@"', "airflow", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_airflow_dags_test_stream_start_runs_both_queries(tmp_path):
    registry = load_registry(write_registry(tmp_path))
    land(tmp_path / "landing", round_=0, files=2)
    migrate = _airflow(tmp_path, "db", "migrate")
    assert migrate.returncode == 0, migrate.stderr[-3000:]
    run = _airflow(tmp_path, "dags", "test", "stream_start")
    log = run.stdout + run.stderr
    assert run.returncode == 0, log[-5000:]
    for name in ("user_sessions", "page_visits"):
        summary = json.loads(registry.run_summary_path(name).read_text())
        assert summary["status"] == "succeeded"
        assert summary["run_id"].startswith("manual__")
        assert summary["input_rows"] == 80
        assert (
            summary["last_committed_batch"]
            == load_checkpoint(registry.query(name).checkpoint).last_committed_batch
        )
        assert f"{name}: succeeded" in log
