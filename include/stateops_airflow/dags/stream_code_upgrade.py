"""
### stream_code_upgrade

Deploys a query's **new code** (processor, key, output, in its registry entry) without losing
its state: the code is checked against the state in the query's checkpoint and, where Spark
cannot keep that state (it would refuse the restart, or drop state the registry's
`initial_state.mapping` keeps), the state is rewritten for the new code into a new checkpoint,
proven and switched to. Trigger it with the form; **dry run** (on by default) runs the preflight
only and prints the plan. The **Streaming state** view marks a query whose deployed code does
not fit its checkpoint FAIL (a rewrite is needed) or WARN (Spark would drop state), with the
change: run this DAG for it. docs/code-upgrades.md has the table of changes.

1. `preflight`: the check, one line per operator, state variable and key: **unchanged**,
   **Spark evolves it** (the rule and the setting it needs; a variable the new code no longer
   declares is dropped by Spark) or **needs a state rewrite** (why Spark would refuse it);
   then the steps below. Nothing is stopped yet. Where nothing needs a rewrite, the plan says
   so and the run ends there (no stop, no approval): start the query with `stream_start`.
   A rewrite needs the new code to be a processor (`transformWithStateInPandas`) and
   `initial_state.mapping` (or `from_export`) in the registry: the preflight refuses it in
   one line otherwise; also a checkpoint with no committed batch or that fails verification,
   a new checkpoint that is not new or empty (default `<checkpoint>.v2`), and another
   lifecycle operation holding the query.
2. `approve_stop`: where the query's registry entry asks for it (`approval`; unset, an upgrade
   asks), a second person approves the plan in the UI's required actions or over REST;
   rejected or unanswered (4 hours), the run fails and nothing changed. `stop_query` then
   **holds** the query (only this run's steps take its lock until it ends) and stops a running
   query gracefully after its current batch.
3. `backup`: the old checkpoint to the registry's `backups.url`.
4. `export`: its state at the last committed batch; `rewrite`: the registry's mapping over the
   export, checked against `initial_state.schema`, bootstraps the new checkpoint with the new
   code: its batch 0 reads no input and takes the old query's watermark and source positions,
   so the new code goes on with the input the old query had not read, and nothing is read
   twice.
5. `prove`: the new state, variable by variable (rows and checksums), equals the new
   processor's `handleInitialState` over the mapping's rows, and the new checkpoint verifies
   clean; `validate_new_state`: Great Expectations on it.
6. `approve_switch`: as `approve_stop`, with the backup's id and the proof; rejected or
   unanswered, `roll_back` undoes the run. `switch`: the query runs its new code on the new
   checkpoint (recorded beside the data; `stream_start` and the CLI follow it); lineage in
   `<new checkpoint>.audit/lineage.json`; the old checkpoint is retired (kept, read-only,
   refused by every start until `stateops unretire`). `upgraded` says what the run did and how
   to undo it.

`roll_back` runs when a step fails: the new checkpoint moves aside
(`<new>.failed-<run id>`), a switch already written is undone, the new checkpoint's output
moves to `<sink>/_rolled_back/migration-<run id>/`, the hold is released: the old checkpoint is
byte for byte as it was and the **old** code runs on it as before (put the old code back in the
registry until the cause is fixed). The run shows as failed either way, since `upgraded` did
not run. No step retries. To rehearse a failure: `STATEOPS_FAIL_AFTER=<task id>` in the
workers' environment fails that task after its work. The CLI does the same in one process:
`stateops upgrade QUERY [--dry-run]`.
"""

from __future__ import annotations

from airflow.sdk import dag, get_current_context, task

from stateops.core.steps import UPGRADE_STEPS
from stateops_airflow.approval import ApprovalGate, ask_switch, ask_upgrade_stop, renew_hold
from stateops_airflow.dags import Rendering
from stateops_airflow.tasks import (
    LIFECYCLE_DAG,
    carry_over_tasks,
    carry_step_operator,
    dry_run_param,
    inject_fault,
    new_checkpoint_param,
    not_a_dry_run,
    query_param,
    upgrade_needless,
    upgrade_plan,
)


def build(r: Rendering):
    """``stream_code_upgrade`` for ``r`` (:func:`stateops_airflow.dags.lifecycle_dags`)."""
    # A rewrite bootstraps the new code's processor: a transform takes no initial state.
    QUERIES = r.queries(where=lambda q: q.processor is not None)

    @dag(
        **r.dag_args(
            "stream_code_upgrade",
            tags=["upgrade"],
            default_args={"retries": 0, "post_execute": inject_fault},
        ),
        schedule=None,
        **LIFECYCLE_DAG,
        doc_md=__doc__,
        params={
            "query": query_param(
                QUERIES, "The registered query whose registry entry now holds its new code."
            ),
            "new_checkpoint": new_checkpoint_param("Where the rewritten state goes"),
            "dry_run": dry_run_param(
                "Only run the preflight: print every change the check finds and the steps."
            ),
        },
    )
    def stream_code_upgrade() -> None:
        @task
        def preflight() -> dict:
            context = get_current_context()
            return upgrade_plan(dict(context["params"]), context["run_id"])

        stop_query, backup, prove, switch, roll_back, upgraded = carry_over_tasks("upgraded")
        export, rewrite, validate_new_state = (
            carry_step_operator(UPGRADE_STEPS, step)
            for step in ("export", "rewrite", "validate_new_state")
        )
        planned = preflight()
        stopped = stop_query(planned)
        backed_up = backup(planned)
        proven = prove(planned)
        switched = switch(planned, backed_up, proven)
        approve_stop = ApprovalGate(
            task_id="approve_stop",
            operation="upgrade",
            ask=ask_upgrade_stop,
            on_reject="nothing changed; the query goes on as it was (put its old code back in the "
            "registry to start it)",
        )
        approve_switch = ApprovalGate(
            task_id="approve_switch",
            operation="upgrade",
            ask=ask_switch,
            renew=renew_hold,
            on_reject="roll_back moves the new checkpoint aside; the query goes on from its old "
            "checkpoint, with its old code",
        )
        planned >> not_a_dry_run(upgrade_needless) >> approve_stop >> stopped >> backed_up
        backed_up >> export >> rewrite >> proven >> validate_new_state >> approve_switch
        approve_switch >> switched >> upgraded(planned)
        [
            stopped,
            backed_up,
            export,
            rewrite,
            proven,
            validate_new_state,
            approve_switch,
            switched,
        ] >> roll_back()

    return stream_code_upgrade()
