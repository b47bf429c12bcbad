"""
### stream_repartition

Changes the number of **state partitions** of a stopped query, keeping its state: Spark fixes
the count at a checkpoint's first batch, and this is the way to change it without throwing
the state away (to scale a query out, or to stop paying for hundreds of tiny partitions).
Trigger it with the form; **dry run** (on by default) only prints the plan. The same as
`stateops repartition QUERY --partitions N`.

1. `plan`: refuses, changing nothing: a count that is not from 1 to 10,000 or is the one the
   state has; a checkpoint without a committed batch, with a planned batch not committed, or
   failing verification; an operator Spark's repartition does not take; state in the
   HDFS-backed store (Spark repartitions RocksDB state only: the refusal says how to replay
   the source into a new RocksDB checkpoint instead); checkpoint format v2.
2. `approve`: where the query's registry entry says `approval: required`, the run waits for
   a second person to approve the plan (the UI's required actions, or REST); rejected or
   unanswered (4 hours), the run fails and nothing changed.
   `prepare`: under the query's lock (a running query holds it: refused, naming the holder),
   plans again, backs up the checkpoint to the registry's `backups.url`, and marks the run
   (`<checkpoint>.audit/repartition.json`, with every file it holds): until the run ends the
   query does not start.
3. `repartition`: Spark's own repartition (`stateops/jobs/repartition_state.py`): a new batch
   N + 1 that reads no input and holds the state of batch N in the new number of
   partitions; then its proof, per operator and store: the same rows and order-independent
   checksum as batch N, every row in the partition its partitioning key hashes to (the
   grouping key: without a session window's start or a join value's index), the count in the
   offsets log (and the operator metadata, where Spark keeps it per batch).
4. `finish`: the checkpoint verifies clean and the proof holds; the registry's
   `shuffle_partitions` follows (recorded beside the data, the file is not edited), the
   audit log has the run.
5. `verify_state`: file-level integrity of the checkpoint.

`roll_back` runs when a step after `prepare` failed: it deletes what the repartition added (it
only adds files) and checks that the checkpoint is file for file what it was (with nothing
to undo it is skipped and says so); the run fails either way, since `verify_state` did not
run. To go back later: `stream_backfill` or `stateops rollback QUERY --to-batch N` to the
batch before the repartition restores the old count.
"""

from __future__ import annotations

from airflow.sdk import Param, dag, get_current_context, task
from airflow.sdk.exceptions import AirflowSkipException

from stateops.core.steps import REPARTITION_STATE
from stateops_airflow.approval import ApprovalGate, approved, ask_repartition
from stateops_airflow.dags import Rendering
from stateops_airflow.tasks import (
    LIFECYCLE_DAG,
    dry_run_param,
    not_a_dry_run,
    query_param,
    repartition_finish,
    repartition_plan,
    repartition_prepare,
    repartition_undo,
    spark_job_operator,
    verify_state,
)


def build(r: Rendering):
    """``stream_repartition`` for ``r`` (:func:`stateops_airflow.dags.lifecycle_dags`)."""
    QUERIES = r.queries()

    @dag(
        **r.dag_args(
            "stream_repartition",
            tags=["repartition"],
            # a failed step is undone at once, never retried half-done
            default_args={"retries": 0},
        ),
        schedule=None,
        **LIFECYCLE_DAG,
        doc_md=__doc__,
        params={
            "query": query_param(QUERIES, "The registered query to repartition (stopped)."),
            "partitions": Param(
                8,
                type="integer",
                minimum=1,
                maximum=10_000,
                title="State partitions",
                description="The new number of state partitions (spark.sql.shuffle.partitions).",
            ),
            "dry_run": dry_run_param("Only print the plan."),
        },
    )
    def stream_repartition() -> None:
        @task
        def plan() -> dict:
            params = get_current_context()["params"]
            return repartition_plan(params["query"], params["partitions"], params["dry_run"])

        @task
        def prepare() -> dict:
            context = get_current_context()
            params = context["params"]
            return repartition_prepare(params["query"], params["partitions"], context["run_id"])

        @task
        def finish() -> dict:
            context = get_current_context()
            return repartition_finish(context["params"]["query"], context["run_id"])

        @task(task_id="verify_state")
        def verify() -> dict:
            return verify_state(get_current_context()["params"]["query"])

        @task(trigger_rule="one_failed")
        def roll_back() -> None:
            """Runs only when a step failed; undoes the run (skipped when nothing changed); the
            run fails either way, since verify_state does not run."""
            context = get_current_context()
            if not approved(context, "approve"):
                raise AirflowSkipException(
                    "the repartition was not approved (approve says why) before anything changed: "
                    "nothing to undo"
                )
            repartition_undo(context["params"]["query"], context["run_id"])

        repartition = spark_job_operator(
            "repartition",
            REPARTITION_STATE,
            ["--checkpoint", "{{ params.query }}", "--run-id", "{{ run_id }}"],
        )
        prepared, finished = prepare(), finish()
        approve = ApprovalGate(
            task_id="approve",
            operation="repartition",
            ask=ask_repartition,
            on_reject="nothing changed; the checkpoint is as it was",
        )
        plan() >> not_a_dry_run() >> approve >> prepared >> repartition >> finished >> verify()
        [repartition, finished] >> roll_back()

    return stream_repartition()
