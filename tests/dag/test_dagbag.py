from __future__ import annotations

import itertools
from datetime import timedelta
from pathlib import Path

import pytest
import yaml

from stateops.spark.jobs import job_path
from tests.conftest import ROOT, write_registry

pytestmark = pytest.mark.dag


@pytest.fixture(scope="module")
def dagbag(tmp_path_factory):
    from airflow.dag_processing.dagbag import DagBag

    registry = write_registry(tmp_path_factory.mktemp("dagbag"))
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("STATEOPS_REGISTRY", str(registry))
        yield DagBag(dag_folder=str(ROOT / "dags"))


def test_every_dag_imports_with_tags_and_retries(dagbag):
    assert dagbag.import_errors == {}
    assert dagbag.dags, "no DAG found"
    for dag_id, dag in dagbag.dags.items():
        assert dag.tags, f"{dag_id} has no tags"
        assert dag.doc_md, f"{dag_id} has no documentation"
        rolls_back = "roll_back" in dag.task_dict
        for t in dag.tasks:
            # A DAG that rolls back on failure does so at once: the operator triggers again.
            # The health checks' retry is their next scheduled run, minutes away.
            if rolls_back or dag_id == "stream_health":
                assert t.retries == 0, f"{dag_id}.{t.task_id} retries"
            else:
                assert t.retries >= 1, f"{dag_id}.{t.task_id} has no retries"


# The registry's queries: two processors, two transforms (built-in operators' state).
QUERIES = {"user_sessions", "page_visits", "page_counts", "idle_sessions"}
MANUAL = [
    "stream_bootstrap",
    "stream_restore",
    "stream_backfill",
    "stream_source_migration",
    "stream_repartition",
    "stream_code_upgrade",
]


def test_every_manual_form_has_titles_defaults_and_a_dry_run_and_takes_empty_optional_fields(
    dagbag,
):
    """The trigger form (Airflow's UI) renders each Param; a field left empty is sent as null,
    so an optional field must admit null, and a required one must refuse it."""
    from airflow.sdk.definitions.param import ParamValidationError

    assert sorted(d for d, dag in dagbag.dags.items() if dag.schedule is None) == sorted(MANUAL)
    for dag_id in MANUAL:
        params = dagbag.dags[dag_id].params
        assert params["dry_run"] is True, f"{dag_id}: a dry run must be the default"
        for name in params:
            param = params.get_param(name)
            assert param.schema.get("title") and param.description, f"{dag_id}.{name}"
            if param.value == "":  # a field to fill in: the form refuses it empty
                assert param.schema.get("minLength") == 1, (
                    f"{dag_id}.{name}: an optional text field must default to null, not ''"
                )
                for empty in ("", None):
                    with pytest.raises(ParamValidationError):
                        param.resolve(empty)
                continue
            param.resolve(param.value)  # the default passes its own checks
            if isinstance(param.value, str):
                with pytest.raises(ParamValidationError):
                    param.resolve(None)


def test_stream_start_runs_each_registered_query_then_records_it(dagbag):
    dag = dagbag.dags["stream_start"]
    assert dag.max_active_runs == 1
    assert {t.task_id for t in dag.tasks} == {
        f"{s}_{q}" for q in QUERIES for s in ("run", "record")
    }
    for name in QUERIES:
        submit = dag.get_task(f"run_{name}")
        assert submit.downstream_task_ids == {f"record_{name}"}
        assert Path(submit.application) == job_path("run_query.py")
        assert submit._conn_id == "spark_default"
        args = submit.application_args
        assert args[args.index("--query") + 1] == name
        assert args[args.index("--mode") + 1] == "available-now"
        assert args[args.index("--run-id") + 1] == "{{ run_id }}"
        assert Path(args[args.index("--registry") + 1]).name == "registry.yaml"


