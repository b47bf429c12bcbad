"""What the Spark jobs of ``stateops/jobs/`` do with their parsed arguments, one
:class:`~stateops.spark.jobs.Job` each: the job file holds its arguments and hands them to
:func:`stateops.spark.jobs.job_main`.

A job's ``preflight`` is every refusal that needs no Spark: the job runs it first (it may be
submitted by hand), and the CLI and the Airflow operator run it on the arguments they are
about to submit (:func:`stateops.spark.jobs.preflight_job`), so a refusal costs no JVM.
PySpark is imported only once a job runs.
"""

from __future__ import annotations

import contextlib
import json
import sys
from argparse import Namespace
from datetime import datetime
from typing import Any

from stateops.control.lock import live_lock, new_run_id
from stateops.control.markers import read_repartition
from stateops.control.target import Target, query_target, resolve_target
from stateops.core.access import refuse_unwritable
from stateops.core.checkpoint import load_checkpoint
from stateops.core.errors import StateOpsError
from stateops.core.registry import Query, Registry, checkpoint_of, load_registry
from stateops.core.times import parse_past_time
from stateops.core.verify import format_findings, verify_checkpoint
from stateops.ops.bootstrap import preflight_bootstrap, run_bootstrap
from stateops.ops.repartition import OPERATION as REPARTITION
from stateops.ops.repartition import proof_path
from stateops.ops.start import (
    checkpoint_state,
    refuse_unrunnable,
    run_start,
    write_summary,
)
from stateops.ops.upgrade import refuse_what_a_run_refuses
from stateops.spark.jobs import Job

__all__ = [
    "BOOTSTRAP_JOB",
    "EXPORT_JOB",
    "REPARTITION_JOB",
    "UNDO_SINK_JOB",
    "RUN_QUERY_JOB",
    "VALIDATE_JOB",
]


# -- run_query.py ---------------------------------------------------------------------------
def _run_query_preflight(args: Namespace) -> tuple[Target, datetime | None]:
    """The query and the cutover; every refusal that needs no Spark (run before
    spark-submit too): the registry and query, the query's own code, a topic that does not
    exist or a broker that does not answer, a cutover that is not a real past time, a pending
    rollback, a damaged checkpoint."""
    target = query_target(args.registry, args.query)
    registry, query = target.require_registry(), target.require_query("")
    cutover = None if args.cutover == "drain" else parse_past_time(args.cutover, "cutover")
    refuse_unrunnable(registry, query)  # the checkpoint's own refusals say the most
    checkpoint_state(query.checkpoint)
    refuse_what_a_run_refuses(query)
    return target, cutover


def _run_query(args: Namespace, prepared: tuple[Target, datetime | None]) -> tuple:
    target, cutover = prepared
    summary = run_start(
        target,
        mode=args.mode,
        run_id=args.run_id,
        poll_seconds=args.poll_seconds,
        cutover=cutover,
    )
    return target.require_registry(), summary


def _run_query_report(args: Namespace, ran: tuple[Registry, dict[str, Any]]) -> int:
    registry, summary = ran
    write_summary(registry, summary, args.summary)
    print(json.dumps(summary))
    return 0 if summary["status"] == "succeeded" else 1


RUN_QUERY_JOB = Job(_run_query_preflight, _run_query, _run_query_report)


# -- export_state.py ------------------------------------------------------------------------
def _export_preflight(args: Namespace) -> tuple[str, int]:
    """(checkpoint, batch) to export; refuses without Spark (run before spark-submit too)."""
    from stateops.spark.export import check_export

    checkpoint, _, _ = checkpoint_of(args.checkpoint, args.registry)
    _, batch = check_export(checkpoint, args.out, args.batch)
    return checkpoint, batch


def _export(args: Namespace, prepared: tuple[str, int]) -> dict[str, Any]:
    from stateops.spark.export import export_state
    from stateops.spark.streaming import spark_session

    checkpoint, batch = prepared
    spark = spark_session("stateops-export")
    return export_state(spark, checkpoint, args.out, batch)


def _export_report(args: Namespace, manifest: dict[str, Any]) -> int:
    summary = {k: manifest[k] for k in ("query_id", "batch_id")}
    summary["entries"] = [
        {k: e[k] for k in ("operator_id", "variable", "rows", "checksum")}
        for e in manifest["entries"]
    ]
    print(json.dumps(summary))
    return 0


EXPORT_JOB = Job(_export_preflight, _export, _export_report)


# -- undo_sink.py ---------------------------------------------------------------------------
def _undo_sink_preflight(args: Namespace) -> dict[str, Any]:
    """The plan, of a sink kind whose undo is Spark's work (:mod:`stateops.kinds.delta`)."""
    try:
        plan = json.loads(args.plan)
    except json.JSONDecodeError as err:
        raise StateOpsError(f"--plan is not JSON ({err}): give the rollback's sink plan") from None
    if not isinstance(plan, dict) or plan.get("format") != "delta":
        raise StateOpsError("--plan is not a delta sink's undo plan: give the rollback's one")
    return plan


