"""Snapshot-group cleanup: keep what restarts after the last K committed batches need, delete
the rest (the categories: :mod:`stateops.ops.deletion`). Safe to kill at any point: the next
run plans again from what is left and finishes the job.
"""

from __future__ import annotations

import bisect
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from stateops.core.checkpoint import Checkpoint, load_checkpoint
from stateops.core.errors import CheckpointError, StateOpsError, one_line
from stateops.core.report import format_bytes, group_id
from stateops.ops.deletion import (
    audit_plan,
    deletion_plan,
    execute_plan,
    format_plan,
    refuse_gaps,
    refuse_unwritable_plan,
    restart_set,
)
from stateops.ops.pending import refuse_pending_rollback

if TYPE_CHECKING:
    from stateops.control.target import Target

__all__ = [
    "latest_backup",
    "plan_cleanup",
    "run_cleanup",
]


def _retain_batches(target: Target, given: int | None = None) -> int:
    """``given``, else the registry's ``cleanup.retain_batches``; else a one-line refusal."""
    if given is not None:
        return given
    if target.registry is None:
        raise StateOpsError(
            f"{target.checkpoint}: no readable registry sets cleanup.retain_batches; give "
            "--retain-batches K"
        )
    return target.registry.cleanup.retain_batches


def plan_cleanup(target: Target, retain_batches: int | None = None) -> dict[str, Any]:
    """What cleanup deletes so that restarts after the last ``retain_batches`` batches work
    (default: the registry's ``cleanup.retain_batches``). ``groups`` lists each store's
    snapshot groups, with the checkpoint-wide group id that `inspect` shows (by the query's
    ``min_deltas_for_snapshot``: Spark's default, 10, for an unregistered checkpoint)."""
    retain_batches = _retain_batches(target, retain_batches)
    if retain_batches < 1:
        raise StateOpsError(f"--retain-batches must be at least 1, got {retain_batches}")
    cp = load_checkpoint(target.checkpoint)
    refuse_pending_rollback(cp.root)
    refuse_gaps(cp)
    committed = sorted(cp.commits)
    if not committed:
        raise CheckpointError(f"{cp.root}: no committed batch yet: nothing to clean")
    retained = committed[-retain_batches:]
    keep: set[str] = set()
    for b in retained:
        keep.update(restart_set(cp, b, "retain fewer batches (--retain-batches)"))
    delete, groups = _store_deletions(cp, keep, retained, target.min_deltas_for_snapshot)
    delete.update(_log_deletions(cp, keep, oldest=retained[0]))
    return deletion_plan(
        cp,
        "cleanup",
        delete,
        keep,
        retain_batches=retain_batches,
        retained=[retained[0], retained[-1]],
        groups=groups,
    )


def _store_deletions(
    cp: Checkpoint, keep: set[str], retained: list[int], min_deltas_for_snapshot: int
) -> tuple[dict[str, str], list[dict[str, Any]]]:
    """The state files no retained restart needs (why each goes), and every store's snapshot
    groups with what happens to them."""
    last = retained[-1]  # the last committed batch
    delete: dict[str, str] = {}
    groups = []
    for op in cp.operators:
        for store in op.stores:
            view = cp.committed_view(store, keep)  # format v2: the files of committed ids
            bases = sorted({0, *view.snapshots})
            needed = {
                bases[bisect.bisect_right(bases, b + 1) - 1]
                for b in retained
                if cp.reads_store(store, b)  # one a repartition left behind is not read
            }
            in_view = {rel for v in view.versions for rel in view.version_files(v)}
            for v in [v for v in store.versions if v <= last + 1]:
                delete.update(
                    {
                        rel: "orphan-attempt"
                        for rel in store.version_files(v)
                        if rel not in in_view and rel not in keep
                    }
                )
            for g in view.snapshot_groups(cp.sizes):
                action = "keep" if g.snapshot_version in needed else "delete"
                if action == "delete":
                    delete.update(dict.fromkeys(g.files, "snapshot-group"))
                groups.append(
                    {
                        "operator": op.operator_id,
                        "partition": store.partition,
                        "store": store.store_name,
                        "base": g.snapshot_version,
                        "group_id": group_id(g.snapshot_version, min_deltas_for_snapshot),
                        "versions": [g.versions[0], g.versions[-1]],
                        "files": len(g.files),
                        "bytes": g.bytes,
                        "action": action,
                    }
                )
            for v in [v for v in store.versions if v > last + 1]:
                delete.update(dict.fromkeys(store.version_files(v), "orphan-version"))
    return delete, groups