def test_stream_start_runs_on_the_registry_schedule(dagbag, tmp_path, monkeypatch):
    """Every 30 minutes after the last run by default (the first at once when unpaused), or
    the registry's ``start.schedule``: a duration, or a cron expression for Airflow."""
    from airflow.dag_processing.dagbag import DagBag

    assert dagbag.dags["stream_start"].schedule == timedelta(minutes=30)
    for schedule, expected in (("2 hours", timedelta(hours=2)), ("*/5 * * * *", "*/5 * * * *")):
        registry = write_registry(tmp_path / schedule.replace(" ", "_").replace("*/", ""))
        raw = yaml.safe_load(registry.read_text())
        registry.write_text(yaml.safe_dump({**raw, "start": {"schedule": schedule}}))
        monkeypatch.setenv("STATEOPS_REGISTRY", str(registry))
        bag = DagBag(dag_folder=str(ROOT / "dags" / "stream_start.py"))
        assert bag.import_errors == {} and bag.dags["stream_start"].schedule == expected


def test_stream_bootstrap_form_and_order(dagbag):
    dag = dagbag.dags["stream_bootstrap"]
    assert dag.schedule is None, "triggered by hand (its form), never on a schedule"
    params = dag.params
    assert params["dry_run"] is True, "dry run must be the default"
    query = params.get_param("query")
    assert query.schema["enum"] == [
        "idle_sessions",
        "page_counts",
        "page_visits",
        "user_sessions",
    ], "the processors with an initial_state, and the transforms (from a checkpoint)"
    assert query.schema["title"] and query.description
    formats = ["auto", "export", "checkpoint", "parquet", "json", "csv"]
    assert params.get_param("format").schema["enum"] == formats
    assert params.get_param("initial_state").schema["minLength"] == 1
    assert params["carry_over"] == "auto"
    args = dag.get_task("bootstrap").application_args
    assert args[args.index("--carry-over") + 1] == "{{ params.carry_over }}"
    assert params["accept_differences"] is False, "a carry-over that changes results is refused"
    assert "--accept-differences={{ 'yes' if params.accept_differences else 'no' }}" in args
    order = ["plan", "not_a_dry_run", "bootstrap", "record", "verify_state", "validate_state"]
    for upstream, downstream in zip(order, order[1:], strict=False):
        assert dag.get_task(upstream).downstream_task_ids == {downstream}


def test_stream_checkpoint_backup_backs_up_each_query_on_the_registry_schedule(dagbag):
    dag = dagbag.dags["stream_checkpoint_backup"]
    assert {t.task_id for t in dag.tasks} == {f"backup_{q}" for q in QUERIES} | {"outcome"}
    outcome = dag.get_task("outcome")  # after every query's task, skipped ones included
    assert outcome.upstream_task_ids == {f"backup_{q}" for q in QUERIES}
    assert outcome.trigger_rule == "none_failed"
    assert dag.max_active_runs == 1 and not dag.catchup
    assert dag.schedule == "@daily"  # from the registry


def test_stream_snapshot_cleanup_cleans_each_query_on_the_registry_schedule(dagbag):
    dag = dagbag.dags["stream_snapshot_cleanup"]
    assert {t.task_id for t in dag.tasks} == {f"cleanup_{q}" for q in QUERIES} | {"outcome"}
    outcome = dag.get_task("outcome")
    assert outcome.upstream_task_ids == {f"cleanup_{q}" for q in QUERIES}
    assert outcome.trigger_rule == "none_failed"
    assert dag.max_active_runs == 1 and not dag.catchup
    assert dag.schedule == "@daily"  # from the registry


