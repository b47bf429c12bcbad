"""spark-submit entry point: start a registered query on a new checkpoint with an initial state.

    spark-submit spark_jobs/bootstrap_state.py --query page_visits --initial-state PATH
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
import json
import sys
from typing import Any

from stateops.control.lock import new_run_id
from stateops.control.target import Target
from stateops.core.errors import StateOpsError, domain_errors, one_line
from stateops.ops.bootstrap import FORMATS, preflight_bootstrap, run_bootstrap
from stateops.ops.start import write_summary
from stateops.ops.transplant import ROADS


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="bootstrap_state.py", description=__doc__.splitlines()[0])
    parser.add_argument("--query", required=True)
    parser.add_argument("--initial-state", required=True, help="a state export or data files")
    parser.add_argument("--format", choices=FORMATS, help="default: export if it has a manifest")
    parser.add_argument("--registry")
    parser.add_argument(
        "--carry-over", choices=ROADS, default="auto",
        help="from a checkpoint: transplant its state files, or export it",
    )  # fmt: skip
    parser.add_argument(
        "--accept-differences", nargs="?", const="yes", default="no", choices=["yes", "no"],
        help="carry the state over even where the initialState road changes what the query "
        "computes (=no: refuse, the default; a DAG passes its form's choice)",
    )  # fmt: skip
    parser.add_argument("--run-id")
    parser.add_argument("--dry-run", action="store_true", help="print the plan, change nothing")
    return parser.parse_args(argv)


def preflight(args: argparse.Namespace) -> tuple[Target, dict[str, Any]]:
    """The query and the bootstrap's plan (:func:`stateops.ops.bootstrap.preflight_bootstrap`)."""
    return preflight_bootstrap(
        args.registry,
        args.query,
        args.initial_state,
        args.format,
        args.carry_over,
        args.accept_differences == "yes",
    )


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        with domain_errors():
            target, plan = preflight(args)
            if args.dry_run:
                print(json.dumps({"dry_run": True, **plan}))
                return 0
            run_id = args.run_id or new_run_id("bootstrap")
            log = lambda line: print(line, file=sys.stderr)  # noqa: E731
            summary = run_bootstrap(target, plan, run_id=run_id, log=log)
    except StateOpsError as err:
        print(f"error: {one_line(err)}", file=sys.stderr)
        return 2
    write_summary(target.require_registry(), summary)
    print(json.dumps(summary))
    return 0 if summary["status"] == "succeeded" else 1


if __name__ == "__main__":
    sys.exit(main())
