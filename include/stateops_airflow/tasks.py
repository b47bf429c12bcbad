"""Builders the DAG files use: the registered queries and the Spark job that runs one.

Parse-time work is limited to reading the registry file (it names the tasks); no connection,
variable or Spark session is touched until a task runs.
"""

from __future__ import annotations

import functools
import logging
import re
from collections.abc import Callable
from datetime import datetime
from typing import Any, ParamSpec, TypeVar

from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator
from airflow.sdk import BaseNotifier
from airflow.sdk.exceptions import AirflowException, AirflowFailException, AirflowSkipException

from stateops.core.errors import LockHeldError, StateOpsError, domain_errors, one_line
from stateops.core.registry import NAME_PATTERN, Query, Registry, load_registry, registry_path
from stateops.core.times import TIME_PATTERN  # a form's time field: real dates only
from stateops.spark.jobs import (
    job_path,
    job_submit,
    preflight_job,
    py_files,
    spark_classpath_conf,
    spark_jars,
)

__all__ = [
    "backfill_plan",
    "backfill_report",
    "backfill_rollback",
    "backup_lister",
    "backup_query",
    "bootstrap_plan",
    "CARRY_FIELDS",
    "carry_over_param",
    "carry_over_tasks",
    "carry_step_operator",
    "check_health",
    "cleanup_query",
    "committed_checkpoint",
    "drill_read_operator",
    "drill_record",
    "drill_restore",
    "dry_run_param",
    "each_query_then_outcome",
    "HealthAlerts",
    "health_failure",
    "inject_fault",
    "LIFECYCLE_DAG",
    "migration_migrated",
    "migration_plan",
    "migration_roll_back",
    "migration_step",
    "migration_stop",
    "new_checkpoint_param",
    "not_a_dry_run",
    "one_line_errors",
    "query_param",
    "registered_queries",
    "repartition_finish",
    "repartition_plan",
    "repartition_prepare",
    "repartition_undo",
    "restore_plan",
    "restore_run",
    "run_query_operator",
    "run_summary",
    "say",
    "scheduled_outcome",
    "spark_job_operator",
    "StateOpsSparkSubmitOperator",
    "TIME_PATTERN",
    "upgrade_needless",
    "upgrade_plan",
    "verify_state",
]


# What every lifecycle DAG shares: no catch-up, one run at a time (runs of different DAGs on
# the same query are serialised by the query's lock, not by Airflow).
LIFECYCLE_DAG: dict[str, Any] = {
    "start_date": datetime(2026, 1, 1),
    "catchup": False,
    "max_active_runs": 1,
}


def say(text: str) -> None:
    """Lines for the task log, in order with Airflow's own: ``print`` goes down another pipe,
    and its lines can land after the task's end, under "Post Execute"."""
    logging.getLogger("stateops").info(text)


P = ParamSpec("P")
R = TypeVar("R")


def one_line_errors(func: Callable[P, R]) -> Callable[P, R]:
    """A task's work inside the library's error boundary
    (:func:`stateops.core.errors.domain_errors`): bad input fails the task at once, without retries,
    with the one line the CLI would print; a lock held by another operation fails it so that its
    retries wait for the lock."""

    @functools.wraps(func)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            with domain_errors():
                _publish_connections(str(registry_path()))
                _refuse_unshared_control()
                return func(*args, **kwargs)
        except LockHeldError as err:
            raise AirflowException(one_line(err)) from None
        except StateOpsError as err:
            raise AirflowFailException(one_line(err)) from None

    return wrapper


def _refuse_unshared_control(deploy_mode: str | None = None) -> None:
    """Refuse a task on a fleet (an executor that runs tasks on other hosts, a driver in
    cluster mode) while the registry keeps its leases on local disk
    (:func:`stateops.control.topology.refuse_unshared_control`)."""
    from airflow.configuration import conf

    from stateops.control.topology import refuse_unshared_control

    try:
        registry = load_registry(switched=False)
    except StateOpsError:
        return  # the task's own reading of the registry says what is wrong with it
    executor = conf.get("core", "executor", fallback=None)
    refuse_unshared_control(registry, executor, deploy_mode)


@functools.cache
def _publish_connections(registry_file: str) -> None:
    """The registry's connections, resolved by Airflow (a secrets backend, its database, the
    AWS hook), handed to the library and the Spark jobs of this task
    (:func:`stateops_airflow.connections.publish`), once a process. Every task comes through
    :func:`one_line_errors`, the Spark ones by their preflight."""
    from stateops_airflow.connections import publish

    try:
        registry = load_registry(registry_file, switched=False)
    except StateOpsError:
        return  # the task's own reading of the registry says what is wrong with it
    publish(registry)


