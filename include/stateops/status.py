"""A registered query's state health in one read-only look: `stateops status` and the Airflow
"Streaming state" view both show :func:`query_status`.

Everything comes from files the lifecycle operations already write (the checkpoint, its audit
log and validations beside it, the last run's summary) and, for the backups, from the backup
store's manifests. Nothing here writes, takes a lock or starts Spark.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from stateops.control.audit import audit_dir, read_audit
from stateops.core.checkpoint import Checkpoint, load_checkpoint
from stateops.core.errors import StateOpsError
from stateops.core.registry import Registry
from stateops.core.report import checkpoint_report, format_bytes
from stateops.ops.backup import list_backups
from stateops.spark.expectations import data_docs_path, last_validation

__all__ = ["LINEAGE_OPERATIONS", "describe_cleanup", "format_status", "query_status"]

# The operations that change where a query's state came from (shown as its lineage).
LINEAGE_OPERATIONS = ("bootstrap", "migration", "rollback", "restore", "backfill")


def query_status(registry: Registry, name: str, s3_client: Any = None) -> dict[str, Any]:
    """What an operator asks of a query's state. ``s3_client`` lists the backups (None: not
    listed). A part that cannot be read is reported in ``errors`` and left empty; the rest is
    still shown."""
    query = registry.query(name)
    status: dict[str, Any] = {
        "query": name,
        "sources": query.inputs_brief,
        "inputs": query.inputs_text,
        "checkpoint": query.checkpoint,
        "last_committed_batch": None,
        "committed_at": None,
        "operators": [],
        "last_run": None,
        "last_cleanup": None,
        "backups": [],
        "last_validation": None,
        "lineage": [],
        "errors": [],
    }
    if Path(query.checkpoint).exists():
        try:
            _checkpoint_part(status, load_checkpoint(query.checkpoint))
        except StateOpsError as err:
            status["errors"].append(f"checkpoint: {err}")
    summary = registry.run_summary_path(name)
    if summary.exists():
        run = json.loads(summary.read_text())
        status["last_run"] = {k: run.get(k) for k in
                              ("status", "operation", "started_at", "last_committed_batch",
                               "checkpoint", "error")}  # fmt: skip
    records = _history(query.checkpoint)
    cleanups = [r for r in records if r["operation"] == "cleanup"]
    status["last_cleanup"] = cleanups[-1] if cleanups else None
    status["lineage"] = [r for r in records if r["operation"] in LINEAGE_OPERATIONS]
    status["last_validation"] = v = _last_validation(query)
    if v and len(status["operators"]) == 1:  # rows per state variable, read by the validation
        op = status["operators"][0]
        op["state_rows"] = sum(x["rows"] for x in v["variables"].values())
        op["rows_as_of_batch"] = v["batch_id"]
    if s3_client is not None:
        try:
            status["backups"] = list_backups(registry.backups.url_for(name), s3_client)
        except StateOpsError as err:
            status["errors"].append(f"backups: {err}")
    return status


def _checkpoint_part(status: dict[str, Any], cp: Checkpoint) -> None:
    report = checkpoint_report(cp)
    last = report["last_committed_batch"]
    status["last_committed_batch"] = last
    if last is not None:
        mtime = (cp.root / "commits" / str(last)).stat().st_mtime
        status["committed_at"] = datetime.fromtimestamp(mtime, UTC).isoformat(timespec="seconds")
    status["operators"] = [
        {
            "operator_id": op["operator_id"],
            "operator_name": op["operator_name"],
            "partitions": op["num_partitions"],
            "bytes": op["total_bytes"],
            "state_rows": None,
            "rows_as_of_batch": None,
            "snapshot_groups": [
                {
                    "group_id": g["group_id"],
                    "versions": [g["min_version"], g["max_version"]],
                    "bytes": g["bytes"],
                }
                for g in op["snapshot_groups"]
            ],
        }
        for op in report["operators"]
    ]


def _history(checkpoint: str) -> list[dict[str, Any]]:
    """The audit records of this checkpoint and of those it was derived from, oldest first."""
    records: list[dict[str, Any]] = []
    seen: set[str] = set()
    while checkpoint and checkpoint not in seen:
        seen.add(checkpoint)
        own = [dict(r, checkpoint=checkpoint) for r in read_audit(checkpoint)]
        records = own + records
        checkpoint = next((r["derived_from"] for r in own if r.get("derived_from")), None)
    return sorted(records, key=lambda r: r["time"])


def _last_validation(query: Any) -> dict[str, Any] | None:
    last = last_validation(audit_dir(query.checkpoint))
    if last is None:
        return None
    path, result = last
    docs = data_docs_path(query)
    return {
        "batch_id": result["batch_id"],
        "ok": result["ok"],
        "variables": {
            v["variable"]: {"rows": v["rows"], "ok": v["ok"]} for v in result["variables"]
        },
        "file": str(path),
        "data_docs": str(docs) if docs.exists() else None,
    }


def describe_cleanup(c: dict[str, Any] | None) -> str:
    if not c:
        return "never"
    return (f"{c['time']}: {c['result']}, {c.get('deleted_files') or 0} files, "
            f"{format_bytes(c.get('deleted_bytes') or 0)} deleted")  # fmt: skip


def format_status(status: dict[str, Any]) -> str:
    """The readable form `stateops status` prints."""
    s = status
    lines = [f"{s['query']}: {s['inputs']}",
             f"  checkpoint      {s['checkpoint']}"]  # fmt: skip
    last = s["last_committed_batch"]
    committed = "none yet" if last is None else f"batch {last} at {s['committed_at']}"
    lines.append(f"  last committed  {committed}")
    for op in s["operators"]:
        rows = (f"{op['state_rows']} rows (batch {op['rows_as_of_batch']})"
                if op["state_rows"] is not None else "rows unknown")  # fmt: skip
        groups = ", ".join(f"{g['group_id']}: {format_bytes(g['bytes'])}"
                           for g in op["snapshot_groups"])  # fmt: skip
        size = format_bytes(op["bytes"])
        lines.append(f"  operator {op['operator_id']}      {op['operator_name']}, "
                     f"{op['partitions']} partitions, {size}, {rows}")  # fmt: skip
        lines.append(f"    snapshot groups {groups or 'none'}")
    lines.append(f"  last cleanup    {describe_cleanup(s['last_cleanup'])}")
    unlisted = any(e.startswith("backups: ") for e in s["errors"])
    lines.append("  backups         unknown (the error below)" if unlisted else
                 f"  backups         {len(s['backups'])}" + "".join(
        f"\n    {b['backup_id']}  batch {b['batch_id']}  {format_bytes(b['bytes'])}"
        for b in s["backups"]))  # fmt: skip
    v = s["last_validation"]
    lines.append("  last validation " + (
        f"batch {v['batch_id']}: {'passed' if v['ok'] else 'FAILED'} "
        + ", ".join(f"{k} {x['rows']} rows" for k, x in v["variables"].items())
        + (f"; Data Docs {v['data_docs']}" if v["data_docs"] else "")
        if v else "none"))  # fmt: skip
    lines.append("  lineage" + ("         none" if not s["lineage"] else ""))
    lines += [f"    {r['time']}  {r['operation']:<10} {r['result']}  ({r['run_id']})"
              for r in s["lineage"]]  # fmt: skip
    lines += [f"  error: {e}" for e in s["errors"]]
    return "\n".join(lines)
