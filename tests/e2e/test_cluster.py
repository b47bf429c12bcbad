"""run_query.py on a real Spark standalone cluster (master + worker from the pip package)."""

from __future__ import annotations

import json
import os
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

from stateops.core.checkpoint import load_checkpoint
from stateops.core.registry import load_registry
from stateops.dev.s3server import free_port
from tests.conftest import ROOT, VENV_BIN, spark_submit_run_query, write_registry
from tests.spark.harness import land
from tests.spark.test_kafka_queries import kafka_source, visits

pytestmark = [pytest.mark.e2e, pytest.mark.whole]


def _wait_for(url: str, needle: str, timeout: float = 90) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            if needle in urllib.request.urlopen(url, timeout=2).read().decode():
                return
        except OSError:
            pass
        time.sleep(1)
    raise AssertionError(f"{url} never showed {needle!r}")


@pytest.fixture
def cluster(tmp_path):
    port, ui = free_port(), free_port()
    env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1", "SPARK_WORKER_DIR": str(tmp_path / "work")}
    spark_class = str(VENV_BIN / "spark-class")
    logs = [open(tmp_path / "master.log", "w"), open(tmp_path / "worker.log", "w")]
    procs = [
        subprocess.Popen(
            [
                spark_class,
                "org.apache.spark.deploy.master.Master",
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--webui-port",
                str(ui),
            ],
            env=env,
            stdout=logs[0],
            stderr=subprocess.STDOUT,
        )
    ]
    try:
        _wait_for(f"http://127.0.0.1:{ui}/json/", '"status" : "ALIVE"')
        procs.append(
            subprocess.Popen(
                [
                    spark_class,
                    "org.apache.spark.deploy.worker.Worker",
                    f"spark://127.0.0.1:{port}",
                    "--cores",
                    "2",
                    "--memory",
                    "2g",
                    "--webui-port",
                    str(free_port()),
                ],
                env=env,
                stdout=logs[1],
                stderr=subprocess.STDOUT,
            )
        )
        _wait_for(f"http://127.0.0.1:{ui}/json/", '"aliveworkers" : 1')
        yield f"spark://127.0.0.1:{port}"
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
        for f in logs:
            f.close()


def test_run_query_on_a_standalone_cluster_with_the_library_as_py_files(cluster, kafka, tmp_path):
    """A file query, then a Kafka query: the executors get the library (--py-files) and
    Spark's Kafka connector (--jars, from the one spark-submit builder)."""
    py_files = ROOT / "build" / "stateops.zip"
    assert py_files.exists(), "build/stateops.zip is built by `make test`"
    topic = kafka.create_topic("e2e-cluster-visits", partitions=2)
    kafka.produce(topic, visits(30))
    registry = write_registry(tmp_path, page_visits={"source": kafka_source(topic)})
    land(tmp_path / "landing", round_=0, files=2)
    proc = spark_submit_run_query(
        registry,
        "user_sessions",
        "--run-id",
        "cluster-1",
        master=cluster,
        submit=["--py-files", str(py_files)],
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert summary["master"] == cluster
    assert summary["status"] == "succeeded" and summary["input_rows"] == 80
    ckpt = load_registry(registry).query("user_sessions").checkpoint
    assert load_checkpoint(ckpt).last_committed_batch == summary["last_committed_batch"]
    app_dirs = list(Path(tmp_path / "work").glob("app-*"))
    assert app_dirs, "no executor ran on the worker"
    assert any(
        (d / "0" / "stateops.zip").exists() or list(d.rglob("stateops.zip")) for d in app_dirs
    )

    proc = spark_submit_run_query(
        registry, "page_visits", master=cluster, submit=["--py-files", str(py_files)]
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert summary["status"] == "succeeded" and summary["input_rows"] == 30
    assert any(
        list(d.rglob("spark-sql-kafka-0-10_*.jar")) for d in Path(tmp_path / "work").glob("app-*")
    )