class StateOpsSparkSubmitOperator(SparkSubmitOperator):
    """``spark-submit`` of a project job, after the job's own checks that need no Spark
    (``preflight`` in the job file) passed on the rendered arguments: a refusal costs no JVM."""

    def execute(self, context: Any) -> None:
        one_line_errors(preflight_job)(self.application, self.application_args or [])
        self._launch_as(one_line_errors(job_submit)(self.application, self.application_args))
        self.py_files = py_files()  # where this task runs: the checkout's, or the package's
        one_line_errors(_refuse_unshared_control)(self._driver_deploy_mode())
        super().execute(context)

    def _launch_as(self, submit: Any) -> None:
        """The query's launch settings (its registry entry's ``submit``) over the operator's:
        its Spark connection, resources, queue, packages and launch-time conf."""
        self._conn_id = submit.conn_id
        for attr, value in [
            ("_deploy_mode", submit.deploy_mode),
            ("_driver_memory", submit.driver_memory),
            ("_executor_memory", submit.executor_memory),
            ("_executor_cores", submit.executor_cores),
            ("_num_executors", submit.num_executors),
            ("_total_executor_cores", submit.total_executor_cores),
            ("_yarn_queue", submit.queue),
        ]:
            if value is not None:
                setattr(self, attr, value)
        if submit.packages:
            self.packages = ",".join(filter(None, [self.packages, *submit.packages]))
        self.conf = {**(self.conf or {}), **submit.conf}

    def _driver_deploy_mode(self) -> str | None:
        """Where the driver runs: the operator's deploy mode, the Spark conf's, else the
        connection's (``deploy-mode`` in its extra), as the provider's hook resolves it."""
        from airflow.sdk import BaseHook
        from airflow.sdk.exceptions import AirflowNotFoundException

        given = self._deploy_mode or (self.conf or {}).get("spark.submit.deployMode")
        if given:
            return given
        try:
            return BaseHook.get_connection(self._conn_id).extra_dejson.get("deploy-mode")
        except AirflowNotFoundException:
            return None


def query_param(queries: list[str], description: str) -> Any:
    """The form's query field: an enum of registered queries."""
    from airflow.sdk import Param

    return Param(
        queries[0] if queries else "",
        type="string",
        enum=queries,
        title="Query",
        description=description,
    )


def dry_run_param(description: str) -> Any:
    """The form's dry-run switch, on by default: a manual DAG prints its plan first."""
    from airflow.sdk import Param

    return Param(True, type="boolean", title="Dry run", description=description)


def new_checkpoint_param(description: str) -> Any:
    """The form's new checkpoint of a migration or a code upgrade, optional."""
    from airflow.sdk import Param

    return Param(
        None,
        type=["null", "string"],
        title="New checkpoint",
        description=f"{description}: a new or empty folder (relative to data_dir, or "
        "absolute). Empty: <checkpoint>.v2 beside the old one.",
    )


def carry_over_param(title: str, description: str) -> Any:
    """The form's carry-over road (``stateops.ops.transplant.choose_road``), ``auto`` by default."""
    from airflow.sdk import Param

    from stateops.core.steps import ROADS

    return Param("auto", type="string", enum=list(ROADS), title=title, description=description)


def inject_fault(context: Any, result: Any = None) -> None:
    """``post_execute`` hook: with ``STATEOPS_FAIL_AFTER=<task id>`` in the environment, that
    task fails after doing its work (:func:`stateops.core.faults.fail_after`)."""
    from stateops.core.faults import fail_after

    one_line_errors(fail_after)(context["ti"].task_id)


def not_a_dry_run(needless: Callable[[Any], str | None] | None = None) -> Any:
    """The gate after a manual DAG's plan: with the form's dry run on, what follows is skipped;
    so it is where ``needless(context)`` says why the plan needs nothing done."""
    from airflow.sdk import get_current_context, task

    @task.short_circuit(task_id="not_a_dry_run")
    def gate() -> bool:
        context = get_current_context()
        why = needless(context) if needless else None
        if why:
            say(f"{why}: every step after this gate is skipped")
            return False
        dry_run = context["params"]["dry_run"]
        say(
            "dry run: the plan above is all this run does; every step after this gate is "
            "skipped (trigger again with dry run off to carry the plan out)"
            if dry_run
            else "not a dry run: the steps after this gate carry the plan out"
        )
        return not dry_run

    return gate()