def _log_deletions(cp: Checkpoint, keep: set[str], oldest: int) -> dict[str, str]:
    """The log entries, operator metadata and schema files older than the oldest retained
    batch that no retained restart reads."""
    delete: dict[str, str] = {}
    # A restart after batch N reads offsets N and N - 1, and commits N.
    for log, batches, below in (
        ("offsets", cp.offsets, oldest - 1),
        ("commits", cp.commits, oldest),
    ):
        delete.update({f"{log}/{b}": "old-log" for b in batches if b < below})
    for log in cp.sources.values():
        first_kept = min((i for i, rel in log.items() if rel in keep), default=None)
        if first_kept is not None:
            delete.update({rel: "old-log" for i, rel in log.items() if i < first_kept})
    for op in cp.operators:
        for b, rel in op.metadata_files.items():
            if b is not None and b < oldest and rel not in keep:
                delete[rel] = "old-log"
        for rel, written_by in op.schema_files.items():
            if written_by < oldest and rel not in keep:
                delete[rel] = "old-log"
    return delete


def run_cleanup(
    target: Target,
    retain_batches: int | None = None,
    *,
    run_id: str,
    dry_run: bool = False,
    log: Callable[[str], None] = print,
    client: Callable[[], Any] | None = None,
) -> dict[str, Any]:
    """Plan, print the plan, and (unless a dry run) delete under the query's lock.
    ``client()`` makes the S3 client that lists the query's backups once the checkpoint is
    planned, for the plan's backup and undo lines (:func:`latest_backup`; None, or not a
    registered query's checkpoint: no backups named).

    The first plan, before the lock, checks that the path is a checkpoint and that every file
    it deletes can be deleted, so a refusal leaves nothing behind (not even a lock file); the
    deletions follow a second plan made under the lock, since a run may commit in between.
    """
    retain_batches = _retain_batches(target, retain_batches)
    lock = target.lock("cleanup", run_id)
    plan = plan_cleanup(target, retain_batches)
    named = {"backups": None}  # after the refusals: they are quick
    if target.query is not None and client is not None:
        named["backups"] = latest_backup(target.backup_location(), client)
    plan |= named
    if dry_run:
        log(format_plan(plan, dry_run=True))
        return plan
    refuse_unwritable_plan(plan, lock)
    with lock:
        started = time.time()
        plan = plan_cleanup(target, retain_batches) | named
        refuse_unwritable_plan(plan, lock)
        log(format_plan(plan, dry_run=False))
        execute_plan(plan, log)
        seconds = round(time.time() - started, 1)
        audit_plan(plan, lock.run_id, "succeeded", retained=plan["retained"], seconds=seconds)
    log(
        f"cleanup {lock.run_id} of {plan['checkpoint']}: deleted {plan['delete']['files']} "
        f"files, {format_bytes(plan['delete']['bytes'])}; kept {plan['keep']['files']} files, "
        f"{format_bytes(plan['keep']['bytes'])}; {seconds} s"
    )
    return plan


def latest_backup(url: str, client: Callable[[], Any]) -> dict[str, Any]:
    """The backups under ``url`` as a cleanup plan names them: where they are and the latest
    (``client()`` makes the S3 client). Cleanup needs no S3: a listing that does not answer
    is said in the plan (``error``), and the cleanup goes on."""
    from stateops.ops.backup import list_backups

    try:
        backups = list_backups(url, client())
    except Exception as err:  # a missing connection, the endpoint down, wrong keys, ...
        return {"url": url, "latest": None, "error": one_line(err)}
    return {"url": url, "latest": backups[-1] if backups else None, "error": None}
