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
from stateops.core.errors import StateOpsError, domain_errors, one_line
from stateops.core.registry import Registry, load_registry
from stateops.ops.bootstrap import FORMATS, plan_bootstrap, prepare_bootstrap, transplant_bootstrap
from stateops.ops.pending import refuse_pending_rollback
from stateops.ops.start import run_registered_query, write_summary
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


def preflight(args: argparse.Namespace) -> tuple[Registry, dict[str, Any]]:
    """The registry and the bootstrap's plan: every refusal that needs no Spark (run before
    spark-submit too): the query, a used checkpoint, the initial state's path, format and
    manifest, the road."""
    registry = load_registry(args.registry)
    plan = plan_bootstrap(registry, args.query, args.initial_state, args.format, args.carry_over,
                          args.accept_differences == "yes")  # fmt: skip
    refuse_pending_rollback(plan["checkpoint"])
    return registry, plan


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        with domain_errors():
            registry, plan = preflight(args)
            if args.dry_run:
                print(json.dumps({"dry_run": True, **plan}))
                return 0
            if plan["road_note"]:
                print(plan["road_note"], file=sys.stderr)
            run_id = args.run_id or new_run_id("bootstrap")
            prepare = None
            if plan["road"] == "transplant":
                transplant_bootstrap(
                    registry, plan, run_id, log=lambda line: print(line, file=sys.stderr)
                )
            else:
                prepare = lambda spark: prepare_bootstrap(spark, registry, plan)  # noqa: E731
            summary = run_registered_query(
                registry, args.query, run_id=run_id, operation="bootstrap", prepare=prepare
            )
    except StateOpsError as err:
        print(f"error: {one_line(err)}", file=sys.stderr)
        return 2
    write_summary(registry, summary)
    print(json.dumps(summary))
    return 0 if summary["status"] == "succeeded" else 1


if __name__ == "__main__":
    sys.exit(main())
