"""
### stream_backfill

On-call reprocessing of a registered query: roll it back and run the rolled-back batches
again, with the same logic or a changed one. Trigger it by hand with the form; **dry run**
(on by default) only prints the plan.

1. `plan`: the rollback point is the batch you give, **or** the last batch whose input files
   (and every earlier batch's) were modified, or whose Kafka records were stamped, before
   the time you give. Prints the rollback plan (what goes from the checkpoint, which output
   batches are moved aside, the offsets each Kafka source rewinds to) and, with
   **overrides**, writes the registry the reprocessing runs with: the query's entry with the
   overrides merged in (`processor`, `watermark`, `expectations`, `spark_conf`; e.g.
   `{"processor": {"options": {"session_timeout_seconds": 600}}}`), validated first.
   Refused, changing nothing, when the broker no longer holds the records a Kafka source
   would read again, or does not answer. With a **Kafka sink** (at least once: the topic keeps
   what the rolled-back batches wrote, and the reprocessing writes it again) the plan says how
   many records are written again; a run that is not a dry run needs that number in
   **rewrite_output**.
2. `approve`: where the query's registry entry says `approval: required`, the run waits for
   a second person to approve the plan (the UI's required actions, or REST); rejected or
   unanswered (4 hours), the run fails and nothing changed.
   `rollback`: takes a backup to the registry's `backups.url` (through `backups.conn_id`),
   then rolls back under the query's lifecycle lock: the checkpoint's batches after the
   point, every state version and snapshot group written after it, and the file source's log
   entries go; the sink's later `batch_id=K` folders move to `<sink>/_rolled_back/<run id>/`.
3. `reprocess`: the query with `available-now` through `spark-submit`, on the same checkpoint
   and sink (and, with overrides, the new registry).
4. `record`: the Spark job's run summary.
5. `report`: what changed in the output of the reprocessed batches: rows unchanged, added,
   removed, and keys whose rows changed, with examples. The old output stays in
   `_rolled_back/` for comparison. With a Kafka sink: the records the reprocessing wrote against
   those the rolled-back batches had written (the topic keeps both).
6. `verify_state` and `validate_state`: file-level integrity and Great Expectations on the
   state.

If `reprocess` fails, fix the cause and clear that task (not the whole run): the rollback is
done, and the report compares with the output that rollback moved aside.
"""

from __future__ import annotations

from datetime import timedelta

from airflow.sdk import Param, dag, get_current_context, task

from stateops.core.steps import BACKFILL_STEPS, OVERRIDABLE, fill
from stateops_airflow.approval import ApprovalGate, ask_backfill
from stateops_airflow.dags import Rendering
from stateops_airflow.tasks import (
    LIFECYCLE_DAG,
    TIME_PATTERN,
    backfill_plan,
    backfill_report,
    backfill_rollback,
    dry_run_param,
    not_a_dry_run,
    query_param,
    run_summary,
    spark_job_operator,
    verify_state,
)


def build(r: Rendering):
    """``stream_backfill`` for ``r`` (:func:`stateops_airflow.dags.lifecycle_dags`)."""
    QUERIES = r.queries()
    PLANNED_REGISTRY = "{{ ti.xcom_pull(task_ids='plan')['registry'] }}"
    FIELDS = {"query": "{{ params.query }}", "run_id": "{{ run_id }}"}

    def spark_task(step: str):
        """Backfill step ``step`` (stateops.core.steps.BACKFILL_STEPS) on the plan's registry."""
        job, _, args = fill(BACKFILL_STEPS[step], FIELDS)
        return spark_job_operator(step, job, args, registry=PLANNED_REGISTRY)

    @dag(
        **r.dag_args(
            "stream_backfill",
            tags=["backfill"],
            default_args={"retries": 1, "retry_delay": timedelta(minutes=1)},
        ),
        schedule=None,
        **LIFECYCLE_DAG,
        doc_md=__doc__,
        params={
            "query": query_param(QUERIES, "The registered query to roll back and reprocess."),
            "to_batch": Param(
                None,
                type=["null", "integer"],
                minimum=0,
                title="Roll back to batch",
                description="The last batch to keep; every later batch is reprocessed. Leave "
                "empty to give an input time instead.",
            ),
            "input_before": Param(
                None,
                type=["null", "string"],
                pattern="^$|^" + TIME_PATTERN,
                title="... or to the input before",
                description="A time (2026-11-21T03:00:00Z; UTC without a zone): roll back to "
                "the last batch whose input files were all modified (Kafka records: stamped) "
                "before it.",
            ),
            "overrides": Param(
                {},
                type="object",
                propertyNames={"enum": list(OVERRIDABLE)},
                title="Registry overrides",
                description="Merged into the query's registry entry for the reprocessing, e.g. "
                '{"processor": {"options": {"session_timeout_seconds": 600}}}.',
            ),
            "rewrite_output": Param(
                None,
                type=["null", "integer"],
                minimum=0,
                title="Kafka sink: records written again",
                description="For a query with a Kafka sink (at least once): the number of records "
                "the plan says the reprocessing writes again (the rolled-back batches' output, "
                "which the topic keeps). A run that is not a dry run is refused until it matches.",
            ),
            "dry_run": dry_run_param("Only print the plan."),
        },
    )
    def stream_backfill() -> None:
        @task
        def plan() -> dict:
            context = get_current_context()
            return backfill_plan(dict(context["params"]), context["run_id"])

        @task
        def rollback(plan: dict) -> dict:
            return backfill_rollback(plan)

        reprocess = spark_task("reprocess")

        @task
        def record(plan: dict) -> dict:
            return run_summary(plan["query"], get_current_context()["run_id"], plan["registry"])

        @task
        def report(plan: dict, rollback: dict) -> dict:
            return backfill_report(plan, rollback)

        @task(task_id="verify_state")
        def verify() -> dict:
            return verify_state(get_current_context()["params"]["query"])

        validate = spark_task("validate_state")

        planned = plan()
        rolled = rollback(planned)
        reported = report(planned, rolled)
        approve = ApprovalGate(
            task_id="approve",
            operation="backfill",
            ask=ask_backfill,
            on_reject="nothing changed; the query goes on as it was",
        )
        planned >> not_a_dry_run() >> approve >> rolled >> reprocess >> record(planned) >> reported
        reported >> verify() >> validate

    return stream_backfill()
