"""
### stream_restore

Restores a checkpoint backup made by `stream_checkpoint_backup` (or `stateops backup`). Trigger
it with the form; **dry run** (on by default) only prints the plan.

1. `plan`: finds the backup (`latest`, or a backup id from `stateops backups list`) under the
   registry's `backups.url`/QUERY and says where it would go and whether that folder is in use.
2. `restore`: downloads into a staging folder beside the target, checks every file's sha256,
   points the state metadata at the new location and runs the file-level verifier; only then
   does it take the target's place. A non-empty target is refused unless **Replace** is on, and
   then it is moved aside (`<target>.replaced-<time>`), never deleted. Restoring over the
   query's own checkpoint takes the query's lifecycle lock, so it cannot race a run.
3. `verify_state`: file-level integrity of the query's checkpoint (when that was the target).
"""

from __future__ import annotations

from datetime import timedelta

from airflow.sdk import Param, dag, get_current_context, task

from stateops_airflow.tasks import (
    LIFECYCLE_DAG,
    dry_run_param,
    not_a_dry_run,
    plan_restore,
    query_param,
    registered_queries,
    restore_query,
    verify_state,
)

QUERIES = registered_queries()


@dag(
    dag_id="stream_restore",
    schedule=None,
    **LIFECYCLE_DAG,
    default_args={"retries": 1, "retry_delay": timedelta(minutes=1)},
    tags=["stateops", "streaming", "restore"],
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
        "dry_run": dry_run_param("Only print the plan."),
    },
)
def stream_restore() -> None:
    @task
    def plan() -> dict:
        params = get_current_context()["params"]
        result = plan_restore(params["query"], params["backup_id"], params["target"])
        b = result["backup"]
        verb = "DRY RUN: would restore" if params["dry_run"] else "restoring"
        print(
            f"{verb} {b['backup_id']} (batch {b['batch_id']}, {b['files']} files, "
            f"{b['bytes']} bytes, {b['created_at']}) into {result['target']}"
        )
        if result["target_in_use"]:
            print(
                "the target is not empty: "
                + ("it will be moved aside" if params["replace"] else "refused without Replace")
            )
        return result

    @task
    def restore(plan: dict) -> dict:
        context = get_current_context()
        return restore_query(plan, context["params"]["replace"], context["run_id"])

    @task(task_id="verify_state")
    def verify(plan: dict) -> dict | None:
        if not plan["is_query_checkpoint"]:
            print(f"restored into {plan['target']}; verified by the restore itself")
            return None
        return verify_state(plan["query"])

    planned = plan()
    restored = restore(planned)
    planned >> not_a_dry_run() >> restored >> verify(planned)


stream_restore()
