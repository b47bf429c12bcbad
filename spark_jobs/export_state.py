"""spark-submit entry point: export a checkpoint's state as Parquet plus a manifest.

    spark-submit spark_jobs/export_state.py --checkpoint PATH|QUERY --out DIR [--batch N]

Exit codes: 0 done, 2 bad input (not a checkpoint, uncommitted batch, non-empty DIR).
"""

from __future__ import annotations

import argparse
import json
import sys

from stateops.core.errors import StateOpsError, domain_errors, one_line
from stateops.core.registry import checkpoint_of


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="export_state.py", description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", required=True, help="a checkpoint folder or a query name")
    parser.add_argument("--registry", help="where query names are looked up")
    parser.add_argument("--out", required=True, help="a new or empty folder")
    parser.add_argument("--batch", type=int, help="a committed batch (default: the last)")
    return parser.parse_args(argv)


def preflight(args: argparse.Namespace) -> tuple[str, int]:
    """(checkpoint, batch) to export; refuses without Spark (run before spark-submit too)."""
    from stateops.spark.export import check_export

    checkpoint, _, _ = checkpoint_of(args.checkpoint, args.registry)
    _, batch = check_export(checkpoint, args.out, args.batch)
    return checkpoint, batch


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        with domain_errors():
            checkpoint, batch = preflight(args)
            from stateops.spark.export import export_state
            from stateops.spark.streaming import spark_session

            spark = spark_session("stateops-export")
            manifest = export_state(spark, checkpoint, args.out, batch)
    except StateOpsError as err:
        print(f"error: {one_line(err)}", file=sys.stderr)
        return 2
    summary = {k: manifest[k] for k in ("query_id", "batch_id")}
    summary["entries"] = [
        {k: e[k] for k in ("operator_id", "variable", "rows", "checksum")}
        for e in manifest["entries"]
    ]
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
