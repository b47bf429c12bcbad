"""spark-submit entry point: Spark's repartition of a prepared checkpoint, and its proof.

    spark-submit stateops/jobs/repartition_state.py --checkpoint PATH|QUERY --run-id RUN
                                                [--registry FILE]

Runs the repartition that ``stateops repartition`` (or the ``stream_repartition`` DAG)
prepared under run id RUN: the count and the batch are in the checkpoint's repartition marker.
Exit codes: 0 repartitioned and proven, 1 the proof failed, 2 bad input (no such prepared
run, a checkpoint that moved on).
"""

from __future__ import annotations

import argparse
import sys

from stateops.ops.jobs import REPARTITION_JOB
from stateops.spark.jobs import job_main


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="repartition_state.py", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--checkpoint", required=True, help="a checkpoint folder or a query name")
    parser.add_argument("--registry", help="where query names are looked up")
    parser.add_argument("--run-id", required=True, help="the prepared repartition's run id")
    return parser.parse_args(argv)


# The CLI and the Airflow operator run it before spark-submit too (preflight_job).
preflight = REPARTITION_JOB.preflight


def main(argv: list[str] | None = None) -> int:
    return job_main(REPARTITION_JOB, parse_args, argv)


if __name__ == "__main__":
    sys.exit(main())
