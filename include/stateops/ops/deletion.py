"""The deletion engine of cleanup and rollback: a plan names every file it deletes, by
category, in an order whose every prefix leaves a checkpoint the next run can plan on again;
executing it deletes exactly those files.

Both operations plan from the checkpoint model and never delete a file that a restart after
any batch they keep needs (:func:`deletion_plan` refuses, as a bug, a plan that would). The
categories:

- ``after-rollback-point`` (rollback): everything after the batch rolled back to;
- ``snapshot-group`` (cleanup): every file of a snapshot group (a base snapshot and the deltas
  or changelogs built on it) that no retained batch's restart loads;
- ``orphan-version``: state versions beyond the last committed batch + 1;
- ``orphan-attempt`` (cleanup, checkpoint format v2): the files of a state version whose id
  no commit names (a retried or failed task's upload) and no retained restart loads;
- ``unreferenced-sst``: RocksDB SST and log files that no kept ``N.zip`` refers to;
- ``old-log`` (cleanup): offsets, commits, source-log, operator-metadata and state-schema
  entries older than what a restart after the oldest retained batch reads;
- ``temp``: temp files (``*.tmp``) of interrupted writes;
- ``crc``: the ``.crc`` sidecars of deleted files, and sidecars whose file is gone.
"""

from __future__ import annotations

import hashlib
import json
import re
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from stateops.control.audit import append_audit, audit_dir
from stateops.control.lock import QueryLock
from stateops.control.markers import rollback_marker
from stateops.core import faults
from stateops.core.access import refuse_unwritable
from stateops.core.checkpoint import Checkpoint
from stateops.core.errors import CheckpointError
from stateops.core.plans import plan_head, plan_tail
from stateops.core.report import format_bytes
from stateops.core.storage import S3Path, delete_files, in_s3, location
from stateops.kinds import SINK_KINDS

__all__ = [
    "CATEGORIES",
    "audit_plan",
    "deletion_plan",
    "execute_plan",
    "format_plan",
    "plan_digest",
    "refuse_gaps",
    "refuse_unwritable_plan",
    "restart_set",
]


# Deletion order: each prefix of it leaves a checkpoint that the next run can plan on again.
CATEGORIES = {
    "after-rollback-point": "after the rollback point",
    "temp": "temp files of interrupted writes",
    "orphan-version": "state versions beyond the last committed batch + 1",
    "orphan-attempt": "state files of attempts no commit names (format v2: retried tasks)",
    "snapshot-group": "snapshot groups no retained batch needs",
    "old-log": "log entries older than the oldest retained restart reads",
    "unreferenced-sst": "RocksDB files no kept N.zip refers to",
    "crc": "checksum sidecars of deleted files",
}


_NUMBER = re.compile(r"^(\d+)")


def refuse_gaps(cp: Checkpoint) -> None:
    for log in ("offsets", "commits"):
        if gaps := cp.gaps(log):
            raise CheckpointError(
                f"{cp.root}: {log}/ has a gap (batch {gaps[0]} is missing); the checkpoint is "
                "damaged: restore it from a backup before cleaning or rolling back"
            )


def restart_set(cp: Checkpoint, batch: int, what: str) -> list[str]:
    """The restart set of committed ``batch``; refuses, naming the oldest usable batch, when
    its files are gone (cleaned up before, by Spark or by us)."""
    needed, missing = cp.restart_requirements(batch)
    if not missing:
        return needed
    usable = None
    for b in sorted((b for b in cp.commits if b > batch), reverse=True):
        if b not in cp.offsets or cp.restart_requirements(b)[1]:
            break
        usable = b
    raise CheckpointError(
        f"{cp.root}: batch {batch} is older than the oldest batch a restart can use "
        f"({usable if usable is not None else 'none'}; {missing[0]} is gone): {what}"
    )


def _number(rel: str) -> int:
    """The batch or version number a file's name starts with (-1 for none)."""
    m = _NUMBER.match(rel.rpartition("/")[2])
    return int(m.group(1)) if m else -1


