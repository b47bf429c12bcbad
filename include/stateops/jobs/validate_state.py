"""spark-submit entry point: data-level integrity of a registered query's state (Great
Expectations), after file-level verification.

    spark-submit stateops/jobs/validate_state.py --query user_sessions [--batch N] [--registry FILE]

Exit codes: 0 every expectation holds, 1 some failed (summary and Data Docs path printed),
2 bad input or a checkpoint that fails file-level verification.
"""

from __future__ import annotations

import argparse
import sys

from stateops.ops.jobs import VALIDATE_JOB
from stateops.spark.jobs import job_main


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="validate_state.py", description=__doc__.splitlines()[0])
    parser.add_argument("--query", required=True)
    parser.add_argument("--batch", type=int, help="a committed batch (default: the last)")
    parser.add_argument("--registry")
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    return parser.parse_args(argv)


# The CLI and the Airflow operator run it before spark-submit too (preflight_job).
preflight = VALIDATE_JOB.preflight


def main(argv: list[str] | None = None) -> int:
    return job_main(VALIDATE_JOB, parse_args, argv)


if __name__ == "__main__":
    sys.exit(main())