def registered_queries(
    registry: Registry | None = None,
    where: Callable[[Query], bool] = lambda query: True,
    refused: bool = False,
) -> list[str]:
    """Names of the registered queries ``where`` takes, e.g. ``lambda q: q.movable`` (pass
    ``registry`` when the DAG file already read it); with ``refused``, the entries the
    registry refuses too (their tasks fail with the refusal, the others run)."""
    registry = registry or load_registry(switched=False)  # at parse time: no control store
    names = [q.name for q in registry.queries.values() if where(q)]
    if refused:  # those whose name itself was refused cannot name a task
        names += [n for n in registry.invalid if re.fullmatch(NAME_PATTERN, n)]
    return sorted(names)


def spark_job_operator(
    task_id: str, job: str, args: list[str], registry: str | None = None, **kwargs: Any
) -> SparkSubmitOperator:
    """``spark-submit stateops/jobs/<job> --registry R [args...]``, launched as the query it
    names says (its ``submit``: connection, resources, ...; else ``spark_default``), after the
    job's checks that need no Spark; R is the user's registry unless ``registry`` (templated)
    names another."""
    return StateOpsSparkSubmitOperator(
        task_id=task_id,
        application=str(job_path(job)),
        conn_id="spark_default",
        name=f"stateops-{task_id}",
        jars=",".join(spark_jars()) or None,
        conf={"spark.ui.enabled": "false", **spark_classpath_conf()},
        application_args=["--registry", registry or str(registry_path()), *args],
        **kwargs,
    )


# A carry-over's Spark steps (a migration's, stateops.core.steps.MIGRATION_STEPS, and a code
# upgrade's, UPGRADE_STEPS), their fields (the library's job_fields) as templates of this run's
# values: its preflight's plan and its backup's result.
_PLAN = "ti.xcom_pull(task_ids='preflight')"
CARRY_FIELDS = {
    "query": "{{ params.query }}",
    "run_id": "{{ run_id }}",
    "cutover": "{{ " + _PLAN + "['cutover'] }}",
    "old_checkpoint": "{{ " + _PLAN + "['old']['checkpoint'] }}",
    "export": "{{ " + _PLAN + "['export'] }}",
    "last_committed_batch": "{{ ti.xcom_pull(task_ids='backup')['last_committed_batch'] }}",
    "accept": "{{ 'yes' if " + _PLAN + "['carry_over']['accepted'] else 'no' }}",
}


def carry_step_operator(steps: dict[str, Any], step: str) -> SparkSubmitOperator:
    """Spark step ``step`` of ``steps`` (a migration's or a code upgrade's) as a task, with the
    new registry of the run's plan where the step runs the new query."""
    from stateops.core.steps import fill

    job, registry, args = fill(steps[step], CARRY_FIELDS)
    new = "{{ " + _PLAN + "['new']['registry'] }}"
    return spark_job_operator(step, job, args, registry=new if registry == "new" else None)


def run_query_operator(
    query: str, mode: str = "available-now", **kwargs: Any
) -> SparkSubmitOperator:
    """``run_query.py`` for one query (:data:`stateops.core.steps.RUN`), as the Airflow run."""
    from stateops.core.steps import RUN, fill

    job, _, args = fill(RUN, {"query": query, "mode": mode, "run_id": "{{ run_id }}"})
    return spark_job_operator(kwargs.pop("task_id", f"run_{query}"), job, args, **kwargs)


@one_line_errors
def verify_state(query: str) -> dict[str, Any]:
    """File-level integrity of the query's checkpoint; fails the task on errors."""
    from stateops.control.target import query_target
    from stateops.core.verify import require_sound

    return require_sound(query_target(None, query).checkpoint)


@one_line_errors
def run_summary(query: str, run_id: str, registry: str | None = None) -> dict[str, Any]:
    """The ``record`` step: the summary the Spark job of this run wrote (fails if it is from
    another run), said in one line. ``registry``: the file the job ran with (a backfill's
    plan may give one with overrides), else the default one."""
    from stateops.control.target import query_target
    from stateops.ops.start import read_summary, summary_line

    target = query_target(registry, query)
    summary = read_summary(target.require_registry(), query, run_id)
    say(summary_line(summary))
    return summary


def _backups_client(registry: Registry) -> Any:
    """An S3 client for the registry's backup store, from its Airflow connection."""
    from stateops_airflow.connections import s3_client

    return s3_client(registry.backups.conn_id, "the registry's backups.conn_id")