def test_stream_health_checks_each_query_on_the_registry_schedule_and_alerts_its_changes(
    dagbag, tmp_path, monkeypatch
):
    """A task per query, its callbacks (success and failure) the alerts; every 5 minutes by
    default, or the registry's alerts.schedule. A notifier that cannot be built is the DAG's
    import error, naming alerts.notifier."""
    from airflow.dag_processing.dagbag import DagBag

    from stateops_airflow.tasks import HealthAlerts

    dag = dagbag.dags["stream_health"]
    assert {t.task_id for t in dag.tasks} == {f"health_{q}" for q in QUERIES}
    assert dag.max_active_runs == 1 and not dag.catchup
    assert dag.schedule == timedelta(minutes=5)
    for t in dag.tasks:
        [ok], [failed] = t.on_success_callback, t.on_failure_callback
        assert isinstance(ok, HealthAlerts) and isinstance(failed, HealthAlerts)
    registry = write_registry(tmp_path)
    raw = yaml.safe_load(registry.read_text())
    alerts = {"schedule": "*/2 * * * *", "notifier": "airflow.providers.nope.Notifier"}
    registry.write_text(yaml.safe_dump({**raw, "alerts": alerts}))
    monkeypatch.setenv("STATEOPS_REGISTRY", str(registry))
    bag = DagBag(dag_folder=str(ROOT / "dags" / "stream_health.py"))
    [error] = bag.import_errors.values()
    assert "alerts.notifier: airflow.providers.nope.Notifier cannot be imported" in error
    registry.write_text(yaml.safe_dump({**raw, "alerts": {"schedule": "*/2 * * * *"}}))
    bag = DagBag(dag_folder=str(ROOT / "dags" / "stream_health.py"))
    assert bag.import_errors == {} and bag.dags["stream_health"].schedule == "*/2 * * * *"


def test_stream_restore_drill_restores_reads_and_records_each_query_on_the_registry_schedule(
    dagbag, tmp_path, monkeypatch
):
    """Per query: the restore (library), the Spark read of what it restored (the export job,
    on the checkpoint and into the folder the restore's plan names), and the record, which
    runs whatever the read did (a failed read is a failed drill to record). Weekly by default;
    the registry's backups.drill_schedule, or no schedule when it is null."""
    from airflow.dag_processing.dagbag import DagBag

    dag = dagbag.dags["stream_restore_drill"]
    assert {t.task_id for t in dag.tasks} == {
        f"{step}_{q}" for q in QUERIES for step in ("restore", "read", "record")
    }
    assert dag.max_active_runs == 1 and not dag.catchup and dag.schedule == "@weekly"
    for q in QUERIES:
        read = dag.task_dict[f"read_{q}"]
        assert read.upstream_task_ids == {f"restore_{q}"}
        assert dag.task_dict[f"record_{q}"].upstream_task_ids == {f"read_{q}", f"restore_{q}"}
        assert dag.task_dict[f"record_{q}"].trigger_rule == "all_done"
        assert read.application == str(job_path("export_state.py"))
        plan = "{{ ti.xcom_pull(task_ids='restore_%s')['%s'] }}"
        args = read.application_args
        for option, key in (("--checkpoint", "checkpoint"), ("--out", "state")):
            assert args[args.index(option) + 1] == plan % (q, key), args
        assert args[args.index("--batch") + 1] == plan % (q, "batch_id"), args
    registry = write_registry(tmp_path)
    raw = yaml.safe_load(registry.read_text())
    for schedule in ("@daily", None):
        registry.write_text(yaml.safe_dump({**raw, "backups": {"drill_schedule": schedule}}))
        monkeypatch.setenv("STATEOPS_REGISTRY", str(registry))
        bag = DagBag(dag_folder=str(ROOT / "dags" / "stream_restore_drill.py"))
        assert bag.import_errors == {}
        assert bag.dags["stream_restore_drill"].schedule == schedule


def test_stream_restore_form_and_order(dagbag):
    dag = dagbag.dags["stream_restore"]
    assert dag.schedule is None
    params = dag.params
    assert params["dry_run"] is True and params["backup_id"] == "latest"
    assert params["replace"] is False and params["allow_other_query"] is False
    assert set(params.get_param("query").schema["enum"]) == QUERIES
    order = ["plan", "not_a_dry_run", "approve", "restore", "verify_state"]
    for upstream, downstream in itertools.pairwise(order):
        assert downstream in dag.get_task(upstream).downstream_task_ids
    assert len(dag.tasks) == len(order)
    _asks_approval(dag, "approve", "restore")


