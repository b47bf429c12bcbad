"""spark-submit entry point: run one registered query, write a run summary.

    spark-submit stateops/jobs/run_query.py --query user_sessions --mode available-now

Modes: ``available-now`` processes everything available, then stops; ``continuous`` runs on the
query's processing-time trigger until a stop marker appears in its control folder
(``stateops stop QUERY``), then stops after the current batch.
Exit codes: 0 done, 1 the query failed, 2 bad input (registry, lock, checkpoint).
"""

from __future__ import annotations

import argparse
import sys

from stateops.ops.jobs import RUN_QUERY_JOB
from stateops.spark.jobs import job_main


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="run_query.py", description=__doc__.splitlines()[0])
    parser.add_argument("--query", required=True, help="name of a registered query")
    parser.add_argument("--mode", choices=["available-now", "continuous"], default="available-now")
    parser.add_argument(
        "--registry", help="registry file (default: STATEOPS_REGISTRY or registry.yaml)"
    )
    parser.add_argument(
        "--run-id", help="caller's run id, recorded in the lock, summary and audit log"
    )
    parser.add_argument("--summary", help="where to write the run summary JSON")
    parser.add_argument("--poll-seconds", type=float, default=1.0, help="stop-marker poll interval")
    parser.add_argument(
        "--cutover",
        default="drain",
        help="drain (default: all input) or a time: read only the input files not read yet and "
        "modified before it, in one batch, then stop (a migration's cutover)",
    )
    return parser.parse_args(argv)


# The CLI and the Airflow operator run it before spark-submit too (preflight_job).
preflight = RUN_QUERY_JOB.preflight


def main(argv: list[str] | None = None) -> int:
    return job_main(RUN_QUERY_JOB, parse_args, argv)


if __name__ == "__main__":
    sys.exit(main())