def backup_lister(registry: Registry) -> tuple[Any, str | None]:
    """A client that lists the registry's backups (a status's), or None and why not: the
    rest of a status is still read."""
    try:
        return _backups_client(registry), None
    except Exception as err:  # noqa: BLE001 - a missing or bad connection, said in the status
        return None, f"backups: connection {registry.backups.conn_id!r}: {one_line(err)}"


def _backup_first(target: Any, operation: str) -> Any:
    """The backup before ``operation`` (:func:`stateops.ops.backup.backup_first`) through the
    registry's Airflow connection, opened when the backup is taken."""
    from stateops.ops.backup import backup_first

    registry = target.require_registry()
    return backup_first(target, lambda: _backups_client(registry), operation, log=say)


def committed_checkpoint(registry: Registry, query: str) -> str:
    """The query's checkpoint; skips the task while it has no committed batch."""
    from stateops.core.checkpoint import has_commit

    checkpoint = registry.query(query).checkpoint
    if not has_commit(checkpoint):
        raise AirflowSkipException(f"{query}: {checkpoint} has no committed batch yet")
    return checkpoint


@one_line_errors
def backup_query(query: str) -> dict[str, Any]:
    """The scheduled backup of one query: to ``<backups.url>/<query>``, then retention
    (``stateops.ops.backup.run_backup``, as ``stateops backup QUERY``)."""
    from stateops.control.target import query_target
    from stateops.ops.backup import run_backup

    target = query_target(None, query)
    registry = target.require_registry()
    committed_checkpoint(registry, query)
    return run_backup(target, _backups_client(registry), log=say)


@one_line_errors
def drill_restore(query: str) -> dict[str, Any]:
    """A restore drill's first step (stream_restore_drill): the query's newest backup restored
    into its scratch place (:func:`stateops.ops.drill.begin_drill`); its plan, for the Spark
    read and the record. No backup yet: skipped."""
    from airflow.sdk import get_current_context
    from airflow.sdk.exceptions import AirflowSkipException

    from stateops.control.target import query_target
    from stateops.ops.drill import begin_drill

    target = query_target(None, query)
    client = _backups_client(target.require_registry())
    run_id = get_current_context()["run_id"]
    plan = begin_drill(target, client, run_id=run_id, log=say)
    if plan is None:
        raise AirflowSkipException(f"{query}: no backup yet: nothing to drill")
    return plan


@one_line_errors
def drill_record(plan: dict[str, Any] | None) -> dict[str, Any] | None:
    """A restore drill's last step: recorded beside the backup, passed when the Spark read
    left its export (:func:`stateops.ops.drill.finish_drill`), failing the task otherwise; the
    scratch place removed. No plan: the restore failed (recorded then) or was skipped."""
    from stateops.ops.drill import finish_drill

    if plan is None:
        say("no drill to record: the restore step recorded its failure, or was skipped")
        return None
    client = _backups_client(load_registry(switched=False))
    return finish_drill(plan, client, log=say)


def drill_read_operator(query: str) -> SparkSubmitOperator:
    """A restore drill's Spark step: the export job reads the state of the checkpoint that
    ``restore_<query>`` restored (:data:`stateops.core.steps.EXPORT`)."""
    from stateops.core.steps import EXPORT, fill
    from stateops.ops.drill import READ_FIELDS

    plan = "{{ ti.xcom_pull(task_ids='restore_%s')['%s'] }}"
    fields = {field: plan % (query, key) for field, key in READ_FIELDS.items()}
    job, _, args = fill(EXPORT, fields)
    return spark_job_operator(f"read_{query}", job, args)


def each_query_then_outcome(
    operation: str,
    queries: list[str],
    work: Callable[[str], dict[str, Any]],
    describe: Callable[[dict[str, Any]], str],
) -> None:
    """A scheduled DAG's tasks: ``<operation>_<query>`` (``work(query)``) for each query, then
    ``outcome``: what each did (``describe(result)``) or why it was skipped, failing the run
    when every query was skipped (:func:`scheduled_outcome`)."""
    from airflow.sdk import get_current_context, task

    @task(trigger_rule="none_failed")
    def outcome() -> list[str]:
        ti = get_current_context()["ti"]
        done = {q: ti.xcom_pull(task_ids=f"{operation}_{q}") for q in queries}
        return scheduled_outcome(operation, {q: r and describe(r) for q, r in done.items()})

    last = outcome()
    for query in queries:

        @task(task_id=f"{operation}_{query}")
        def step(query: str = query) -> dict[str, Any]:
            return work(query)

        step() >> last