def _sst_files(cp: Checkpoint) -> set[str]:
    """RocksDB SST/log files of every store."""
    return {
        rel
        for op in cp.operators
        for store in op.stores
        for rel in store.other_files
        if rel.startswith((store.rel_dir + "/SSTs/", store.rel_dir + "/logs/"))
    }


def _sst_references(cp: Checkpoint, deleted: dict[str, str]) -> set[str]:
    refs: set[str] = set()
    for op in cp.operators:
        for store in op.stores:
            for rel in store.zips:
                if rel not in deleted:
                    refs.update(cp.rocksdb_zip_references(store, rel))
    return refs


def _finish(cp: Checkpoint, delete: dict[str, str], keep: set[str]) -> None:
    """Add the RocksDB files left unreferenced, temp files and sidecars; check the guard."""
    refs = _sst_references(cp, delete)
    for rel in _sst_files(cp):
        if rel not in refs and rel not in delete:
            delete[rel] = "unreferenced-sst"
    sizes = cp.sizes
    # Temp files; then sidecars, which go with their file, or when that is gone.
    for rel in [r for r in sizes if r.endswith((".tmp", ".tmp.crc"))]:
        delete.setdefault(rel, "temp")
    for rel in [r for r in sizes if r.endswith(".crc") and r not in delete]:
        i = rel.rfind("/") + 1
        if rel[i] == ".":
            target = rel[:i] + rel[i + 1 : -4]
            if delete.get(target, "crc") != "crc" or target not in sizes:
                delete[rel] = "crc"
    unsafe = sorted(rel for rel in keep if rel in delete)
    if unsafe:  # a bug, never an input: refuse rather than delete a needed file
        raise AssertionError(f"plan would delete files a kept restart needs: {unsafe[:5]}")


def deletion_plan(
    cp: Checkpoint, operation: str, delete: dict[str, str], keep: set[str], **extra: Any
) -> dict[str, Any]:
    """The plan that deletes ``delete`` (file: category) and keeps ``keep``, with the RocksDB
    files, temp files and sidecars that go with them, in deletion order, and its totals."""
    _finish(cp, delete, keep)
    by_why: dict[str, list[str]] = {why: [] for why in CATEGORIES}
    for rel, why in delete.items():
        by_why[why].append(rel)
    files = {why: _in_order(why, rels) for why, rels in by_why.items() if rels}
    summary = {
        why: {"files": len(rels), "bytes": sum(map(cp.sizes.__getitem__, rels))}
        for why, rels in files.items()
    }
    deleted = sum(entry["bytes"] for entry in summary.values())
    return {
        "operation": operation,
        "checkpoint": str(cp.root),
        "last_committed_batch": cp.last_committed_batch,
        **extra,
        "delete": {"files": len(delete), "bytes": deleted},
        "keep": {
            "files": len(cp.sizes) - len(delete),
            "bytes": cp.total_bytes - deleted,
            "needed_by_restarts": len(keep),
        },
        "by_category": summary,
        "files": files,
    }


def _in_order(why: str, rels: list[str]) -> list[str]:
    """Deletion order within a category, so that every prefix leaves a plannable checkpoint.

    Old log entries go oldest first (never a gap); a rollback's files and orphan versions
    newest first, commits before offsets before the rest, so the last committed batch only
    ever moves down. Whole snapshot groups, unreferenced SSTs, temp files and sidecars need
    no order: they are sorted by name, so that a plan does not depend on the order a listing
    gave (a local folder's and an S3 prefix's differ).
    """
    if why == "old-log":
        return sorted(rels, key=lambda rel: (_number(rel), rel))
    if why in ("after-rollback-point", "orphan-version"):
        return sorted(rels, key=_newest_first)
    return sorted(rels)


def _newest_first(rel: str) -> tuple:
    log = 0 if rel.startswith("commits/") else 1 if rel.startswith("offsets/") else 2
    return (log, -_number(rel), rel)


def execute_plan(
    plan: dict[str, Any], progress: Callable[[str], None] = print, every_seconds: float = 5.0
) -> None:
    """Delete the plan's files in its order (in S3, 1,000 a request); a file already gone was
    deleted by a killed run."""
    total = plan["delete"]["files"]
    last_log = time.time()

    def done(count: int) -> None:
        nonlocal last_log
        if time.time() - last_log > every_seconds:
            progress(f"  deleted {count}/{total} files")
            last_log = time.time()

    def each() -> Iterator[str]:
        for rels in plan["files"].values():
            for rel in rels:
                faults.point("delete")
                yield rel

    delete_files(location(plan["checkpoint"]), each(), done)


