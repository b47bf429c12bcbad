"""
### stream_start

Runs every registered streaming query with `available-now` (process everything that has
landed, then stop) on the registry's `start.schedule` (every 30 minutes), one Spark job per
query through `spark-submit` on the `spark_default` connection, then records each job's run
summary (batches run, input rows, last committed batch, state rows per operator) as the
task's return value.

Each job takes its query's lifecycle lock, so a cleanup or rollback of the same query waits
or fails instead of racing it. The queries come from the registry (`registry.yaml`).
"""

from __future__ import annotations

from datetime import timedelta

from airflow.sdk import dag, get_current_context, task

from stateops_airflow.dags import Rendering
from stateops_airflow.tasks import (
    LIFECYCLE_DAG,
    run_query_operator,
    run_summary,
)


def build(r: Rendering):
    """``stream_start`` for ``r`` (:func:`stateops_airflow.dags.lifecycle_dags`)."""

    @dag(
        **r.dag_args(
            "stream_start",
            tags=["start"],
            default_args={"retries": 2, "retry_delay": timedelta(minutes=1)},
        ),
        schedule=r.schedule("start"),
        **LIFECYCLE_DAG,
        doc_md=__doc__,
    )
    def stream_start() -> None:
        # a refused entry's task fails, alone
        for query in r.queries(refused=True):

            @task(task_id=f"record_{query}")
            def record(query: str = query) -> dict:
                return run_summary(query, get_current_context()["run_id"])

            run_query_operator(query) >> record()

    return stream_start()