def scheduled_outcome(operation: str, done: dict[str, str | None]) -> list[str]:
    """The last task of a scheduled DAG (backup, cleanup): one line per query, what was done
    (``done[query]``) or why it was skipped (None: no committed batch yet). When every query
    was skipped, nothing was done, and the run must not look green: it fails, saying so."""
    lines = [
        f"{query}: {what}"
        if what is not None
        else f"{query}: skipped, no committed batch yet (stream_start runs it)"
        for query, what in sorted(done.items())
    ]
    for line in lines:
        say(line)
    if done and all(what is None for what in done.values()):
        raise AirflowFailException(
            f"no {operation} was done: no registered query has a committed batch yet; run "
            f"stream_start first (the next scheduled run will {operation} them)"
        )
    return lines


@one_line_errors
def check_health(query: str) -> dict[str, Any]:
    """The health rules of one query (stream_health), from its status (no Spark): the rules
    that fire, and what changed since they were last alerted, go to the task's XCom
    ``alerts`` for its callbacks (:class:`HealthAlerts`); the task fails when a FAIL rule
    fires (:func:`health_failure`). Its figures go to the query's history and Airflow's
    metrics first. A switch that failed its readiness window is switched back first
    (:mod:`stateops.ops.readiness`): the check then says so (``switched_back``)."""
    from airflow.sdk import get_current_context

    from stateops.alerts import changes, firing, read_alerted, watch_readiness

    registry = load_registry()  # switched: the query where it runs now
    client, unlisted = backup_lister(registry)
    status = watch_readiness(registry, query, client, unlisted, say)
    health = status["health"]
    _record_check(registry, query, status)
    now = firing(health)
    alerts = [a.as_dict() for a in changes(query, read_alerted(registry, query), now)]
    get_current_context()["ti"].xcom_push(
        key="alerts", value={"query": query, "firing": now, "changes": alerts}
    )
    for rule, seen in now.items():
        say(f"{query}: [{seen['level']}] {rule}: {seen['message']}")
    say(f"{query}: {len(alerts)} change(s) to alert" if alerts else f"{query}: no change")
    failure = health_failure(query, now)
    if failure:
        raise AirflowFailException(failure)
    return {"query": query, "verdict": health["verdict"], "reasons": health["reasons"]}


def health_failure(query: str, now: dict[str, dict[str, str]]) -> str | None:
    """The line a health check fails with: only when a FAIL rule fires (``now``: the rules
    that fire, :func:`stateops.alerts.firing`), naming every rule that fires. A WARN alone is
    a notification (its alert is sent all the same), not a failed task: a fresh deployment
    with no backup yet is not a red grid."""
    if not any(seen["level"] == "FAIL" for seen in now.values()):
        return None
    return f"{query}: " + "; ".join(
        f"[{seen['level']}] {rule}: {seen['message']}" for rule, seen in now.items()
    )


_LEVELS = {"OK": 0, "WARN": 1, "FAIL": 2}


def _record_check(registry: Registry, query: str, status: dict[str, Any]) -> None:
    """The check's figures: a point in the query's history (:mod:`stateops.control.history`), and,
    with its last run's, gauges ``stateops.<query>.<figure>`` in Airflow's metrics (StatsD or
    OpenTelemetry, where the deployment turned them on: ``[metrics]``)."""
    from airflow.sdk.observability.stats import Stats

    from stateops.control.history import check_point, record

    point = check_point(status)
    if query in registry.queries:  # a refused entry has no limits to keep it by
        try:
            record(registry, query, point)
        except (StateOpsError, OSError) as err:
            say(f"{query}: the check's figures were not recorded: {one_line(err)}")
    figures = {k: point[k] for k in ("batch", "lag_records", "waiting_seconds", "checkpoint_bytes")}
    figures |= (status["last_run"] or {}).get("figures", {})
    figures["health"] = _LEVELS[status["health"]["verdict"]]
    for name, value in figures.items():
        if value is not None:
            Stats.gauge(f"stateops.{query}.{name}", value)


class HealthAlerts(BaseNotifier):
    """stream_health's task callbacks (on success and on failure): the changes its check
    found (:func:`check_health`), each through the registry's notifier (``alerts.notifier``)
    and in the task's log; then recorded as alerted (:func:`stateops.alerts.write_alerted`).
    A notifier that fails leaves them unrecorded: the next check sends them again."""

    def notify(self, context: Any) -> None:
        from stateops.alerts import notifier_for, write_alerted

        ti = context["ti"]
        found = ti.xcom_pull(task_ids=ti.task_id, key="alerts")
        if not found or not found["changes"]:  # none, or the check failed before it knew
            return
        registry = load_registry(switched=False)  # its alerts: and paths; no switch to read
        for change in found["changes"]:
            say(f"alert: {change['text']}")
            notifier = notifier_for(registry)
            if notifier is not None:
                notifier({**context, "alert": change})
        write_alerted(registry, found["query"], found["firing"])


