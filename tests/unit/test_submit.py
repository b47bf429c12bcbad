"""Per-query compute (issue 75 item 4): a query's ``submit`` settings (spark-submit's own:
connection, deploy mode, resources, queue, packages, launch-time conf) reach the launch of
each of its Spark jobs, by the CLI and by the Airflow operator alike; a job that names no
query (a checkpoint by its path) launches with the defaults."""

from __future__ import annotations

import pytest

from stateops.core.errors import RegistryError
from stateops.core.registry import load_registry
from stateops.spark.jobs import job_path, job_submit, submit_args
from tests.conftest import write_registry

pytestmark = pytest.mark.unit

BIG = {
    "conn_id": "spark_yarn",
    "deploy_mode": "cluster",
    "driver_memory": "2g",
    "executor_memory": "4g",
    "executor_cores": 2,
    "num_executors": 3,
    "queue": "streaming",
    "packages": ["org.apache.spark:spark-avro_2.13:4.2.0"],
    "conf": {"spark.driver.cores": "2"},
}


@pytest.fixture
def registry(tmp_path):
    return write_registry(tmp_path, page_visits={"submit": BIG})


def test_each_query_s_jobs_launch_with_its_own_settings(registry):
    args = ["--registry", str(registry), "--query", "page_visits", "--mode", "available-now"]
    big = job_submit(job_path("run_query.py"), args)
    assert big.conn_id == "spark_yarn" and big.executor_memory == "4g"
    assert submit_args(big) == [
        *("--deploy-mode", "cluster", "--driver-memory", "2g", "--executor-memory", "4g"),
        *("--executor-cores", "2", "--num-executors", "3", "--queue", "streaming"),
        *("--packages", "org.apache.spark:spark-avro_2.13:4.2.0"),
        *("--conf", "spark.driver.cores=2"),
    ]
    other = ["--registry", str(registry), "--query", "user_sessions", "--mode", "available-now"]
    assert submit_args(job_submit(job_path("run_query.py"), other)) == []
    by_name = ["--registry", str(registry), "--checkpoint", "page_visits", "--out", "/tmp/x"]
    assert job_submit(job_path("export_state.py"), by_name).driver_memory == "2g"
    by_path = ["--registry", str(registry), "--checkpoint", "/some/checkpoint", "--out", "/x"]
    assert job_submit(job_path("export_state.py"), by_path).conn_id == "spark_default"


def test_the_airflow_operator_launches_as_the_query_says(registry, monkeypatch):
    from stateops_airflow.tasks import run_query_operator

    monkeypatch.setenv("STATEOPS_REGISTRY", str(registry))
    task = run_query_operator("page_visits")
    task.application_args = [a.replace("{{ run_id }}", "r-1") for a in task.application_args]
    task._launch_as(job_submit(task.application, task.application_args))
    hook = task._get_hook()
    assert hook._conn_id == "spark_yarn"
    assert (hook._deploy_mode, hook._driver_memory, hook._executor_memory) == (
        "cluster",
        "2g",
        "4g",
    )
    assert (hook._executor_cores, hook._num_executors, hook._yarn_queue) == (2, 3, "streaming")
    assert hook._packages == "org.apache.spark:spark-avro_2.13:4.2.0"
    assert hook._conf["spark.driver.cores"] == "2" and hook._conf["spark.ui.enabled"] == "false"


@pytest.mark.parametrize(
    ("submit", "field"),
    [
        ({"driver_memory": "2 GB"}, "driver_memory"),
        ({"packages": ["spark-avro"]}, "packages"),
        ({"deploy_mode": "remote"}, "deploy_mode"),
        ({"executor_cores": 0}, "executor_cores"),
    ],
)
def test_a_bad_launch_setting_is_refused_naming_its_field(tmp_path, submit, field):
    registry = load_registry(write_registry(tmp_path, page_visits={"submit": submit}))
    with pytest.raises(RegistryError, match=f"submit.{field}"):
        registry.query("page_visits")  # the entry is refused; the others run