def test_stream_backfill_form_and_order(dagbag):
    from airflow.sdk.definitions.param import ParamValidationError

    dag = dagbag.dags["stream_backfill"]
    assert dag.schedule is None
    params = dag.params
    assert params["dry_run"] is True and params["to_batch"] is None
    assert set(params.get_param("query").schema["enum"]) == QUERIES
    order = [
        "plan",
        "not_a_dry_run",
        "approve",
        "rollback",
        "reprocess",
        "record",
        "report",
        "verify_state",
        "validate_state",
    ]
    for upstream, downstream in itertools.pairwise(order):
        assert downstream in dag.get_task(upstream).downstream_task_ids, (upstream, downstream)
    assert len(dag.tasks) == len(order)
    _asks_approval(dag, "approve", "backfill")
    # The form refuses what the plan could not use.
    for name, bad in [
        ("to_batch", -1),
        ("input_before", "yesterday"),
        ("overrides", {"checkpoint": "elsewhere"}),
    ]:
        with pytest.raises(ParamValidationError):
            params.get_param(name).resolve(bad)
    assert params.get_param("input_before").resolve("2026-11-21T03:00:00Z")
    submit = dag.get_task("reprocess")
    args = submit.application_args
    assert args[args.index("--registry") + 1] == "{{ ti.xcom_pull(task_ids='plan')['registry'] }}"


def test_stream_source_migration_form_order_and_roll_back(dagbag):
    from airflow.sdk.definitions.param import ParamValidationError

    dag = dagbag.dags["stream_source_migration"]
    assert dag.schedule is None and dag.max_active_runs == 1
    params = dag.params
    assert params["dry_run"] is True
    # Every query: by transplant, or by initialState where a processor has from_export.
    assert set(params.get_param("query").schema["enum"]) == QUERIES
    assert params.get_param("new_source_format").schema["enum"] == [
        "auto",
        "json",
        "parquet",
        "csv",
        "kafka",
        "delta",
    ]
    assert params["new_source_format"] == "auto"
    assert params.get_param("new_source_start").schema["enum"] == ["cutover", "earliest", "latest"]
    for name, bad in [
        ("new_source_format", "avro"),
        ("new_source_start", "now"),
        ("new_source_options", "maxFilesPerTrigger=1"),
        ("cutover", "yesterday"),
        ("carry_over", "copy"),
    ]:
        with pytest.raises(ParamValidationError):
            params.get_param(name).resolve(bad)
    assert params["cutover"] == "drain" and params["carry_over"] == "auto"
    assert params.get_param("cutover").resolve("2026-11-21T03:00:00Z")
    assert params.get_param("carry_over").schema["enum"] == ["auto", "transplant", "initial_state"]
    start = [
        "preflight",
        "not_a_dry_run",
        "approve_stop",
        "stop_query",
        "drain",
        "backup",
        "carry_over",
    ]
    roads = [["transplant", "first_batch"], ["export", "validate_export", "bootstrap"]]
    end = ["prove", "validate_new_state", "approve_switch", "switch", "migrated"]
    for road in roads:
        for upstream, downstream in itertools.pairwise(start + road + end):
            assert downstream in dag.get_task(upstream).downstream_task_ids, (upstream, downstream)
    assert dag.get_task("prove").trigger_rule == "none_failed_min_one_success"
    roll_back = dag.get_task("roll_back")
    assert roll_back.trigger_rule == "one_failed"
    # Every step after the approval of the stop (its refusal changed nothing: roll_back
    # says so and is skipped), the switch's approval included (its refusal undoes the run).
    steps = set(start[3:] + roads[0] + roads[1] + end[:-1])
    assert roll_back.upstream_task_ids == steps
    _asks_approval(dag, "approve_stop", "migration")
    _asks_approval(dag, "approve_switch", "migration")
    # The run's outcome is its last step's: a failed step leaves `migrated` not run (the run
    # fails) whether roll_back undid something (green) or had nothing to undo (skipped).
    assert {t.task_id for t in dag.tasks if not t.downstream_task_ids} == {"migrated", "roll_back"}
    assert len(dag.tasks) == len(steps) + 5
    args = dag.get_task("drain").application_args
    assert (
        args[args.index("--cutover") + 1] == "{{ ti.xcom_pull(task_ids='preflight')['cutover'] }}"
    )
    assert params["accept_differences"] is False, "a carry-over that changes results is refused"
    args = dag.get_task("bootstrap").application_args
    assert (
        "--accept-differences={{ 'yes' if ti.xcom_pull(task_ids='preflight')['carry_over']"
        "['accepted'] else 'no' }}" in args
    )
    for task in ("bootstrap", "first_batch"):
        args = dag.get_task(task).application_args
        assert args[args.index("--registry") + 1] == (
            "{{ ti.xcom_pull(task_ids='preflight')['new']['registry'] }}"
        )
        assert args[args.index("--run-id") + 1] == "{{ run_id }}"


