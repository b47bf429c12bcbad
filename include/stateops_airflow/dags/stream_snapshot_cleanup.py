"""
### stream_snapshot_cleanup

Cleans every registered query's checkpoint on the registry's `cleanup.schedule`, keeping what
restarts after each of the last `cleanup.retain_batches` committed batches need (so rollback
and backfill can go back that far, and no further). It deletes snapshot groups no retained
restart loads, state versions beyond the last committed batch + 1, RocksDB SST files no kept
`N.zip` refers to, old offsets/commits/source-log/operator-metadata entries, temp files and the
`.crc` sidecars of what it deletes. The log shows the plan first (what goes and what is kept,
per snapshot group), then one result line. Each run leaves an audit record beside the
checkpoint (`stateops audit QUERY`).

It takes the query's lifecycle lock: while the query runs (or another lifecycle operation
holds the lock) the task fails with the holder's name and retries later. A killed cleanup is
finished by the next run. The last task, `outcome`, says per query what was deleted, or that it
was skipped because it has no committed batch yet; a run that cleaned no query at all fails,
saying so. By hand: `stateops cleanup QUERY --dry-run`.
"""

from __future__ import annotations

from datetime import timedelta

from airflow.sdk import dag, get_current_context

from stateops_airflow.dags import Rendering
from stateops_airflow.tasks import (
    LIFECYCLE_DAG,
    cleanup_query,
    each_query_then_outcome,
)


def build(r: Rendering):
    """``stream_snapshot_cleanup`` for ``r`` (:func:`stateops_airflow.dags.lifecycle_dags`)."""

    @dag(
        **r.dag_args(
            "stream_snapshot_cleanup",
            tags=["cleanup"],
            default_args={"retries": 2, "retry_delay": timedelta(minutes=5)},
        ),
        schedule=r.schedule("cleanup"),
        **LIFECYCLE_DAG,
        doc_md=__doc__,
    )
    def stream_snapshot_cleanup() -> None:
        each_query_then_outcome(
            "cleanup",
            r.queries(),
            lambda q: cleanup_query(q, run_id=get_current_context()["run_id"]),
            lambda r: f"deleted {r['delete']['files']} files ({r['delete']['bytes']} bytes)",
        )

    return stream_snapshot_cleanup()
