"""
### stream_bootstrap

Starts a registered query on a **new** checkpoint with state you already have (a state export
made by `stateops export`, another checkpoint, or Parquet/JSON/CSV files), instead of
replaying history. From a checkpoint, `carry_over` picks the road: `transplant` copies its
state files (fast; only where the query can read them as its own, see `stateops transplant`),
`initial_state` exports it and takes the export as the initial state, `auto` the transplant
where it applies. A transform (Spark's built-in operators, which take no initial state)
starts from a checkpoint of the same query shape, by transplant only; its first batch is
proven store by store against that checkpoint's state.

Trigger it with the form. **Dry run** (on by default) only prints the plan. Otherwise:

1. `plan`: checks the query, the initial state path and the checkpoint. A checkpoint that already
   has a committed batch is refused: Spark would silently ignore the initial state there.
2. `bootstrap`: validates the initial state (values of the wrong type, null keys, repeated keys
   where the registry says keys are unique, and the processor's own `handleInitialState` on a
   sample, in memory) and starts the query with it. The bootstrap is complete once batch 0
   commits; if the source is still empty it stays *pending*, and every later start of the
   query (`stream_start`) passes the initial state again until batch 0 commits. From a state
   export (or a checkpoint), batch 0 reads no input: it applies the exported state in its
   order and carries the old query's watermark, and the new source starts at batch 1; the job
   then proves the state against the old checkpoint's own (plus the new input at the old
   query's watermarks), batch by batch. From data files, batch 0 must equal the initial state
   plus its input. Rows and checksums per state variable, list order included; a failed proof
   fails the task. Where the initialState road would change what the old query computes, the
   plan refuses unless **accept differences** is on.
3. `record`: the run summary (`bootstrap`: `complete` or `pending`).
4. `verify_state`: file-level integrity of the new checkpoint.
5. `validate_state`: Great Expectations on the state itself (keys, bounds, no expired state);
   a failure lists the failed expectations and the path of the Data Docs.
"""

from __future__ import annotations

from datetime import timedelta

from airflow.sdk import Param, dag, get_current_context, task

from stateops.core.steps import BOOTSTRAP_STATE, INITIAL_STATE_FORMATS, VALIDATE_STATE
from stateops_airflow.dags import Rendering
from stateops_airflow.tasks import (
    LIFECYCLE_DAG,
    bootstrap_plan,
    carry_over_param,
    dry_run_param,
    not_a_dry_run,
    query_param,
    run_summary,
    spark_job_operator,
    verify_state,
)


def build(r: Rendering):
    """``stream_bootstrap`` for ``r`` (:func:`stateops_airflow.dags.lifecycle_dags`)."""
    QUERIES = r.queries(where=lambda q: q.bootstrappable)

    @dag(
        **r.dag_args(
            "stream_bootstrap",
            tags=["bootstrap"],
            default_args={"retries": 1, "retry_delay": timedelta(minutes=1)},
        ),
        schedule=None,
        **LIFECYCLE_DAG,
        doc_md=__doc__,
        params={
            "query": query_param(
                QUERIES,
                "A registered query whose registry entry has an initial_state section, or a "
                "transform (from a checkpoint of the same query shape).",
            ),
            "initial_state": Param(
                "",
                type="string",
                minLength=1,
                title="Initial state",
                description="Path of a state export (folder with manifest.json) or data files.",
            ),
            "format": Param(
                "auto",
                type="string",
                enum=["auto", *INITIAL_STATE_FORMATS],
                title="Format",
                description="auto: a state export if the folder has a manifest, a checkpoint if it "
                "has metadata and offsets/, else by suffix.",
            ),
            "carry_over": carry_over_param(
                "Carry-over road (from a checkpoint)",
                "transplant: copy its state files; initial_state: export it first; "
                "auto: the transplant where it applies.",
            ),
            "accept_differences": Param(
                False,
                type="boolean",
                title="Accept a carry-over that changes results",
                description="From an export or a checkpoint: where the initialState road cannot "
                "give what the old query would have computed (a processor whose state changed, "
                "state with a TTL, an export without list order or watermarks), the plan refuses "
                "and says why; on: bootstrap anyway.",
            ),
            "dry_run": dry_run_param("Only print what the bootstrap would do."),
        },
    )
    def stream_bootstrap() -> None:
        @task
        def plan() -> dict:
            return bootstrap_plan(dict(get_current_context()["params"]))

        bootstrap = spark_job_operator(
            "bootstrap",
            BOOTSTRAP_STATE,
            [
                "--query",
                "{{ params.query }}",
                "--initial-state",
                "{{ ti.xcom_pull(task_ids='plan')['initial_state'] }}",
                "--format",
                "{{ ti.xcom_pull(task_ids='plan')['format'] }}",
                "--carry-over",
                "{{ params.carry_over }}",
                "--accept-differences={{ 'yes' if params.accept_differences else 'no' }}",
                "--run-id",
                "{{ run_id }}",
            ],
        )

        @task
        def record() -> dict:
            context = get_current_context()
            return run_summary(context["params"]["query"], context["run_id"])

        @task(task_id="verify_state")
        def verify() -> dict:
            return verify_state(get_current_context()["params"]["query"])

        validate = spark_job_operator(
            "validate_state", VALIDATE_STATE, ["--query", "{{ params.query }}"]
        )

        plan() >> not_a_dry_run() >> bootstrap >> record() >> verify() >> validate

    return stream_bootstrap()