def test_stream_code_upgrade_form_order_and_roll_back(dagbag):
    dag = dagbag.dags["stream_code_upgrade"]
    assert dag.schedule is None and dag.max_active_runs == 1
    params = dag.params
    assert params["dry_run"] is True and params["new_checkpoint"] is None
    # A rewrite bootstraps a processor: the transforms are not offered.
    assert params.get_param("query").schema["enum"] == ["page_visits", "user_sessions"]
    steps = [
        "stop_query",
        "backup",
        "export",
        "rewrite",
        "prove",
        "validate_new_state",
        "approve_switch",
        "switch",
    ]
    order = ["preflight", "not_a_dry_run", "approve_stop", *steps, "upgraded"]
    for upstream, downstream in itertools.pairwise(order):
        assert downstream in dag.get_task(upstream).downstream_task_ids, (upstream, downstream)
    roll_back = dag.get_task("roll_back")
    assert roll_back.trigger_rule == "one_failed" and roll_back.upstream_task_ids == set(steps)
    assert len(dag.tasks) == len(order) + 1
    _asks_approval(dag, "approve_stop", "upgrade")
    _asks_approval(dag, "approve_switch", "upgrade")
    plan = "ti.xcom_pull(task_ids='preflight')"
    for task in ("rewrite", "validate_new_state"):  # the new code, on the new checkpoint
        args = dag.get_task(task).application_args
        assert args[args.index("--registry") + 1] == "{{ " + plan + "['new']['registry'] }}"
    args = dag.get_task("rewrite").application_args
    assert args[args.index("--initial-state") + 1] == "{{ " + plan + "['export'] }}"
    accept = "{{ 'yes' if " + plan + "['carry_over']['accepted'] else 'no' }}"
    assert f"--accept-differences={accept}" in args


def test_stream_repartition_form_and_order(dagbag):
    from airflow.sdk.definitions.param import ParamValidationError

    dag = dagbag.dags["stream_repartition"]
    params = dag.params
    assert dag.schedule is None and params["dry_run"] is True
    assert set(params.get_param("query").schema["enum"]) == QUERIES
    for bad in (0, -3, 10_001, "eight"):
        with pytest.raises(ParamValidationError):
            params.get_param("partitions").resolve(bad)
    order = ["plan", "not_a_dry_run", "approve", "prepare", "repartition", "finish", "verify_state"]
    for upstream, downstream in itertools.pairwise(order):
        assert downstream in dag.get_task(upstream).downstream_task_ids, (upstream, downstream)
    roll_back = dag.get_task("roll_back")
    assert roll_back.trigger_rule == "one_failed"
    assert roll_back.upstream_task_ids == {"repartition", "finish"}
    _asks_approval(dag, "approve", "repartition")
    assert dag.get_task("repartition").application == str(job_path("repartition_state.py"))


def _asks_approval(dag, task_id: str, operation: str) -> None:
    """``task_id`` is Airflow's approval step (human-in-the-loop) for ``operation``, behind the
    dry-run gate (a dry run asks nothing), waiting no longer than the library's timeout."""
    from airflow.providers.standard.operators.hitl import ApprovalOperator

    from stateops.control.approval import TIMEOUT

    gate = dag.get_task(task_id)
    assert isinstance(gate, ApprovalOperator) and gate.operation == operation
    assert gate.response_timeout == TIMEOUT and gate.on_reject
    assert "not_a_dry_run" in gate.get_flat_relative_ids(upstream=True)
