"""Builders the DAG files use: the registered queries and the Spark job that runs one.

Parse-time work is limited to reading the registry file (it names the tasks); no connection,
variable or Spark session is touched until a task runs.
"""

from __future__ import annotations

import functools
import json
import os
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any, ParamSpec, TypeVar

from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator
from airflow.sdk.exceptions import AirflowException, AirflowFailException, AirflowSkipException

from stateops.errors import LockHeldError, StateOpsError, domain_errors, one_line
from stateops.jobs import preflight_job
from stateops.registry import Registry, load_registry, registry_path
from stateops.times import TIME_PATTERN  # a form's time field: real dates only
from stateops.verify import error_summary, format_findings, verify_checkpoint

__all__ = [
    "LIFECYCLE_DAG",
    "StateOpsSparkSubmitOperator",
    "one_line_errors",
    "airflow_s3_client",
    "backup_query",
    "dry_run_param",
    "inject_fault",
    "not_a_dry_run",
    "plan_backfill",
    "plan_restore",
    "query_param",
    "restore_query",
    "PROJECT_ROOT",
    "TIME_PATTERN",
    "read_run_summary",
    "report_backfill",
    "rollback_for_backfill",
    "registered_queries",
    "run_query_operator",
    "spark_job_operator",
    "verify_state",
]

PROJECT_ROOT = Path(__file__).resolve().parents[2]
PY_FILES = PROJECT_ROOT / "build" / "stateops.zip"

# What every lifecycle DAG shares: no catch-up, one run at a time (runs of different DAGs on
# the same query are serialised by the query's lock, not by Airflow).
LIFECYCLE_DAG: dict[str, Any] = {
    "start_date": datetime(2026, 1, 1),
    "catchup": False,
    "max_active_runs": 1,
}


P = ParamSpec("P")
R = TypeVar("R")


def one_line_errors(func: Callable[P, R]) -> Callable[P, R]:
    """A task's work inside the library's error boundary (:func:`stateops.errors.domain_errors`):
    bad input fails the task at once, without retries, with the one line the CLI would print;
    a lock held by another operation fails it so that its retries wait for the lock."""

    @functools.wraps(func)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            with domain_errors():
                return func(*args, **kwargs)
        except LockHeldError as err:
            raise AirflowException(one_line(err)) from None
        except StateOpsError as err:
            raise AirflowFailException(one_line(err)) from None

    return wrapper


class StateOpsSparkSubmitOperator(SparkSubmitOperator):
    """``spark-submit`` of a project job, after the job's own checks that need no Spark
    (``preflight`` in the job file) passed on the rendered arguments: a refusal costs no JVM."""

    def execute(self, context: Any) -> None:
        one_line_errors(preflight_job)(self.application, self.application_args or [])
        super().execute(context)


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


def carry_over_param(title: str, description: str) -> Any:
    """The form's carry-over road (see ``stateops.transplant.choose_road``), ``auto`` by default."""
    from airflow.sdk import Param

    from stateops.transplant import ROADS

    return Param("auto", type="string", enum=list(ROADS), title=title, description=description)


def inject_fault(context: Any, result: Any = None) -> None:
    """``post_execute`` hook: with ``STATEOPS_FAIL_AFTER=<task id>`` in the environment, that
    task fails after doing its work (:func:`stateops.faults.fail_after`)."""
    from stateops.faults import fail_after

    one_line_errors(fail_after)(context["ti"].task_id)


def not_a_dry_run() -> Any:
    """The gate after a manual DAG's plan: with the form's dry run on, what follows is skipped."""
    from airflow.sdk import get_current_context, task

    @task.short_circuit(task_id="not_a_dry_run")
    def gate() -> bool:
        return not get_current_context()["params"]["dry_run"]

    return gate()


def registered_queries(
    with_initial_state: bool = False, registry: Registry | None = None
) -> list[str]:
    """Names of the registered queries (pass ``registry`` when the DAG file already read it)."""
    queries = (registry or load_registry()).queries.values()
    return sorted(q.name for q in queries if q.initial_state or not with_initial_state)


def spark_job_operator(
    task_id: str, job: str, args: list[str], registry: str | None = None, **kwargs: Any
) -> SparkSubmitOperator:
    """``spark-submit spark_jobs/<job> --registry R [args...]`` on ``spark_default``, after the
    job's checks that need no Spark; R is the user's registry unless ``registry`` (templated)
    names another."""
    return StateOpsSparkSubmitOperator(
        task_id=task_id,
        application=str(PROJECT_ROOT / "spark_jobs" / job),
        conn_id="spark_default",
        name=f"stateops-{task_id}",
        py_files=str(PY_FILES) if PY_FILES.exists() else None,
        conf={"spark.ui.enabled": "false"},
        application_args=["--registry", registry or str(registry_path()), *args],
        **kwargs,
    )