@one_line_errors
def cleanup_query(query: str, run_id: str) -> dict[str, Any]:
    """Clean the query's checkpoint, retaining the registry's ``cleanup.retain_batches``: the
    plan first, then the deletions under the query's lock (a running query holds it)."""
    from stateops.control.target import query_target
    from stateops.ops.cleanup import run_cleanup

    target = query_target(None, query)
    registry = target.require_registry()
    committed_checkpoint(registry, query)
    plan = run_cleanup(target, run_id=run_id, log=say, client=lambda: _backups_client(registry))
    return {k: v for k, v in plan.items() if k not in ("files", "groups")}


@one_line_errors
def restore_plan(
    query: str,
    backup_id: str,
    target: str | None,
    *,
    replace: bool = False,
    allow_other_query: bool = False,
    dry_run: bool = True,
) -> dict[str, Any]:
    """``stateops.ops.restore.plan_restore`` for the form (``latest`` resolves), printed."""
    from stateops.ops.restore import format_restore_plan, plan_restore

    registry = load_registry()
    result = plan_restore(
        query,
        _backups_client(registry),
        backup=backup_id,
        to=target or None,
        registry=registry,
        replace=replace,
        allow_other_query=allow_other_query,
    )
    # Airflow's log view shows ANSI colours: another query's state is marked in red.
    say(format_restore_plan(result, dry_run=dry_run, color=True))
    return result


@one_line_errors
def restore_run(plan: dict[str, Any], run_id: str) -> dict[str, Any]:
    """``stateops.ops.restore.run_restore``: under the lock of the query whose checkpoint the
    target is, deciding again on what the target holds now."""
    from stateops.ops.restore import run_restore

    registry = load_registry()
    client = _backups_client(registry)
    return run_restore(plan, client, registry=registry, run_id=run_id, log=say)


@one_line_errors
def backfill_plan(params: dict[str, Any], run_id: str) -> dict[str, Any]:
    """:func:`stateops.ops.backfill.plan_backfill` for the form's fields."""
    from stateops.control.target import query_target
    from stateops.ops import backfill

    return backfill.plan_backfill(
        query_target(None, params["query"]),
        run_id,
        to_batch=params.get("to_batch"),
        input_before=params.get("input_before"),
        overrides=params.get("overrides"),
        rewrite_output=params.get("rewrite_output"),
        dry_run=params["dry_run"],
        log=say,
    )


@one_line_errors
def backfill_rollback(plan: dict[str, Any]) -> dict[str, Any]:
    """:func:`stateops.ops.backfill.rollback_for_backfill`, backing up through the registry's
    Airflow connection."""
    from stateops.control.target import query_target
    from stateops.ops import backfill

    target = query_target(None, plan["query"])
    backup = _backup_first(target, "backfill")
    return backfill.rollback_for_backfill(target, plan, backup=backup, log=say)


@one_line_errors
def backfill_report(plan: dict[str, Any], rollback: dict[str, Any]) -> dict[str, Any]:
    """:func:`stateops.ops.backfill.report_backfill`."""
    from stateops.control.target import query_target
    from stateops.ops import backfill

    return backfill.report_backfill(query_target(None, plan["query"]), plan, rollback, log=say)


@one_line_errors
def migration_plan(params: dict[str, Any], run_id: str) -> dict[str, Any]:
    """The preflight: :func:`stateops.ops.migration.plan_migration` for the form's fields,
    printed. The query is held from ``stop_query`` on, once the plan is approved: not while a
    request waits."""
    from stateops.control.target import query_target
    from stateops.ops.migration import format_migration_plan, plan_migration

    source = {
        "format": params["new_source_format"],
        "path": params.get("new_source_path") or "",
        "topic": params.get("new_source_topic") or "",
        "bootstrap_servers": params.get("new_source_bootstrap_servers") or "",
        "start": params.get("new_source_start") or "",
        "schema": params["new_source_schema"] or "",
        "options": params["new_source_options"],
    }
    plan = plan_migration(
        query_target(None, params["query"]),
        source,
        params["new_checkpoint"] or "",
        run_id,
        params["cutover"],
        params["carry_over"],
        params["accept_differences"],
        params["source"] or "",
    )
    say(format_migration_plan(plan, params["dry_run"]))
    return plan


