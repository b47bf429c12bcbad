"""
### stream_restore_drill

A restore drill of every registered query on the registry's `backups.drill_schedule` (weekly by
default): its newest backup restored into a scratch place and its state read by Spark, so that
a backup that would not restore is found on a quiet day, not during an incident.

Per query:

1. `restore_<query>`: the backup restored into `<checkpoint>.drill-<backup id>/checkpoint`,
   beside the query's checkpoint and on the same storage, as `stream_restore` restores: every
   object checked against its sha256, then the checkpoint's file-level verifier. A backup that
   fails (an object damaged or gone since it was taken) is recorded as a failed drill and
   fails the task in one line. No backup yet: skipped.
2. `read_<query>`: the export job reads the restored state with Spark's own state reader:
   every store of every operator.
3. `record_<query>`: the result recorded beside the backup's manifest
   (`<backups.url>/<query>/drills/<backup id>.json`: passed with the rows read per store, or
   why not); the scratch place removed. A failed read fails this task.

The drill touches nothing of the query: not its checkpoint, not its lock (it runs while the
query does). Retention never deletes the newest backup that passed a drill, and a query whose
newest drill failed is a FAIL of the health rule `backup_drill`: stream_health pages for it.
`stateops drill QUERY` runs the same drill by hand. A retried task starts its step over.
"""

from __future__ import annotations

from datetime import timedelta

from airflow.sdk import dag, task

from stateops.core.registry import timetable
from stateops_airflow.dags import Rendering
from stateops_airflow.tasks import (
    LIFECYCLE_DAG,
    drill_read_operator,
    drill_record,
    drill_restore,
)


def build(r: Rendering):
    """``stream_restore_drill`` for ``r`` (:func:`stateops_airflow.dags.lifecycle_dags`)."""
    REGISTRY = r.registry
    SCHEDULE = REGISTRY.backups.drill_schedule

    @dag(
        **r.dag_args(
            "stream_restore_drill",
            tags=["backup"],
            default_args={"retries": 1, "retry_delay": timedelta(minutes=1)},
        ),
        schedule=SCHEDULE and timetable(SCHEDULE),
        **LIFECYCLE_DAG,
        doc_md=__doc__,
    )
    def stream_restore_drill() -> None:
        for query in r.queries():
            plan = task(task_id=f"restore_{query}")(drill_restore)(query)
            record = task(task_id=f"record_{query}", trigger_rule="all_done")(drill_record)(plan)
            plan >> drill_read_operator(query) >> record

    return stream_restore_drill()