def audit_plan(plan: dict[str, Any], run_id: str, result: str, **details: Any) -> None:
    append_audit(
        plan["checkpoint"],
        plan["operation"],
        run_id=run_id,
        result=result,
        batch_before=plan["last_committed_batch"],
        batch_after=plan.get("to_batch", plan["last_committed_batch"]),
        deleted_files=plan["delete"]["files"],
        deleted_bytes=plan["delete"]["bytes"],
        **details,
    )


def plan_digest(plan: dict[str, Any]) -> str:
    """What a plan does, as a short digest: the files it deletes, by category, and the sink
    folders it moves (equal digests, equal work)."""
    what = [plan["checkpoint"], plan["files"], (plan.get("sink") or {}).get("folders")]
    return hashlib.sha256(json.dumps(what, sort_keys=True).encode()).hexdigest()[:16]


def format_plan(plan: dict[str, Any], dry_run: bool, then: str | None = None) -> str:
    """The plan for a person: what goes, grouped, and what is kept and why; ``then``: what
    follows the deletions (a backfill's reprocessing); last what cannot be undone, where the
    backup goes and how to undo (:mod:`stateops.core.plans`)."""
    lines = [plan_head(dry_run, f"{plan['operation']} of {plan['checkpoint']}")]
    if plan["operation"] == "cleanup":
        first, last = plan["retained"]
        fewer = last - first + 1 < plan["retain_batches"]
        lines.append(
            f"  keep restarts after batches {first}..{last}"
            + (f" (only {last - first + 1} committed batches are left)" if fewer else "")
            + f": {plan['keep']['needed_by_restarts']} files needed"
        )
        groups: dict[tuple, list[dict]] = {}
        for g in plan["groups"]:
            groups.setdefault((g["operator"], g["store"], g["action"]), []).append(g)
        for (op, store, action), gs in sorted(groups.items()):
            versions = f"{min(g['versions'][0] for g in gs)}..{max(g['versions'][1] for g in gs)}"
            why = (
                "a retained restart loads them"
                if action == "keep"
                else "no retained batch needs them"
            )
            # Counted as `inspect` counts them: a group spans the partitions (each has its own
            # snapshot and deltas, listed one by one in the plan's data).
            partitions = len({g["partition"] for g in gs})
            lines.append(
                f"  operator {op} store {store}: {action} {len({g['group_id'] for g in gs})} "
                f"snapshot groups across {partitions} partitions "
                f"(versions {versions}, {sum(g['files'] for g in gs)} files, "
                f"{format_bytes(sum(g['bytes'] for g in gs))}): {why}"
            )
    else:
        lines.append(
            f"  batch {plan['to_batch']} becomes the last committed batch "
            f"(now {plan['last_committed_batch']}); everything after it goes"
        )
        if plan.get("partitions"):
            now, then_ = plan["partitions"]
            lines.append(
                f"  state partitions {now} -> {then_}: it goes back to before a repartition"
            )
        sink = plan.get("sink")
        if sink:
            lines += SINK_KINDS[sink["format"]].plan_lines(sink)
        if not plan.get("backup_to"):
            warning = "WARNING: no backup is taken first (--no-backup)"
            lines.append(f"  \033[31m{warning}\033[0m" if sys.stdout.isatty() else f"  {warning}")
    for why, entry in plan["by_category"].items():
        lines.append(
            f"  delete {entry['files']} files, {format_bytes(entry['bytes'])}: {CATEGORIES[why]}"
        )
    verb = "would delete" if dry_run else "deletes"
    deleted = f"{plan['delete']['files']} files, {format_bytes(plan['delete']['bytes'])}"
    lines.append(
        f"  {verb} {deleted}; keeps {plan['keep']['files']} files, "
        f"{format_bytes(plan['keep']['bytes'])}"
    )
    if then:
        lines.append(f"  then: {then}")
    return "\n".join(lines + _plan_tail(plan, deleted))


