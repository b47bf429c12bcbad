"""A fleet rehearsal for ``airflow dags test`` (tests/dag/test_fleet_rehearsal.py): each task
runs with its own empty data folder, as each pod of the KubernetesExecutor (or a Celery worker
on its own host) would, and the Spark job it submits inherits it (a driver in client mode runs
beside its task). Anything a later task reads from a folder an earlier one wrote then fails.

On ``PYTHONPATH`` only in that test: Airflow applies this module's ``task_policy`` to every
task it loads."""

from __future__ import annotations

import os
import tempfile


def _own_host(context) -> None:
    """A fresh data folder for this task, under ``STATEOPS_FLEET_HOSTS``."""
    ti = context["ti"]
    host = tempfile.mkdtemp(prefix=f"{ti.task_id}-", dir=os.environ["STATEOPS_FLEET_HOSTS"])
    os.environ["STATEOPS_DATA_DIR"] = host


def task_policy(task) -> None:
    task.on_execute_callback = [_own_host, *(task.on_execute_callback or [])]
