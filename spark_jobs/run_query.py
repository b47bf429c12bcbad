"""spark-submit entry point: run one registered query, write a run summary.

    spark-submit spark_jobs/run_query.py --query user_sessions --mode available-now

Modes: ``available-now`` processes everything available, then stops; ``continuous`` runs on the
query's processing-time trigger until a stop marker appears in its control folder
(``stateops stop QUERY``), then stops after the current batch.
Exit codes: 0 done, 1 the query failed, 2 bad input (registry, lock, checkpoint).
"""

from __future__ import annotations

import argparse
import json
import sys
from datetime import datetime

from stateops.core.errors import StateOpsError, domain_errors, one_line
from stateops.core.registry import Registry, load_registry
from stateops.core.times import parse_past_time
from stateops.ops.start import (
    checkpoint_state,
    refuse_unrunnable,
    run_registered_query,
    write_summary,
)
from stateops.spark.streaming import check_code


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


def preflight(args: argparse.Namespace) -> tuple[Registry, datetime | None]:
    """The registry and the cutover; every refusal that needs no Spark (run before
    spark-submit too): the registry and query, the query's own code, a cutover that is not a
    real past time, a pending rollback, a damaged checkpoint."""
    registry = load_registry(args.registry)
    query = registry.query(args.query)
    check_code(registry, query)
    cutover = None if args.cutover == "drain" else parse_past_time(args.cutover, "cutover")
    refuse_unrunnable(registry, query)
    checkpoint_state(query.checkpoint)
    return registry, cutover


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        with domain_errors():
            registry, cutover = preflight(args)
            summary = run_registered_query(
                registry, args.query, mode=args.mode, run_id=args.run_id,
                poll_seconds=args.poll_seconds, cutover=cutover,
            )  # fmt: skip
    except StateOpsError as err:
        print(f"error: {one_line(err)}", file=sys.stderr)
        return 2
    write_summary(registry, summary, args.summary)
    print(json.dumps(summary))
    return 0 if summary["status"] == "succeeded" else 1


if __name__ == "__main__":
    sys.exit(main())