def _plan_tail(plan: dict[str, Any], deleted: str) -> list[str]:
    checkpoint, backup_to = plan["checkpoint"], plan.get("backup_to")
    if plan["operation"] == "cleanup":
        return plan_tail(
            irreversible=f"deleting {deleted}: only files no restart after the retained "
            "batches reads",
            **_cleanup_backup(checkpoint, plan.get("backups")),
        )
    if not backup_to:
        return plan_tail(irreversible=f"deleting {deleted} (no backup)", backup="none", undo="none")
    sink = plan.get("sink")
    return plan_tail(
        irreversible="nothing: the backup holds the checkpoint as it is now",
        backup=f"to {backup_to}, before anything changes",
        undo=f"stateops restore {backup_to}/BACKUP_ID {restore_over(checkpoint)} (the "
        "backup this run prints)"
        + (f", and {SINK_KINDS[sink['format']].undo_hint(sink)}" if sink else ""),
    )


def restore_over(checkpoint: str) -> str:
    """The options of a ``stateops restore`` that puts a backup back in ``checkpoint``'s
    place: over it (moved aside), or, for S3 (no rename: restore refuses to replace a prefix),
    into a new prefix that the query is then pointed at."""
    if in_s3(checkpoint):
        return f"--to {checkpoint.rstrip('/')}-restored, then point the query's checkpoint there"
    return f"--to {checkpoint} --replace"


def _cleanup_backup(checkpoint: str, backups: dict[str, Any] | None) -> dict[str, str]:
    """A cleanup takes no backup: its plan names the latest one of the query (``backups``:
    :func:`stateops.ops.cleanup.latest_backup`), from which deleted files come back."""
    restore = restore_over(checkpoint)
    if backups is None:  # not a registered query's checkpoint: no backup location known
        return {
            "backup": f"none (take one first to keep older restarts: stateops backup {checkpoint})",
            "undo": "none; deleted files come back only from an earlier backup (stateops "
            f"restore s3://BUCKET/PREFIX/BACKUP_ID {restore})",
        }
    url, latest = backups["url"], backups["latest"]
    if latest is not None:
        return {
            "backup": f"none taken by the cleanup; the latest is {latest['backup_id']} (batch "
            f"{latest['batch_id']}, {latest['created_at']}) under {url}",
            "undo": "none; deleted files come back only from an earlier backup (stateops "
            f"restore {url}/{latest['backup_id']} {restore})",
        }
    if backups.get("error"):
        return {
            "backup": f"none taken by the cleanup; the backups under {url} could not be "
            f"listed ({backups['error']})",
            "undo": "none; deleted files come back only from an earlier backup (stateops "
            f"backups list {url}, then stateops restore {url}/BACKUP_ID {restore})",
        }
    return {
        "backup": f"none yet under {url} (take one first to keep older restarts: stateops "
        f"backup {checkpoint})",
        "undo": f"none: there is no backup under {url} to bring deleted files back from",
    }


def refuse_unwritable_plan(plan: dict[str, Any], lock: QueryLock) -> None:
    """Refuse, before the lock, the backup, the marker or any deletion, a plan this process
    could not carry out to the end: a read-only checkpoint, sink or audit folder."""
    root = location(plan["checkpoint"])
    write: list[Path | S3Path] = []
    if isinstance(lock.path, Path):  # a lease in an S3 control store: written by CAS
        write += [lock.path, lock.path.with_name(lock.path.name + ".guard")]
    delete: list[Path | S3Path] = []
    if isinstance(root, Path):  # S3 answers only by trying: a refusal there comes at once
        write.append(audit_dir(root) / "audit.jsonl")
        if plan["operation"] == "rollback":
            write.append(rollback_marker(root))
        delete = [root / rel for rels in plan["files"].values() for rel in rels]
    move: list[Path | S3Path] = []
    sink = plan.get("sink")
    if sink:
        touched = SINK_KINDS[sink["format"]].touches(sink)
        move += touched["move"]
        delete += touched["delete"]
        write += touched["write"]
    refuse_unwritable(f"{plan['operation']} of {root}", delete=delete, write=write, move=move)
