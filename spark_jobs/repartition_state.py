"""spark-submit entry point: Spark's repartition of a prepared checkpoint, and its proof.

    spark-submit spark_jobs/repartition_state.py --checkpoint PATH|QUERY --run-id RUN
                                                [--registry FILE]

Runs the repartition that ``stateops repartition`` (or the ``stream_repartition`` DAG)
prepared under run id RUN: the count and the batch are in the checkpoint's repartition marker.
Exit codes: 0 repartitioned and proven, 1 the proof failed, 2 bad input (no such prepared
run, a checkpoint that moved on).
"""

from __future__ import annotations

import argparse
import json
import sys

from stateops.core.checkpoint import load_checkpoint
from stateops.core.errors import StateOpsError, domain_errors, one_line
from stateops.core.registry import checkpoint_of


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="repartition_state.py",
                                     description=__doc__.splitlines()[0])  # fmt: skip
    parser.add_argument("--checkpoint", required=True, help="a checkpoint folder or a query name")
    parser.add_argument("--registry", help="where query names are looked up")
    parser.add_argument("--run-id", required=True, help="the prepared repartition's run id")
    return parser.parse_args(argv)


def preflight(args: argparse.Namespace) -> tuple[str, dict]:
    """(checkpoint, marker) of the prepared run; refuses without Spark."""
    from stateops.control.markers import read_repartition

    checkpoint, _, _ = checkpoint_of(args.checkpoint, args.registry)
    marker = read_repartition(checkpoint)
    if marker is None or marker["run_id"] != args.run_id:
        raise StateOpsError(
            f"{checkpoint}: no repartition {args.run_id} is prepared here; run "
            "`stateops repartition` (it prepares, runs this job and finishes)"
        )
    cp = load_checkpoint(checkpoint)
    if cp.last_committed_batch != marker["batch"] - 1 or cp.uncommitted_batches:
        raise StateOpsError(
            f"{checkpoint}: last committed batch {cp.last_committed_batch}, planned "
            f"{cp.uncommitted_batches}: not the checkpoint repartition {args.run_id} prepared "
            f"(batch {marker['batch'] - 1}); run `stateops repartition` again"
        )
    return checkpoint, marker


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        with domain_errors():
            checkpoint, marker = preflight(args)
            from stateops.ops.repartition import proof_path
            from stateops.spark.repartition import repartition_and_prove
            from stateops.spark.streaming import spark_session

            spark = spark_session("stateops-repartition")
            proof = repartition_and_prove(spark, checkpoint, marker["partitions"],
                                          proof_path(checkpoint, args.run_id))  # fmt: skip
    except StateOpsError as err:
        print(f"error: {one_line(err)}", file=sys.stderr)
        return 2
    print(json.dumps({k: proof[k] for k in ("ok", "batch", "partitions", "summary")}))
    return 0 if proof["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
