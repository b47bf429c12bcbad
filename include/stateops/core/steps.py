"""What the DAG files wire, with nothing behind it: each operation's Spark steps and the
choices the trigger forms and the CLI offer.

A leaf module (it imports nothing of the project): the DAG files read it at parse time, which
then pays for wiring only (benchmarks/bench_dag_parse.py), and the operations that run the
steps (:mod:`stateops.ops.migration`, :mod:`stateops.ops.backfill`) take them from here,
so a DAG and the CLI run the same jobs with the same arguments.

A step is ``(job file, registry, arguments)``: the registry is ``old`` (the user's) or
``new`` (the one the operation derives: a migration's new source and checkpoint, a backfill's
overrides), which whoever runs the step passes as ``--registry``, and the arguments' fields in
braces are the run's values, which a DAG fills with templates and the one-process runner and
the CLI with values (:func:`fill`). A flag followed by a field alone (``"--batch", "{batch}"``)
is optional: a field that is None or False leaves both out, True the flag alone.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

__all__ = [
    "safe_run_id",
    "BACKFILL_STEPS",
    "BOOTSTRAP",
    "BOOTSTRAP_STATE",
    "EXPORT",
    "EXPORT_STATE",
    "INITIAL_STATE_FORMATS",
    "MIGRATION_STEPS",
    "OVERRIDABLE",
    "REPARTITION",
    "REPARTITION_STATE",
    "ROADS",
    "RUN",
    "RUN_QUERY",
    "UPGRADE_STEPS",
    "VALIDATE",
    "VALIDATE_STATE",
    "fill",
]

Step = tuple[str, str, list[str]]

# The Spark jobs (files of stateops/jobs/, stateops.spark.jobs.job_path finds them).
RUN_QUERY = "run_query.py"
EXPORT_STATE = "export_state.py"
BOOTSTRAP_STATE = "bootstrap_state.py"
VALIDATE_STATE = "validate_state.py"
REPARTITION_STATE = "repartition_state.py"

# Each job on its own, as the CLI (and stream_start) runs it.
RUN: Step = (RUN_QUERY, "old", ["--query", "{query}", "--mode", "{mode}", "--run-id", "{run_id}"])
EXPORT: Step = (
    EXPORT_STATE,
    "old",
    ["--checkpoint", "{checkpoint}", "--out", "{out}", "--batch", "{batch}"],
)
VALIDATE: Step = (VALIDATE_STATE, "old", ["--query", "{query}", "--json", "{json}"])
BOOTSTRAP: Step = (
    BOOTSTRAP_STATE,
    "old",
    ["--query", "{query}", "--initial-state", "{initial_state}", "--format", "{format}"]
    + ["--carry-over", "{carry_over}", "--accept-differences", "{accept}"],
)
REPARTITION: Step = (
    REPARTITION_STATE,
    "old",
    ["--checkpoint", "{checkpoint}", "--run-id", "{run_id}"],
)

# Available-now runs of the query (its own run id: the summary it writes names it).
_RUN = ["--query", "{query}", "--mode", "available-now", "--run-id", "{run_id}"]

MIGRATION_STEPS: dict[str, Step] = {
    "drain": (RUN_QUERY, "old", [*_RUN, "--cutover", "{cutover}"]),
    "first_batch": (RUN_QUERY, "new", _RUN),
    "export": (
        EXPORT_STATE,
        "old",
        [
            "--checkpoint",
            "{old_checkpoint}",
            "--out",
            "{export}",
            "--batch",
            "{last_committed_batch}",
        ],
    ),
    "validate_export": (VALIDATE_STATE, "old", ["--query", "{query}"]),
    "bootstrap": (
        BOOTSTRAP_STATE,
        "new",
        [
            "--query",
            "{query}",
            "--initial-state",
            "{export}",
            "--format",
            "export",
            "--run-id",
            "{run_id}",
            "--accept-differences={accept}",
        ],
    ),
    "validate_new_state": (VALIDATE_STATE, "new", ["--query", "{query}"]),
}

# A code upgrade's rewrite (stateops.ops.upgrade): the migration's initialState road with the
# query's own sources, the registry's initial_state.mapping over the export.
UPGRADE_STEPS: dict[str, Step] = {
    "export": MIGRATION_STEPS["export"],
    "rewrite": MIGRATION_STEPS["bootstrap"],  # with accept: yes (the upgrade is the change)
    "validate_new_state": MIGRATION_STEPS["validate_new_state"],
}

BACKFILL_STEPS: dict[str, Step] = {
    "reprocess": (RUN_QUERY, "new", _RUN),
    "validate_state": (VALIDATE_STATE, "new", ["--query", "{query}"]),
}

# What a bootstrap reads its initial state from.
INITIAL_STATE_FORMATS = ("export", "checkpoint", "parquet", "json", "csv")
# How a carry-over takes the state to a new checkpoint (stateops.ops.transplant.choose_road).
ROADS = ("auto", "transplant", "initial_state")
# What a backfill may change about a query: its logic and checks, never where its data is.
OVERRIDABLE = ("processor", "transform", "watermark", "expectations", "spark_conf")


_FIELD = re.compile(r"\{\w+\}")


def fill(step: Step, fields: Mapping[str, Any]) -> Step:
    """``step`` with the fields of its arguments filled in; an optional flag (a flag followed
    by a field alone) is left out where its field is None or False, alone where it is True."""
    job, registry, template = step
    args: list[str] = []
    for arg in template:
        value = fields[arg[1:-1]] if _FIELD.fullmatch(arg) else arg.format_map(fields)
        if value is None or value is False:
            args.pop()  # its flag
        elif value is not True:
            args.append(str(value))
    return job, registry, args


def safe_run_id(run_id: str) -> str:
    """A run id usable as a file name (Airflow's contain ``:`` and ``+``)."""
    return re.sub(r"[^\w.-]", "_", run_id)
