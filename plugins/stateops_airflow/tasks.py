"""Builders the DAG files use: the registered queries and the Spark job that runs one.

Parse-time work is limited to reading the registry file (it names the tasks); no connection,
variable or Spark session is touched until a task runs.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator

from stateops.registry import load_registry

__all__ = ["PROJECT_ROOT", "read_run_summary", "registered_queries", "run_query_operator"]

PROJECT_ROOT = Path(__file__).resolve().parents[2]
RUN_QUERY = PROJECT_ROOT / "spark_jobs" / "run_query.py"
PY_FILES = PROJECT_ROOT / "build" / "stateops.zip"


def registered_queries() -> list[str]:
    return sorted(load_registry().queries)


def run_query_operator(
    query: str, mode: str = "available-now", **kwargs: Any
) -> SparkSubmitOperator:
    """``spark-submit run_query.py`` for one query, on the ``spark_default`` connection."""
    return SparkSubmitOperator(
        task_id=kwargs.pop("task_id", f"run_{query}"),
        application=str(RUN_QUERY),
        conn_id="spark_default",
        name=f"stateops-{query}",
        py_files=str(PY_FILES) if PY_FILES.exists() else None,
        conf={"spark.ui.enabled": "false"},
        application_args=[
            "--registry",
            str(load_registry().path),
            "--query",
            query,
            "--mode",
            mode,
            "--run-id",
            "{{ run_id }}",
        ],
        **kwargs,
    )


def read_run_summary(query: str, run_id: str) -> dict[str, Any]:
    """The summary ``run_query.py`` wrote for this run; fails if it is from another run."""
    path = load_registry().run_summary_path(query)
    summary = json.loads(path.read_text(encoding="utf-8"))
    if summary.get("run_id") != run_id:
        raise RuntimeError(
            f"{path} is from run {summary.get('run_id')!r}, not {run_id!r}: the Spark job did not "
            "write its summary; read the spark-submit task's log"
        )
    return summary