def run_query_operator(
    query: str, mode: str = "available-now", **kwargs: Any
) -> SparkSubmitOperator:
    """``run_query.py`` for one query."""
    args = ["--query", query, "--mode", mode, "--run-id", "{{ run_id }}"]
    return spark_job_operator(kwargs.pop("task_id", f"run_{query}"), "run_query.py", args, **kwargs)


@one_line_errors
def verify_state(query: str) -> dict[str, Any]:
    """File-level integrity of the query's checkpoint; raises (fails the task) on errors."""
    result = verify_checkpoint(load_registry().query(query).checkpoint)
    print(format_findings(result), end="")
    if not result["ok"]:
        raise AirflowFailException(
            f"{query}: checkpoint {result['checkpoint']} failed verification: "
            f"{error_summary(result)}"
        )
    return result


@one_line_errors
def read_run_summary(query: str, run_id: str) -> dict[str, Any]:
    """The summary ``run_query.py`` wrote for this run; fails if it is from another run."""
    from stateops.runner import read_summary

    return read_summary(load_registry(), query, run_id)


def airflow_s3_client(conn_id: str) -> Any:
    """An S3 client from Airflow connection ``conn_id`` (type aws; extra.endpoint_url)."""
    from airflow.sdk import BaseHook

    from stateops.s3 import S3Settings, s3_client

    conn = BaseHook.get_connection(conn_id)
    extra = conn.extra_dejson
    return s3_client(
        S3Settings(
            endpoint_url=extra.get("endpoint_url"),
            region=extra.get("region_name") or "us-east-1",
            access_key=conn.login,
            secret_key=conn.password,
        )
    )


def committed_checkpoint(registry: Registry, query: str) -> str:
    """The query's checkpoint; skips the task while it has no committed batch. Only lists
    ``commits/``: the operation that follows loads the checkpoint model itself."""
    checkpoint = registry.query(query).checkpoint
    commits = Path(checkpoint) / "commits"
    if not (commits.is_dir() and any(name.isdigit() for name in os.listdir(commits))):
        raise AirflowSkipException(f"{query}: {checkpoint} has no committed batch yet")
    return checkpoint


@one_line_errors
def backup_query(query: str) -> dict[str, Any]:
    """Back up the query's checkpoint to ``<backups.url>/<query>``, then apply retention."""
    from stateops.backup import backup_checkpoint, prune_backups

    registry = load_registry()
    settings = registry.backups
    checkpoint = committed_checkpoint(registry, query)
    client = airflow_s3_client(settings.conn_id)
    url = settings.url_for(query)
    manifest = backup_checkpoint(checkpoint, url, client, log=print)
    retention = prune_backups(url, client, keep_last=settings.keep_last, max_age=settings.max_age)
    print(
        f"retention: kept {len(retention['kept'])} backups, deleted "
        f"{len(retention['deleted_backups'])} and {retention['deleted_objects']} unreferenced "
        f"objects ({retention['freed_bytes']} bytes)"
    )
    return {k: v for k, v in manifest.items() if k != "files"} | {"retention": retention}


@one_line_errors
def cleanup_query(query: str, run_id: str) -> dict[str, Any]:
    """Clean the query's checkpoint, retaining the registry's ``cleanup.retain_batches``: the
    plan first, then the deletions under the query's lock (a running query holds it)."""
    from stateops.cleanup import checkpoint_lock, run_cleanup

    registry = load_registry()
    checkpoint = committed_checkpoint(registry, query)
    lock = checkpoint_lock(checkpoint, registry, "cleanup", run_id)
    plan = run_cleanup(checkpoint, registry.cleanup.retain_batches, lock, log=print)
    return {k: v for k, v in plan.items() if k not in ("files", "groups")}


@one_line_errors
def plan_restore(
    query: str,
    backup_id: str,
    target: str | None,
    *,
    replace: bool = False,
    allow_other_query: bool = False,
    dry_run: bool = True,
) -> dict[str, Any]:
    """``stateops.restore.plan_restore`` for the form (``latest`` resolves), printed."""
    from stateops.restore import format_restore_plan
    from stateops.restore import plan_restore as plan

    registry = load_registry()
    result = plan(
        query, airflow_s3_client(registry.backups.conn_id), backup=backup_id, to=target or None,
        registry=registry, replace=replace, allow_other_query=allow_other_query,
    )  # fmt: skip
    verb = "DRY RUN: would restore" if dry_run else "restoring"
    print(f"{verb} {result['backup']['backup_id']} into {result['target']}")
    # Airflow's log view shows ANSI colours: another query's state is marked in red.
    print(format_restore_plan(result, color=True))
    return result


