"""
### stream_restore

Restores a checkpoint backup made by `stream_checkpoint_backup` (or `stateops backup`). Trigger
it with the form; **dry run** (on by default) only prints the plan.

The plan and the restore are the library's (`stateops.ops.restore`), the same as
`stateops restore QUERY --backup latest|ID`, so both refuse the same things in the same words. Bad
input fails a task in one line, without retries.

1. `plan`: finds the backup (`latest`, or a backup id from `stateops backups list`) under the
   registry's `backups.url`/QUERY, says where it would go and what that folder holds, and
   refuses what the restore must not do: a target that holds **another query's state** (its
   query id is not the backup's) unless **Allow another query's backup** is on (then the plan
   marks it in red), and a non-empty target unless **Replace** is on. A target that already
   holds exactly this backup is reported as restored.
2. `approve`: a restore over a folder that is not empty, of a query whose registry entry says
   `approval: required`, waits for a second person to approve the plan (the UI's required
   actions, or REST); rejected or unanswered (4 hours), the run fails and nothing changed.
   `restore`: restoring over a registered query's checkpoint takes that query's lifecycle lock
   (a run or another operation holding it: refused, naming the holder, and retried once), and
   decides again under it. It downloads into a staging folder beside the target (removing those
   of killed restores), checks every file's sha256, points the state metadata at the new
   location and runs the file-level verifier; only then does it swap it in. The old target is
   moved aside (`<target>.replaced-<time>`), never deleted.
3. `verify_state`: file-level integrity of the query's checkpoint (when that was the target).
"""

from __future__ import annotations

from datetime import timedelta

from airflow.sdk import Param, dag, get_current_context, task

from stateops_airflow.approval import ApprovalGate, ask_restore
from stateops_airflow.dags import Rendering
from stateops_airflow.tasks import (
    LIFECYCLE_DAG,
    dry_run_param,
    not_a_dry_run,
    query_param,
    restore_plan,
    restore_run,
    say,
    verify_state,
)


def build(r: Rendering):
    """``stream_restore`` for ``r`` (:func:`stateops_airflow.dags.lifecycle_dags`)."""
    QUERIES = r.queries()

    @dag(
        **r.dag_args(
            "stream_restore",
            tags=["restore"],
            default_args={"retries": 1, "retry_delay": timedelta(minutes=1)},
        ),
        schedule=None,
        **LIFECYCLE_DAG,
        doc_md=__doc__,
        params={
            "query": query_param(QUERIES, "The registered query whose backups to restore from."),
            "backup_id": Param(
                "latest",
                type="string",
                pattern=r"^(latest|b-\d{6}-\d{8}T\d{6,12}Z)$",
                title="Backup",
                description="latest, or a backup id (b-000118-20261121T141509679767Z).",
            ),
            "target": Param(
                None,
                type=["null", "string"],
                title="Target folder",
                description="Where to restore; empty: the query's own checkpoint.",
            ),
            "replace": Param(
                False,
                type="boolean",
                title="Replace",
                description="Move a non-empty target aside (never deleted) instead of refusing.",
            ),
            "allow_other_query": Param(
                False,
                type="boolean",
                title="Allow another query's backup",
                description="Restore a backup of another query (another query id) over the "
                "target's state instead of refusing; the plan marks it in red.",
            ),
            "dry_run": dry_run_param("Only print the plan."),
        },
    )
    def stream_restore() -> None:
        @task
        def plan() -> dict:
            params = get_current_context()["params"]
            return restore_plan(
                params["query"],
                params["backup_id"],
                params["target"],
                replace=params["replace"],
                allow_other_query=params["allow_other_query"],
                dry_run=params["dry_run"],
            )

        @task
        def restore(plan: dict) -> dict:
            return restore_run(plan, get_current_context()["run_id"])

        @task(task_id="verify_state")
        def verify(plan: dict) -> dict | None:
            if plan["owner"] is None:
                say(f"restored into {plan['target']}; verified by the restore itself")
                return None
            return verify_state(plan["owner"])

        planned = plan()
        restored = restore(planned)
        approve = ApprovalGate(
            task_id="approve",
            operation="restore",
            ask=ask_restore,
            on_reject="nothing changed; the target is as it was",
        )
        planned >> not_a_dry_run() >> approve >> restored >> verify(planned)

    return stream_restore()