@one_line_errors
def migration_stop(plan: dict[str, Any]) -> None:
    """The stop_query step: hold the query for the migration (other lifecycle operations wait
    until it ends), then stop it gracefully if it runs."""
    from stateops.control.target import query_target
    from stateops.ops.migration import prepare_migration, stop_running_query

    target = query_target(None, plan["query"])
    prepare_migration(target, plan)
    say(f"{plan['query']}: held by this run; other lifecycle operations wait")
    stop_running_query(target, plan["run_id"], log=say)


@one_line_errors
def migration_step(step: str, plan: dict[str, Any], *args: Any) -> dict[str, Any]:
    """Step ``step`` (``backup``, ``transplant``, ``prove``, ``switch``) of
    :mod:`stateops.ops.migration` for ``plan``, a migration's or a code upgrade's (whose
    backup is :func:`stateops.ops.upgrade.backup_for_upgrade`); the backup through its
    Airflow connection."""
    from stateops.control.target import query_target
    from stateops.ops import migration, upgrade

    target = query_target(None, plan["query"])
    if step == "backup":
        operation = _operation(plan)
        backup = _backup_first(target, operation)
        settle = (
            upgrade.backup_for_upgrade
            if operation == upgrade.OPERATION
            else migration.backup_for_migration
        )
        return settle(target, plan, backup, log=say)
    run = {
        "transplant": migration.transplant_for_migration,
        "prove": migration.prove_migration,
        "switch": migration.switch_migration,
    }[step]
    return run(target, plan, *args, log=say)


def _operation(plan: dict[str, Any]) -> str:
    """A carry-over plan's operation: ``migration``, or ``upgrade`` (a code upgrade)."""
    return plan.get("operation", "migration")


# Where the query is after a carry-over's roll back, by operation.
_ROLLED_BACK = {
    "migration": "the query runs on its old source",
    "upgrade": "the query runs its old code on its old checkpoint",
}


def migration_roll_back(plan: dict[str, Any] | None, approved: bool) -> None:
    """The roll_back step, after a failed step: undo the migration (or code upgrade) run. It
    succeeds when it undid something and is skipped, saying why, when there was nothing to
    undo (a refused preflight, a failed dry run, a stop not approved: the query is held only
    from ``stop_query`` on); the run fails either way, since its last step (``migrated``) did
    not run."""
    from stateops.control.target import query_target
    from stateops.ops.migration import roll_back_migration

    if not plan:
        raise AirflowSkipException(
            "the preflight failed before anything changed: nothing to roll back (its log says "
            "what to fix)"
        )
    operation = _operation(plan)
    if not approved:
        raise AirflowSkipException(
            f"the {operation} was not approved (approve_stop says why) before anything "
            "changed: nothing to roll back"
        )
    roll_back_migration(query_target(None, plan["query"]), plan, log=say)
    say(
        f"the {operation} failed (see the failed step's log); it was rolled back and "
        f"{_ROLLED_BACK[operation]}"
    )


def migration_migrated(plan: dict[str, Any]) -> str:
    """The last step of a migration (``migrated``) or a code upgrade (``upgraded``): what the
    run did and how to undo it, said."""
    from stateops.ops.migration import format_migrated
    from stateops.ops.upgrade import format_upgraded

    line = format_upgraded(plan) if _operation(plan) == "upgrade" else format_migrated(plan)
    say(line)
    return line


def carry_over_tasks(last: str, prove_rule: str = "all_success") -> tuple[Any, ...]:
    """The tasks a migration's DAG and a code upgrade's share, for the DAG to call on its
    preflight's plan: ``stop_query``, ``backup``, ``prove`` (with ``prove_rule``), ``switch``,
    ``roll_back`` (after any failed step) and the last step, ``last``."""
    from airflow.sdk import get_current_context, task

    @task
    def stop_query(plan: dict[str, Any]) -> None:
        migration_stop(plan)

    @task
    def backup(plan: dict[str, Any]) -> dict[str, Any]:
        return migration_step("backup", plan)

    @task(trigger_rule=prove_rule)
    def prove(plan: dict[str, Any]) -> dict[str, Any]:
        return migration_step("prove", plan)

    @task
    def switch(
        plan: dict[str, Any], settled: dict[str, Any], carried: dict[str, Any]
    ) -> dict[str, Any]:
        return migration_step("switch", plan, settled, carried)

    @task(trigger_rule="one_failed")
    def roll_back() -> None:
        """Runs only when a step failed; undoes the run (skipped when nothing changed)."""
        from stateops_airflow.approval import approved  # it imports this module

        context = get_current_context()
        plan = context["ti"].xcom_pull(task_ids="preflight")
        migration_roll_back(plan, approved(context, "approve_stop"))

    @task(task_id=last)
    def done(plan: dict[str, Any]) -> str:
        """The last step: what the run did and how to undo it. It does not run when a step
        failed, so the run fails (whether roll_back undid something or had nothing to undo)."""
        return migration_migrated(plan)

    return stop_query, backup, prove, switch, roll_back, done


