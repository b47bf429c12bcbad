"""spark-submit entry point: a sink's undo that is Spark's work (a Delta table's RESTORE to a
rollback's point and its writer's new application id), as the rollback planned it.

    spark-submit stateops/jobs/undo_sink.py --plan JSON --run-id RUN_ID

The rollback runs it on its own host (:func:`stateops.spark.jobs.run_local_job`). Exit codes:
0 done (or done before), 2 bad input or a table written since the plan (nothing changed).
"""

from __future__ import annotations

import argparse
import sys

from stateops.ops.jobs import UNDO_SINK_JOB
from stateops.spark.jobs import job_main


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="undo_sink.py", description=__doc__.splitlines()[0])
    parser.add_argument("--plan", required=True, help="the sink's undo plan (JSON)")
    parser.add_argument("--run-id", required=True, help="the rollback's run id")
    return parser.parse_args(argv)


# The CLI and the Airflow operator run it before spark-submit too (preflight_job).
preflight = UNDO_SINK_JOB.preflight


def main(argv: list[str] | None = None) -> int:
    return job_main(UNDO_SINK_JOB, parse_args, argv)


if __name__ == "__main__":
    sys.exit(main())
