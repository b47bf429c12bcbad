"""spark-submit entry point: start a registered query on a new checkpoint with an initial state.

    spark-submit stateops/jobs/bootstrap_state.py --query page_visits --initial-state PATH
        [--format export|checkpoint|parquet|json|csv] [--carry-over auto|transplant|initial_state]
        [--accept-differences] [--dry-run] [--registry FILE] [--run-id ID]

Refuses, before anything starts, a checkpoint with a committed batch (Spark would ignore the
initial state), then validates the initial state (null keys; repeated keys where the registry
says keys are unique). The bootstrap is complete when batch 0 commits; until then every start
of the query passes the initial state again. From another checkpoint, its state files are
transplanted where the query can read them as its own (the first batch, N + 1, is proven),
else it is exported and taken as the initial state (``--carry-over``). Exit codes: 0 done
(complete or pending), 1 the query failed, 2 bad input (nothing changed).
"""

from __future__ import annotations

import argparse
import sys

from stateops.ops.bootstrap import FORMATS
from stateops.ops.jobs import BOOTSTRAP_JOB
from stateops.ops.transplant import ROADS
from stateops.spark.jobs import job_main


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="bootstrap_state.py", description=__doc__.splitlines()[0])
    parser.add_argument("--query", required=True)
    parser.add_argument("--initial-state", required=True, help="a state export or data files")
    parser.add_argument("--format", choices=FORMATS, help="default: export if it has a manifest")
    parser.add_argument("--registry")
    parser.add_argument(
        "--carry-over",
        choices=ROADS,
        default="auto",
        help="from a checkpoint: transplant its state files, or export it",
    )
    parser.add_argument(
        "--accept-differences",
        nargs="?",
        const="yes",
        default="no",
        choices=["yes", "no"],
        help="carry the state over even where the initialState road changes what the query "
        "computes (=no: refuse, the default; a DAG passes its form's choice)",
    )
    parser.add_argument("--run-id")
    parser.add_argument("--dry-run", action="store_true", help="print the plan, change nothing")
    return parser.parse_args(argv)


# The CLI and the Airflow operator run it before spark-submit too (preflight_job).
preflight = BOOTSTRAP_JOB.preflight


def main(argv: list[str] | None = None) -> int:
    return job_main(BOOTSTRAP_JOB, parse_args, argv)


if __name__ == "__main__":
    sys.exit(main())
