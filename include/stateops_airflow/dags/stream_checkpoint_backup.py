"""
### stream_checkpoint_backup

Backs up every registered query's checkpoint to S3 on the registry's `backups.schedule`:
exactly the files a restart after the last committed batch needs, as content-addressed objects
(`<backups.url>/<query>/objects/<sha256>`) plus one manifest per backup, written last. Objects
already in the bucket are not uploaded again: the log says how much was uploaded and reused.
It runs while the queries run (files of a committed batch never change; a file that Spark's
maintenance deletes during the copy makes the backup start over on the newest batch).

After each backup, retention keeps the last `backups.keep_last` backups and those younger than
`backups.max_age`, then deletes the objects no kept manifest names: the one step
`stateops.ops.backup.run_backup`, which `stateops backup QUERY` runs too.

The last task, `outcome`, says per query what was backed up, or that it was skipped because it
has no committed batch yet; a run that backed up no query at all fails, saying so, rather than
showing green while no backup exists.

S3 comes from the Airflow connection `backups.conn_id` (type `aws`; `extra.endpoint_url` for an
S3-compatible endpoint). Restore with the DAG `stream_restore` or `stateops restore`.
"""

from __future__ import annotations

from datetime import timedelta

from airflow.sdk import dag

from stateops_airflow.dags import Rendering
from stateops_airflow.tasks import (
    LIFECYCLE_DAG,
    backup_query,
    each_query_then_outcome,
)


def build(r: Rendering):
    """``stream_checkpoint_backup`` for ``r`` (:func:`stateops_airflow.dags.lifecycle_dags`)."""

    @dag(
        **r.dag_args(
            "stream_checkpoint_backup",
            tags=["backup"],
            default_args={"retries": 2, "retry_delay": timedelta(minutes=2)},
        ),
        schedule=r.schedule("backup"),
        **LIFECYCLE_DAG,
        doc_md=__doc__,
    )
    def stream_checkpoint_backup() -> None:
        each_query_then_outcome(
            "backup",
            r.queries(),
            backup_query,
            lambda r: f"backup {r['backup_id']} of batch {r['batch_id']}",
        )

    return stream_checkpoint_backup()
