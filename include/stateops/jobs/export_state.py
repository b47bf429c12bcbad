"""spark-submit entry point: export a checkpoint's state as Parquet plus a manifest.

    spark-submit stateops/jobs/export_state.py --checkpoint PATH|QUERY --out DIR [--batch N]

Exit codes: 0 done, 2 bad input (not a checkpoint, uncommitted batch, non-empty DIR).
"""

from __future__ import annotations

import argparse
import sys

from stateops.ops.jobs import EXPORT_JOB
from stateops.spark.jobs import job_main


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="export_state.py", description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", required=True, help="a checkpoint folder or a query name")
    parser.add_argument("--registry", help="where query names are looked up")
    parser.add_argument("--out", required=True, help="a new or empty folder")
    parser.add_argument("--batch", type=int, help="a committed batch (default: the last)")
    return parser.parse_args(argv)


# The CLI and the Airflow operator run it before spark-submit too (preflight_job).
preflight = EXPORT_JOB.preflight


def main(argv: list[str] | None = None) -> int:
    return job_main(EXPORT_JOB, parse_args, argv)


if __name__ == "__main__":
    sys.exit(main())