def _undo_sink(args: Namespace, plan: dict[str, Any]) -> dict[str, Any]:
    from stateops.kinds.delta import restore
    from stateops.spark.streaming import data_url, spark_session

    spark = spark_session("stateops-undo-sink")
    return restore(spark, data_url(spark, plan["path"]), plan, args.run_id)


def _undo_sink_report(args: Namespace, done: dict[str, Any]) -> int:
    print(json.dumps(done))
    return 0


UNDO_SINK_JOB = Job(_undo_sink_preflight, _undo_sink, _undo_sink_report)


# -- validate_state.py ----------------------------------------------------------------------
def _validate_preflight(args: Namespace) -> Query:
    """The query to validate; refuses without Spark (run before spark-submit too) a registry or
    query that is not there, a checkpoint that fails file-level verification, and a batch that
    is not committed."""
    query = load_registry(args.registry).query(args.query)
    files = verify_checkpoint(query.checkpoint)
    if not files["ok"]:
        print(format_findings(files), end="", file=sys.stderr)
        raise StateOpsError(f"{query.checkpoint}: fails file-level verification; see above")
    committed = files["last_committed_batch"]
    if committed is None:
        raise StateOpsError(f"{query.checkpoint}: no committed batch yet: no state to validate")
    if args.batch is not None:
        load_checkpoint(query.checkpoint).restart_files(args.batch)  # committed, files there
    from stateops.spark.expectations import gx_root

    # Great Expectations keeps its context and Data Docs in the audit folder (for a checkpoint
    # in S3, a local copy of the project kept in its audit prefix).
    refuse_unwritable(f"validation of {query.name}", write=[gx_root(query.checkpoint)])
    return query


def _validate(args: Namespace, query: Query) -> dict[str, Any]:
    from stateops.spark.expectations import validate_state
    from stateops.spark.streaming import spark_session

    spark = spark_session(f"stateops-validate-{query.name}")
    return validate_state(spark, query, args.batch)


def _validate_report(args: Namespace, result: dict[str, Any]) -> int:
    from stateops.spark.expectations import format_validation

    print(
        json.dumps(result) if args.json else format_validation(result),
        end="\n" if args.json else "",
    )
    return 0 if result["ok"] else 1


VALIDATE_JOB = Job(_validate_preflight, _validate, _validate_report)


# -- repartition_state.py -------------------------------------------------------------------
def _repartition_preflight(args: Namespace) -> tuple[str, dict]:
    """(checkpoint, marker) of the prepared run; refuses without Spark."""
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


def _repartition(args: Namespace, prepared: tuple[str, dict]) -> dict[str, Any]:
    """Spark's repartition under the query's lease, taken for the run (a driver that outlives
    its Airflow task keeps it, so the run's undo waits: it would delete under the job), unless
    the process that submitted it holds it for this very run (``stateops repartition``)."""
    from stateops.spark.repartition import repartition_and_prove
    from stateops.spark.streaming import spark_session

    checkpoint, marker = prepared
    target = resolve_target(checkpoint, args.registry)
    held = live_lock(target.lock_file)
    ours = held is not None and held.run_id == args.run_id and held.operation == REPARTITION
    with contextlib.nullcontext() if ours else target.lock(REPARTITION, args.run_id):
        spark = spark_session("stateops-repartition")
        proof = proof_path(checkpoint, args.run_id)
        return repartition_and_prove(spark, checkpoint, marker["partitions"], proof)


def _repartition_report(args: Namespace, proof: dict[str, Any]) -> int:
    print(json.dumps({k: proof[k] for k in ("ok", "batch", "partitions", "summary")}))
    return 0 if proof["ok"] else 1


REPARTITION_JOB = Job(_repartition_preflight, _repartition, _repartition_report)


# -- bootstrap_state.py ---------------------------------------------------------------------
def _bootstrap_preflight(args: Namespace) -> tuple[Target, dict[str, Any]]:
    """The query and the bootstrap's plan (:func:`stateops.ops.bootstrap.preflight_bootstrap`)."""
    accept = args.accept_differences == "yes"
    return preflight_bootstrap(
        args.registry, args.query, args.initial_state, args.format, args.carry_over, accept
    )


def _bootstrap(args: Namespace, prepared: tuple[Target, dict[str, Any]]) -> tuple:
    target, plan = prepared
    if args.dry_run:
        return target, {"dry_run": True, **plan}
    run_id = args.run_id or new_run_id("bootstrap")
    log = lambda line: print(line, file=sys.stderr)  # noqa: E731
    return target, run_bootstrap(target, plan, run_id=run_id, log=log)


def _bootstrap_report(args: Namespace, ran: tuple[Target, dict[str, Any]]) -> int:
    target, result = ran
    if not args.dry_run:
        write_summary(target.require_registry(), result)
    print(json.dumps(result))
    return 0 if args.dry_run or result["status"] == "succeeded" else 1


BOOTSTRAP_JOB = Job(_bootstrap_preflight, _bootstrap, _bootstrap_report)
