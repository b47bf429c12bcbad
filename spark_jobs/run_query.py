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
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path

from stateops.audit import append_audit
from stateops.checkpoint import load_checkpoint
from stateops.errors import StateOpsError
from stateops.lock import QueryLock
from stateops.registry import Registry, load_registry


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
    return parser.parse_args(argv)


def checkpoint_state(checkpoint: str) -> tuple[int | None, list[int]]:
    """Last committed batch and planned-but-uncommitted batches; (None, []) for a new query.

    Anything already in the folder goes through the checkpoint model first, so a damaged
    checkpoint is a one-line error here rather than a Spark stack trace.
    """
    path = Path(checkpoint)
    if not path.is_dir() or not any(path.iterdir()):
        return None, []
    cp = load_checkpoint(path)
    return cp.last_committed_batch, cp.uncommitted_batches


def await_run(streaming, marker: Path | None, poll_seconds: float) -> bool:
    """Wait for the query to end, or (continuous mode) for ``marker``; True if it stopped it."""
    while streaming.isActive:
        if marker is not None and marker.exists():
            # Graceful: let the current batch commit before stopping. A trigger may still start
            # in between; the summary then lists that batch as uncommitted.
            while streaming.isActive and streaming.status["isTriggerActive"]:
                time.sleep(0.2)
            streaming.stop()
            marker.unlink(missing_ok=True)
            return True
        streaming.awaitTermination(poll_seconds)
    return False


def run(args: argparse.Namespace, registry: Registry) -> dict:
    from pyspark.errors import AnalysisException, StreamingQueryException

    from stateops.streaming import build_session, progress_summary, start_query

    query = registry.query(args.query)
    run_id = args.run_id or f"run-{uuid.uuid4().hex[:8]}"
    marker = registry.stop_marker(query.name) if args.mode == "continuous" else None
    with QueryLock(registry.lock_path(query.name), query.name, "run", run_id) as lock:
        before, _ = checkpoint_state(query.checkpoint)
        started = time.time()
        if marker is not None and marker.exists():
            print(f"removing a stale stop marker {marker}", file=sys.stderr)
            marker.unlink()
        spark = build_session(query, app_name=f"stateops-run-{query.name}")
        try:
            streaming = start_query(spark, query, available_now=marker is None)
        except AnalysisException as err:
            raise StateOpsError(
                f"query {query.name}: Spark cannot start it: {str(err).splitlines()[0]}"
            ) from err
        stopped_by_marker = False
        try:
            stopped_by_marker = await_run(streaming, marker, args.poll_seconds)
        except StreamingQueryException:
            pass  # recorded below from streaming.exception()
        finally:
            error = streaming.exception()
            progress = streaming.recentProgress
            if streaming.isActive:
                streaming.stop()
        after, uncommitted = checkpoint_state(query.checkpoint)
        summary = {
            "query": query.name,
            "run_id": run_id,
            "mode": args.mode,
            "master": spark.sparkContext.master,
            "status": "failed" if error else "succeeded",
            "error": str(error).splitlines()[0] if error else None,
            "stopped_by_marker": stopped_by_marker,
            "started_at": datetime.fromtimestamp(started, UTC).isoformat(timespec="seconds"),
            "duration_seconds": round(time.time() - started, 1),
            "checkpoint": query.checkpoint,
            "last_committed_batch_before": before,
            "last_committed_batch": after,
            "uncommitted_batches": uncommitted,
            "lock_lost": lock.lost,
            **progress_summary(progress),
        }
        append_audit(
            query.checkpoint,
            "run",
            run_id=run_id,
            result=summary["status"],
            batch_before=before,
            batch_after=after,
            mode=args.mode,
            batches_run=summary["batches_run"],
        )
    return summary


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        registry = load_registry(args.registry)
        summary = run(args, registry)
    except StateOpsError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    path = Path(args.summary) if args.summary else registry.run_summary_path(args.query)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    print(json.dumps(summary))
    return 0 if summary["status"] == "succeeded" else 1


if __name__ == "__main__":
    sys.exit(main())