@one_line_errors
def upgrade_plan(params: dict[str, Any], run_id: str) -> dict[str, Any]:
    """The preflight of a code upgrade: :func:`stateops.ops.upgrade.plan_upgrade` for the
    form's fields, printed (every change the check found, and the steps)."""
    from stateops.control.target import query_target
    from stateops.ops.upgrade import format_upgrade_plan, plan_upgrade

    target = query_target(None, params["query"])
    plan = plan_upgrade(target, params["new_checkpoint"] or "", run_id)
    say(format_upgrade_plan(plan, params["dry_run"]))
    return plan


def upgrade_needless(context: Any) -> str | None:
    """Why the code upgrade of the preflight's plan has nothing to do (the check found no state
    to rewrite), for the gate after it; None when it rewrites."""
    plan = context["ti"].xcom_pull(task_ids="preflight")
    if plan["rewrite"]:
        return None
    return f"{plan['query']}: no state rewrite needed; start it with its new code (stream_start)"


@one_line_errors
def repartition_plan(query: str, partitions: int, dry_run: bool) -> dict[str, Any]:
    """:func:`stateops.ops.repartition.plan_repartition` for the form, printed, with where
    ``repartition_prepare`` backs up."""
    from stateops.control.target import query_target
    from stateops.ops.repartition import format_repartition_plan, plan_repartition

    target = query_target(None, query)
    plan = plan_repartition(target, partitions) | {"backup_to": target.backup_location()}
    say(format_repartition_plan(plan, dry_run=dry_run))
    return plan


@one_line_errors
def repartition_prepare(query: str, partitions: int, run_id: str) -> dict[str, Any]:
    """Under the query's lock: plan again, back up through the registry's Airflow
    connection, and mark the run (:func:`stateops.ops.repartition.prepare_repartition`)."""
    from stateops.control.target import query_target
    from stateops.ops.repartition import prepare_repartition

    target = query_target(None, query)
    backup = _backup_first(target, "repartition")
    return prepare_repartition(target, partitions, run_id=run_id, backup=backup, log=say)


@one_line_errors
def repartition_finish(query: str, run_id: str) -> dict[str, Any]:
    """Under the query's lock: check Spark's work and its proof, record the count."""
    from stateops.control.target import query_target
    from stateops.ops.repartition import finish_repartition

    done = finish_repartition(query_target(None, query), run_id=run_id, log=say)
    return {k: v for k, v in done.items() if k != "proof"} | {"proof": done["proof"]["summary"]}


def repartition_undo(query: str, run_id: str) -> None:
    """After a failed step: give back the checkpoint as it was. It succeeds when it undid
    something and is skipped, saying why, when there was nothing to undo; the run fails
    either way, since its last step (``verify_state``) did not run."""
    from stateops.control.target import query_target
    from stateops.ops.repartition import undo_repartition

    target = query_target(None, query)
    undone = one_line_errors(undo_repartition)(target, run_id=run_id, log=say)
    if not undone:
        raise AirflowSkipException(
            "the repartition failed before it changed the checkpoint: nothing to undo (the "
            "failed step's log says what to fix)"
        )
    say(
        "the repartition failed (see the failed step's log); it was undone: the checkpoint "
        "is as it was"
    )


@one_line_errors
def bootstrap_plan(params: dict[str, Any]) -> dict[str, Any]:
    """:func:`stateops.ops.bootstrap.plan_bootstrap` for the form's fields, printed."""
    from stateops.control.target import query_target
    from stateops.ops.bootstrap import format_bootstrap_plan, plan_bootstrap

    fmt = None if params["format"] == "auto" else params["format"]
    plan = plan_bootstrap(
        query_target(None, params["query"]),
        params["initial_state"],
        fmt,
        params["carry_over"],
        params["accept_differences"],
    )
    say(format_bootstrap_plan(plan, params["dry_run"]))
    return plan
