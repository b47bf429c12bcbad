"""
### stream_source_migration

Moves a registered query to a **new source** (another landing folder, another format, a
Kafka topic on the same or another cluster) and carries its state over, instead of replaying
history. Trigger it with the form; **dry run**
(on by default) runs the preflight only and prints the plan.

1. `preflight`: the query is a processor registered with an `initial_state.from_export`
   section, or a transform (Spark's built-in operators, whose state moves by transplant only:
   `initial_state` is refused for it, and `auto` takes the transplant); for a query with
   several sources (a join), **source that moves** names the one that moves, in a folder of its
   own (the others go on where they were; a cutover time is for one-source queries); the new
   source is valid, its folder exists and has input, every input file there is of its format
   as far as the file's first bytes tell (format `auto`: the format of those files), its
   schema has every column the query reads with the same type (for Parquet, the files' own
   schema too); the old checkpoint has a
   committed batch and verifies clean; a new **Kafka** source's topic exists (a broker that
   does not answer is refused in one line) and still retains where it starts (`new_source_start`:
   the first record stamped at or after the cutover, the topic's end, or its beginning); the
   new checkpoint is new or empty (default:
   `<checkpoint>.v2` beside the old one); no other lifecycle operation holds the query.
2. `approve_stop`: where the query's registry entry asks for it (`approval`; unset, a
   migration asks), the run waits for a second person to approve the plan in the UI's
   required actions or over REST; rejected or unanswered (4 hours), the run fails and nothing
   changed. `stop_query` then **holds** the query: until the run ends, only its own steps take
   the query's lock. A running query is stopped gracefully (its stop marker; the current batch
   commits) and waited for. `drain`: the old source runs to its end with `available-now`,
   or, with a cutover time, reads in one batch exactly the files not read yet and modified
   before it (refused if the query already read a later one). An old **topic** is read to its
   end, and records left unread on it after the drain (its producers did not stop) fail the
   run, naming the partitions.
3. `backup`: the old checkpoint to the registry's `backups.url`; then the road the state takes
   (`carry_over`): **transplant** where the new query can run on the old state files as its
   own (same processor state variables and schemas, time and output mode, state store
   provider and format settings; another partition count is repartitioned by Spark after the
   transplant), else **initial_state**. `auto` (the default)
   takes the transplant where it applies and logs why not where it does not;
   `transplant` fails (and rolls back) where it does not apply. Where the initialState road
   cannot give what the query would have computed on its old source (a processor whose state
   changed, state with a TTL), the preflight says why and refuses unless **accept
   differences** is on.
4. Transplant road: `transplant` copies the old checkpoint's restart set into the new
   checkpoint with offsets that start the new source anew (a new topic at exact offsets per
   partition, written into the checkpoint: Spark would otherwise start it at its beginning,
   whatever `startingOffsets` says; the initialState road's first start passes them as
   `startingOffsets`, which Spark reads on a new checkpoint; a file copy; the old checkpoint is
   only read; a source that does not move keeps its offset and file log); `first_batch` runs
   the query there, from batch N + 1 on the new source (where the partition count changed,
   Spark's repartition first writes batch N + 1, proven, and the query starts at N + 2).
   initialState road: `export` the state at the last committed batch (list state with each
   element's position, and the batch's watermarks), `validate_export` (Great Expectations on
   it), `bootstrap` the query on the new source, into the new checkpoint: its batch 0 reads
   no input, applies the exported state in its order and carries the old watermark, so late
   input and timers on the new source go as on the old one; the new source starts at batch 1.
   Either way, the preflight refuses a new source without input: the proof needs its first
   batch.
5. `prove`: the new checkpoint's state equals what the old query's would have been: the old
   checkpoint's state, loaded as it is, plus the new input at the old query's watermarks,
   batch by batch until the new input's own watermark caught up (rows and checksums per state
   variable, list order included; each batch's watermark; computed by the Spark job), and it
   verifies clean; `validate_new_state`: Great Expectations on the new state.
6. `approve_switch`: as `approve_stop`, with the backup's id and the proof; rejected or
   unanswered, `roll_back` undoes the run. `switch`: the query now runs on the new source and
   checkpoint (recorded beside the data, the registry file is not edited; `stream_start`
   and the CLI follow it); lineage in `<new checkpoint>.audit/lineage.json`; the old
   checkpoint is retired: a hold object `<old checkpoint>.audit/retired.json` that starts
   (this DAG's and `stream_start`'s preflight, `stateops run`) and every lifecycle operation
   refuse until `stateops unretire` lifts it (local files also become read-only); the hold
   is released. Either checkpoint may be in S3 (docs/migration-on-s3.md).

`roll_back` runs when a step fails: the new checkpoint moves aside (`<new>.failed-<run id>`;
in S3, which has no rename, it stays in place under the same kind of hold, `set aside`),
a switch already written is undone, the new checkpoint's output moves to
`<sink>/_rolled_back/migration-<run id>/`, the old checkpoint is writable again and the hold
is released (a preflight that failed before anything changed: `roll_back` is skipped and says
so). The run shows as failed either way: its last step, `migrated` (what the run did and how to
undo it), did not run. The old query can start again;
fix the cause and trigger again. Each step's failure is final (no retries): a failed migration
is rolled back at once.

"""

