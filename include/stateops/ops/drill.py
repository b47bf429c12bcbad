"""Restore drills: a backup restored into a scratch place, its files checked and its state read
by Spark, the result recorded beside the backup (``drills/<backup id>.json``, next to its
manifest). A backup nobody restored is a hope; a drill makes it a fact, on a schedule.

Retention never deletes the newest backup that passed a drill
(:func:`stateops.ops.backup.prune_backups`), and a query whose newest drill failed is a FAIL of
the health rule ``backup_drill`` (:mod:`stateops.status`), which pages.

A drill is three steps, so that the state is read where Spark runs (spark-submit, a cluster
node), and the scratch place is beside the query's checkpoint, on the same storage, so that
every step of it reaches it on a fleet (S3) as on one host:

1. :func:`begin_drill`, no Spark: the backup restored into ``<checkpoint>.drill-<backup
   id>/checkpoint`` as a restore does (every object's sha256, then the checkpoint verifier).
   A backup that fails here is recorded as failed and said in one line.
2. The export job (``stateops/jobs/export_state.py``) reads the restored state with Spark's own
   state reader into ``.../state``: every store of every operator, its rows and checksum.
3. :func:`finish_drill`: the result recorded (the rows read per store, or why the read
   failed), and the scratch place removed.

A drill changes nothing of the query: not its checkpoint, not its lock (it runs while the
query does), not its backups (but their drill records).
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from stateops.core.errors import OperationFailed, StateOpsError, one_line
from stateops.core.s3 import parse_s3_url
from stateops.core.storage import location, remove_all
from stateops.ops.backup import read_manifest, read_manifests, write_drill
from stateops.ops.restore import restore_backup

if TYPE_CHECKING:
    from stateops.control.target import Target

__all__ = ["READ_FIELDS", "begin_drill", "finish_drill"]

# The export job's fields (stateops.core.steps.EXPORT) for a drill's read: the plan's keys.
READ_FIELDS = {"checkpoint": "checkpoint", "out": "state", "batch": "batch_id"}


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def begin_drill(
    target: Target,
    client: Any,
    *,
    backup_id: str = "latest",
    run_id: str | None = None,
    log: Callable[[str], None] = print,
) -> dict[str, Any] | None:
    """Restore backup ``backup_id`` (default the newest) of ``target``'s query into its scratch
    place; the drill's plan: where the restored ``checkpoint`` is, where its ``state`` is to
    be read to, and what the backup is. None: the query has no backup yet, nothing to drill.
    A backup that cannot be restored is recorded as a failed drill and raised
    (OperationFailed, one line)."""
    url = target.backup_location()
    loc = parse_s3_url(url)
    if backup_id == "latest":
        manifests = read_manifests(client, loc)
        if not manifests:
            return None
        manifest = manifests[-1]
    else:
        manifest = read_manifest(client, loc, backup_id)
    scratch = location(f"{str(target.checkpoint).rstrip('/')}.drill-{manifest['backup_id']}")
    plan = {
        "query": target.require_query("").name,
        "url": url,
        "backup_id": manifest["backup_id"],
        "batch_id": manifest["batch_id"],
        "query_id": manifest["query_id"],
        "run_id": run_id,
        "started_at": _now(),
        "scratch": str(scratch),
        "checkpoint": str(scratch / "checkpoint"),
        "state": str(scratch / "state"),
    }
    if scratch.is_dir():  # a drill of this backup that was killed, or is retried: start over
        remove_all(scratch)
    log(
        f"drill of backup {plan['backup_id']} (batch {plan['batch_id']}): restoring into "
        f"{plan['checkpoint']}"
    )
    try:
        restore_backup(f"{url}/{plan['backup_id']}", plan["checkpoint"], client, log=log)
    except StateOpsError as err:
        finish_drill(plan, client, failed=f"the restore failed: {one_line(err)}", log=log)
    return plan


def finish_drill(
    plan: dict[str, Any],
    client: Any,
    *,
    failed: str | None = None,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Record the drill of ``plan`` (from :func:`begin_drill`): passed, with what the export
    read per store (``operator N <variable>``: rows, and their order-independent checksum),
    unless ``failed`` says why not (or the export is not there); then remove the scratch
    place. Returns the record; a failed drill is raised (OperationFailed, one line) once
    recorded."""
    state = None
    if failed is None:
        from stateops.spark.export import read_manifest as read_export

        try:
            exported = read_export(plan["state"])
            state = {
                f"operator {e['operator_id']} {e['variable']}": {
                    "rows": e["rows"],
                    "checksum": e["checksum"],
                }
                for e in exported["entries"]
            }
        except (OSError, ValueError, KeyError, TypeError) as err:
            failed = f"its state was not read: no export at {plan['state']} ({one_line(err)})"
    record = {
        k: plan[k] for k in ("backup_id", "batch_id", "query_id", "query", "run_id", "started_at")
    } | {"drilled_at": _now(), "ok": failed is None, "problem": failed, "state": state}
    write_drill(client, parse_s3_url(plan["url"]), record)
    scratch = location(plan["scratch"])
    if scratch.is_dir():
        remove_all(scratch)
    if failed is not None:
        raise OperationFailed(
            f"backup {plan['backup_id']} of {plan['query']} fails its restore drill: {failed}"
        )
    read = ", ".join(f"{store} {s['rows']} rows" for store, s in state.items())
    log(f"drill of backup {plan['backup_id']}: passed; its state read: {read or 'no state'}")
    return record
