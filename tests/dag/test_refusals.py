"""The Airflow side of one-line refusals: the trigger forms refuse impossible times, the Spark
operator runs the job's preflight before spark-submit, and task helpers fail in one line
(without retries) through the library's error boundary. No JVM starts in this file."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import ROOT, write_registry

pytestmark = pytest.mark.dag

IMPOSSIBLE = [
    "2026-13-01T03:00:00Z",  # month 13
    "2026-02-30T03:00:00Z",  # February 30
    "2027-02-29T03:00",  # not a leap year
    "2026-11-21T25:00:00Z",  # hour 25
    "2026-11-21T03:60",
    "2026-04-31 03:00",
]
REAL = ["2026-11-21T03:00:00Z", "2028-02-29 03:00", "2026-11-21T04:00:00+01:00"]
FORM_TIMES = [("stream_backfill", "input_before"), ("stream_source_migration", "cutover")]


@pytest.fixture(scope="module")
def dagbag(tmp_path_factory):
    from airflow.dag_processing.dagbag import DagBag

    registry = write_registry(tmp_path_factory.mktemp("dagbag"))
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("STATEOPS_REGISTRY", str(registry))
        yield DagBag(dag_folder=str(ROOT / "dags"))


@pytest.mark.parametrize(("dag_id", "field"), FORM_TIMES)
@pytest.mark.parametrize("value", IMPOSSIBLE)
def test_the_form_refuses_an_impossible_time(dagbag, dag_id, field, value):
    from airflow.sdk.definitions.param import ParamValidationError

    with pytest.raises(ParamValidationError):
        dagbag.dags[dag_id].params.get_param(field).resolve(value)


@pytest.mark.parametrize(("dag_id", "field"), FORM_TIMES)
@pytest.mark.parametrize("value", REAL)
def test_the_form_takes_a_real_time(dagbag, dag_id, field, value):
    assert dagbag.dags[dag_id].params.get_param(field).resolve(value) == value


@pytest.fixture
def registry(tmp_path, monkeypatch) -> Path:
    path = write_registry(tmp_path / "data")
    monkeypatch.setenv("STATEOPS_REGISTRY", str(path))
    return path


def _one_line(err: BaseException, *needles: str) -> None:
    message = str(err)
    assert "\n" not in message, message
    for needle in needles:
        assert needle in message, message


@pytest.mark.parametrize("value", IMPOSSIBLE[:4])
def test_the_backfill_plan_task_parses_the_time_for_real(registry, value):
    """A run triggered with conf that bypassed the form still stops at its first task."""
    from airflow.sdk.exceptions import AirflowFailException

    from stateops_airflow.tasks import backfill_plan

    params = {"query": "page_visits", "to_batch": None, "input_before": value, "dry_run": True}
    with pytest.raises(AirflowFailException) as failed:
        backfill_plan(params, "manual__1")
    _one_line(failed.value, f"input_before {value!r} is not a real time")


@pytest.mark.parametrize(
    ("checkpoint", "says"),
    [
        ("loop", "symbolic link loop"),
        ("x" * 300, "longer than the file system allows"),
        ("a-file", "a file, not a checkpoint directory"),
        ("a-file/ckpt", "not a folder"),
    ],
)
def test_a_task_helper_fails_in_one_line_through_the_boundary(
    tmp_path, monkeypatch, checkpoint, says
):
    from airflow.sdk.exceptions import AirflowFailException

    from stateops_airflow.tasks import verify_state

    (tmp_path / "loop").symlink_to(tmp_path / "loop")
    (tmp_path / "a-file").write_text("not a checkpoint\n")
    registry = write_registry(
        tmp_path / "data", page_visits={"checkpoint": str(tmp_path / checkpoint)}
    )
    monkeypatch.setenv("STATEOPS_REGISTRY", str(registry))
    with pytest.raises(AirflowFailException) as failed:
        verify_state("page_visits")
    _one_line(failed.value, says)


def test_a_malformed_registry_fails_a_task_in_one_line_with_file_and_line(tmp_path, monkeypatch):
    from airflow.sdk.exceptions import AirflowFailException

    from stateops_airflow.tasks import run_summary

    bad = tmp_path / "registry.yaml"
    bad.write_text("queries:\n  page_visits:\n    source: [json, x\n    sink: y\n")
    monkeypatch.setenv("STATEOPS_REGISTRY", str(bad))
    with pytest.raises(AirflowFailException) as failed:
        run_summary("page_visits", "manual__1")
    _one_line(failed.value, f"{bad}:4:", "not valid YAML", "fix line 4")


@pytest.mark.parametrize(
    ("job", "args", "says"),
    [
        (
            "export_state.py",
            ["--checkpoint", "{tmp}/missing", "--out", "{tmp}/out"],
            "no such directory",
        ),
        (
            "export_state.py",
            ["--checkpoint", "{tmp}/loop", "--out", "{tmp}/out"],
            "symbolic link loop",
        ),
        ("validate_state.py", ["--query", "no_such_query"], "no_such_query"),
        (
            "bootstrap_state.py",
            ["--query", "page_visits", "--initial-state", "{tmp}/missing"],
            "no such initial state",
        ),
        (
            "run_query.py",
            ["--query", "page_visits", "--cutover", "2026-02-30T03:00:00Z"],
            "cutover '2026-02-30T03:00:00Z' is not a real time",
        ),
    ],
)
def test_the_spark_operator_refuses_before_spark_submit(
    tmp_path, registry, job, args, says, no_jvm
):
    from airflow.sdk.exceptions import AirflowFailException

    from stateops_airflow.tasks import spark_job_operator

    (tmp_path / "loop").symlink_to(tmp_path / "loop")
    operator = spark_job_operator(
        "job", job, [a.format(tmp=tmp_path) for a in args], registry=str(registry)
    )
    # Were spark-submit reached, the stand-in java would record it, and the hook raise a plain
    # AirflowException (retried), not this one.
    with pytest.raises(AirflowFailException) as failed:
        try:
            operator.execute({})
        finally:
            assert no_jvm() == [], "the operator ran spark-submit"
    _one_line(failed.value, says)


def test_a_restore_over_a_locked_query_is_retried_and_a_bad_target_fails_for_good(
    tmp_path, registry, monkeypatch
):
    from airflow.sdk.exceptions import AirflowException, AirflowFailException

    from stateops.control.lock import QueryLock
    from stateops.core.registry import load_registry
    from stateops_airflow import tasks

    # Both refusals come before S3 is asked: no connection, no endpoint.
    monkeypatch.setattr(tasks, "_backups_client", lambda registry: None)
    loaded = load_registry(registry)
    plan = {"target": loaded.query("page_visits").checkpoint}
    with QueryLock(loaded.lock_path("page_visits"), "page_visits", "run", run_id="run-1"):
        with pytest.raises(AirflowException) as held:
            tasks.restore_run(plan, "manual__1")
    assert not isinstance(held.value, AirflowFailException), "a held lock is retried"
    _one_line(held.value, "query 'page_visits' is locked by run (run run-1")

    (tmp_path / "link").symlink_to(tmp_path)
    with pytest.raises(AirflowFailException) as failed:
        tasks.restore_plan("page_visits", "latest", str(tmp_path / "link"))
    _one_line(failed.value, "a symbolic link; restore into the folder itself")