from __future__ import annotations

from airflow.sdk import Param, dag, get_current_context, task

from stateops.core.steps import MIGRATION_STEPS
from stateops.kinds import SOURCE_FORMATS
from stateops.kinds.kafka import KAFKA
from stateops_airflow.approval import (
    ApprovalGate,
    ask_migration_stop,
    ask_switch,
    renew_hold,
)
from stateops_airflow.dags import Rendering
from stateops_airflow.tasks import (
    LIFECYCLE_DAG,
    TIME_PATTERN,
    carry_over_param,
    carry_over_tasks,
    carry_step_operator,
    dry_run_param,
    inject_fault,
    migration_plan,
    migration_step,
    new_checkpoint_param,
    not_a_dry_run,
    query_param,
    say,
)


def build(r: Rendering):
    """``stream_source_migration`` for ``r`` (:func:`stateops_airflow.dags.lifecycle_dags`)."""
    QUERIES = r.queries()  # by transplant, or initialState where from_export allows

    @dag(
        **r.dag_args(
            "stream_source_migration",
            tags=["migration"],
            default_args={"retries": 0, "post_execute": inject_fault},
        ),
        schedule=None,
        **LIFECYCLE_DAG,
        doc_md=__doc__,
        params={
            "query": query_param(QUERIES, "The registered query to move to the new source."),
            "source": Param(
                None,
                type=["null", "string"],
                title="Source that moves",
                description="Which of the query's sources (by its name in the registry) moves, "
                "e.g. clicks for a join of views and clicks; the others stay where they are. "
                "Empty: the query's only source.",
            ),
            "new_source_format": Param(
                "auto",
                type="string",
                enum=["auto", *SOURCE_FORMATS],
                title="New source: format",
                description="kafka: a topic (fill the Kafka fields below). delta: a Delta "
                "table (fill the folder with the table's path). A file format: the new input's "
                "files (fill the folder). auto: kafka for a topic, delta for a folder that holds "
                "a Delta table, else the format of the files in its folder (Parquet, JSON lines "
                "or CSV, by their first bytes). The preflight refuses files of another format "
                "than this one.",
            ),
            "new_source_path": Param(
                None,
                type=["null", "string"],
                title="New source: folder (file formats) or table (delta)",
                description="For a file source: where the new input lands; for a Delta table: "
                "its path (relative to the registry's data_dir, or absolute). Events after the "
                "cutover belong here. Empty for kafka.",
            ),
            "new_source_topic": Param(
                None,
                type=["null", "string"],
                title="New source: topic (kafka)",
                description="For a kafka source only: the topic the query reads from now on "
                "(the preflight refuses one that does not exist).",
            ),
            "new_source_bootstrap_servers": Param(
                None,
                type=["null", "string"],
                title="New source: bootstrap servers (kafka)",
                description="For a kafka source only: HOST:PORT of the new topic's cluster. "
                "Empty: the kafka_default connection (or the environment).",
            ),
            "new_source_start": Param(
                "cutover",
                type="string",
                enum=list(KAFKA.starts),
                title="New source: start (kafka, delta)",
                description="For a topic or a Delta table: where the new checkpoint starts it, "
                "written into it (a topic's offsets per partition, a table's version): cutover: "
                "the first record stamped (the first version committed) at or after the "
                "cutover time (with cutover drain: the drain's end); earliest: its beginning; "
                "latest: its end. Refused if it no longer holds that start.",
            ),
            "new_source_schema": Param(
                None,
                type=["null", "string"],
                title="New source: schema",
                description="DDL, e.g. 'user_id STRING, page STRING, event_time TIMESTAMP'. Empty: "
                "the query's current schema. It must have every column the query reads.",
            ),
            "new_source_options": Param(
                {},
                type="object",
                title="New source: options",
                description='Reader options, e.g. {"maxFilesPerTrigger": 1}.',
            ),
            "cutover": Param(
                "drain",
                type="string",
                pattern="^drain$|^" + TIME_PATTERN,
                title="Cutover",
                description="drain: the old source is read to its end. Or a past time "
                "(2026-11-21T03:00:00Z; UTC without a zone): an old folder reads only the input "
                "files modified before it (an old topic is read to its end), and a new topic "
                "starts at its offsets; what comes after belongs in the new source.",
            ),
            "new_checkpoint": new_checkpoint_param("Where the query's state goes"),
            "carry_over": carry_over_param(
                "Carry-over road",
                "transplant: copy the old state files (fast; only where the new query "
                "can read them as its own; another partition count is then repartitioned by "
                "Spark). initial_state: export and bootstrap (any change of partitions or schema). "
                "auto: the transplant where it applies, else initial_state.",
            ),
            "accept_differences": Param(
                False,
                type="boolean",
                title="Accept a carry-over that changes results",
                description="Where the initialState road cannot give what the query would have "
                "computed on its old source (a processor whose state changed, state with a TTL), "
                "the preflight refuses and says why; on: migrate anyway.",
            ),
            "dry_run": dry_run_param("Only run the preflight and print the plan."),
        },
    )
    def stream_source_migration() -> None:
        @task
        def preflight() -> dict:
            context = get_current_context()
            return migration_plan(dict(context["params"]), context["run_id"])

        # prove runs after either road.
        stop_query, backup, prove, switch, roll_back, migrated = carry_over_tasks(
            "migrated", prove_rule="none_failed_min_one_success"
        )

        @task.branch
        def carry_over(settled: dict) -> str:
            say(f"carry-over road: {settled['road']}")
            return "transplant" if settled["road"] == "transplant" else "export"

        @task
        def transplant(plan: dict, settled: dict) -> dict:
            return migration_step("transplant", plan, settled)

        drain, first_batch, export, validate_export, bootstrap, validate_new_state = (
            carry_step_operator(MIGRATION_STEPS, step)
            for step in (
                "drain",
                "first_batch",
                "export",
                "validate_export",
                "bootstrap",
                "validate_new_state",
            )
        )
        planned = preflight()
        stopped = stop_query(planned)
        backed_up = backup(planned)
        road = carry_over(backed_up)
        transplanted = transplant(planned, backed_up)
        proven = prove(planned)
        switched = switch(planned, backed_up, proven)
        approve_stop = ApprovalGate(
            task_id="approve_stop",
            operation="migration",
            ask=ask_migration_stop,
            on_reject="nothing changed; the query goes on as it was",
        )
        approve_switch = ApprovalGate(
            task_id="approve_switch",
            operation="migration",
            ask=ask_switch,
            renew=renew_hold,
            on_reject="roll_back moves the new checkpoint aside; the query goes on from its old "
            "source and checkpoint",
        )
        planned >> not_a_dry_run() >> approve_stop >> stopped >> drain >> backed_up >> road
        road >> transplanted >> first_batch >> proven
        road >> export >> validate_export >> bootstrap >> proven
        proven >> validate_new_state >> approve_switch >> switched >> migrated(planned)
        [
            stopped,
            drain,
            backed_up,
            road,
            transplanted,
            first_batch,
            export,
            validate_export,
            bootstrap,
            proven,
            validate_new_state,
            approve_switch,
            switched,
        ] >> roll_back()

    return stream_source_migration()