@one_line_errors
def restore_query(plan: dict[str, Any], run_id: str) -> dict[str, Any]:
    """``stateops.restore.execute_restore``: under the lock of the query whose checkpoint the
    target is, deciding again on what the target holds now."""
    from stateops.restore import execute_restore

    registry = load_registry()
    client = airflow_s3_client(registry.backups.conn_id)
    return execute_restore(plan, client, registry=registry, run_id=run_id, log=print)


@one_line_errors
def plan_backfill(params: dict[str, Any], run_id: str) -> dict[str, Any]:
    """The backfill's rollback point, its rollback plan and the registry to reprocess with."""
    from stateops.backfill import last_batch_before, parse_time, registry_with_overrides
    from stateops.cleanup import format_plan, plan_rollback, plan_sink_rollback, safe_run_id
    from stateops.errors import StateOpsError

    registry = load_registry()
    query = registry.query(params["query"])
    to_batch, before = params.get("to_batch"), (params.get("input_before") or "").strip()
    if (to_batch is None) == (not before):
        raise StateOpsError(
            "give either a batch to roll back to or an input time, not "
            + ("both" if before else "neither")
        )
    if to_batch is None:
        to_batch = last_batch_before(query.checkpoint, parse_time(before, "input_before"))
        print(f"the last batch whose input is older than {before}: {to_batch}")
    plan = plan_rollback(query.checkpoint, to_batch)
    plan.update(
        sink=plan_sink_rollback(query.sink.path, to_batch, query.sink.batch_offset),
        backup_first=True,
    )
    path = str(registry.path)
    if params.get("overrides"):
        folder = registry.state_dir / "backfill" / safe_run_id(run_id)
        path = str(registry_with_overrides(registry, query.name, params["overrides"],
                                           folder / "registry.yaml"))  # fmt: skip
    print(format_plan(plan, dry_run=params["dry_run"]))
    print(
        f"then: reprocess {query.name} after batch {to_batch} with available-now "
        f"(registry {path}; overrides {json.dumps(params.get('overrides') or {})}), "
        "check the state and compare the reprocessed output with the old one"
    )
    return {
        "query": query.name,
        "checkpoint": query.checkpoint,
        "to_batch": to_batch,
        "last_committed_batch": plan["last_committed_batch"],
        "registry": path,
        "delete": plan["delete"],
    }


@one_line_errors
def rollback_for_backfill(plan: dict[str, Any]) -> dict[str, Any]:
    """Backup to the registry's backup location, then the rollback, under the query's lock."""
    from stateops.backup import backup_checkpoint
    from stateops.cleanup import checkpoint_lock, new_run_id, run_rollback

    registry = load_registry()
    query = registry.query(plan["query"])

    def backup() -> str:
        client = airflow_s3_client(registry.backups.conn_id)
        url = registry.backups.url_for(query.name)
        return backup_checkpoint(query.checkpoint, url, client, log=print)["backup_id"]

    lock = checkpoint_lock(query.checkpoint, registry, "backfill", new_run_id("rollback"))
    done = run_rollback(query.checkpoint, plan["to_batch"], lock, sink=query.sink.path,
                        sink_batch_offset=query.sink.batch_offset, backup=backup,
                        log=print)  # fmt: skip
    return {"run_id": done["run_id"], "backup_id": done["backup_id"], "to_batch": plan["to_batch"]}


@one_line_errors
def report_backfill(plan: dict[str, Any], rollback: dict[str, Any]) -> dict[str, Any]:
    """What the reprocessing changed in the output of the batches after the rollback point."""
    from stateops.backfill import diff_output

    query = load_registry().query(plan["query"])
    old = Path(query.sink.path) / "_rolled_back" / rollback["run_id"]
    after = query.sink.folder_batch(plan["to_batch"])
    diff = diff_output(query.sink.path, old, after, query.key_columns)
    print(
        f"{query.name}: batches {diff['batches_before']} -> {diff['batches_after']}: "
        f"{diff['rows_before']} rows before, {diff['rows_after']} after; "
        f"{diff['unchanged']} unchanged, {diff['added']} added, {diff['removed']} removed, "
        f"{diff['changed_keys']} keys changed (by {', '.join(query.key_columns)}); "
        f"the old output is kept in {old}"
    )
    for line in diff["examples"]:
        print(f"  changed {line}")
    return diff
