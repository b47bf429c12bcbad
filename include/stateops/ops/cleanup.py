"""Snapshot-group cleanup and rollback: plan first, then delete exactly what the plan names.

Both plan from the checkpoint model and never delete a file that a restart after any batch
they keep needs. Both are safe to kill at any point: the next run plans again from what is
left and finishes the job. A rollback leaves a marker (``<checkpoint>.audit/rollback.json``)
while it runs; the query refuses to start until a rollback run has finished it.

Cleanup, retaining the last K committed batches, deletes:

- ``snapshot-group``: every file of a snapshot group (a base snapshot and the deltas or
  changelogs built on it) that no retained batch's restart loads;
- ``orphan-version``: state versions beyond the last committed batch + 1;
- ``unreferenced-sst``: RocksDB SST and log files that no kept ``N.zip`` refers to;
- ``old-log``: offsets, commits, source-log, operator-metadata and state-schema entries older
  than what a restart after the oldest retained batch reads;
- ``temp``: temp files (``*.tmp``) of interrupted writes;
- ``crc``: the ``.crc`` sidecars of deleted files, and sidecars whose file is gone.

Rollback to batch N deletes everything after N (``after-rollback-point``): commits and
offsets after N, source-log entries after N's, state versions after N + 1, operator metadata
and schema files written after N, then the RocksDB files and sidecars left unreferenced.
"""

from __future__ import annotations

import bisect
import hashlib
import json
import os
import re
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from stateops.control import faults
from stateops.control.audit import append_audit, audit_dir
from stateops.control.lock import QueryLock
from stateops.control.markers import clear_rollback, read_rollback, rollback_marker, write_rollback
from stateops.core.access import refuse_unwritable
from stateops.core.checkpoint import Checkpoint, load_checkpoint
from stateops.core.errors import CheckpointError, StateOpsError
from stateops.core.report import format_bytes

__all__ = [
    "format_plan",
    "plan_digest",
    "plan_cleanup",
    "plan_rollback",
    "plan_sink_rollback",
    "execute_sink_plan",
    "refuse_pending_rollback",
    "refuse_unwritable_plan",
    "run_cleanup",
    "run_rollback",
]

# Deletion order: each prefix of it leaves a checkpoint that the next run can plan on again.
CATEGORIES = {
    "after-rollback-point": "after the rollback point",
    "temp": "temp files of interrupted writes",
    "orphan-version": "state versions beyond the last committed batch + 1",
    "snapshot-group": "snapshot groups no retained batch needs",
    "old-log": "log entries older than the oldest retained restart reads",
    "unreferenced-sst": "RocksDB files no kept N.zip refers to",
    "crc": "checksum sidecars of deleted files",
}
_NUMBER = re.compile(r"^(\d+)")


def refuse_pending_rollback(checkpoint: str | os.PathLike[str], to_batch: int | None = None):
    """Raise while an interrupted rollback (to another batch than ``to_batch``) is pending."""
    pending = read_rollback(checkpoint)
    if pending is None:
        return None
    if to_batch is None or pending["to_batch"] != to_batch:
        raise StateOpsError(
            f"{checkpoint}: a rollback to batch {pending['to_batch']} (run {pending['run_id']}) "
            f"was interrupted; finish it first: stateops rollback {checkpoint} "
            f"--to-batch {pending['to_batch']}"
        )
    return pending


def _refuse_gaps(cp: Checkpoint) -> None:
    for log in ("offsets", "commits"):
        if gaps := cp.gaps(log):
            raise CheckpointError(
                f"{cp.root}: {log}/ has a gap (batch {gaps[0]} is missing); the checkpoint is "
                "damaged: restore it from a backup before cleaning or rolling back"
            )


def _restart_set(cp: Checkpoint, batch: int, what: str) -> list[str]:
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
            for rel in store.snapshots.values():
                if rel.endswith(".zip") and rel not in deleted:
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


def _plan(cp: Checkpoint, operation: str, delete: dict[str, str], keep: set[str], **extra) -> dict:
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
    no order: they are kept in the order planned.
    """
    if why == "old-log":
        return sorted(rels, key=lambda rel: (_number(rel), rel))
    if why in ("after-rollback-point", "orphan-version"):
        return sorted(rels, key=_newest_first)
    return rels


def _newest_first(rel: str) -> tuple:
    log = 0 if rel.startswith("commits/") else 1 if rel.startswith("offsets/") else 2
    return (log, -_number(rel), rel)


def plan_cleanup(checkpoint: str | os.PathLike[str], retain_batches: int) -> dict[str, Any]:
    """What cleanup deletes so that restarts after the last ``retain_batches`` batches work."""
    if retain_batches < 1:
        raise StateOpsError(f"--retain-batches must be at least 1, got {retain_batches}")
    cp = load_checkpoint(checkpoint)
    refuse_pending_rollback(cp.root)
    _refuse_gaps(cp)
    committed = sorted(cp.commits)
    if not committed:
        raise CheckpointError(f"{cp.root}: no committed batch yet: nothing to clean")
    retained = committed[-retain_batches:]
    keep: set[str] = set()
    for b in retained:
        keep.update(_restart_set(cp, b, "retain fewer batches (--retain-batches)"))
    last = committed[-1]
    delete: dict[str, str] = {}
    groups = []
    for op in cp.operators:
        for store in op.stores:
            bases = sorted({0, *store.snapshots})
            needed = {bases[bisect.bisect_right(bases, b + 1) - 1] for b in retained}
            for g in store.snapshot_groups(cp.sizes):
                action = "keep" if g.snapshot_version in needed else "delete"
                if action == "delete":
                    delete.update(dict.fromkeys(g.files, "snapshot-group"))
                groups.append({
                    "operator": op.operator_id, "partition": store.partition,
                    "store": store.store_name, "base": g.snapshot_version,
                    "versions": [g.versions[0], g.versions[-1]], "files": len(g.files),
                    "bytes": g.bytes, "action": action,
                })  # fmt: skip
            for v in [v for v in store.versions if v > last + 1]:
                delete.update(dict.fromkeys(store.version_files(v), "orphan-version"))
    oldest = retained[0]
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
    return _plan(cp, "cleanup", delete, keep, retain_batches=retain_batches,
                 retained=[retained[0], retained[-1]], groups=groups)  # fmt: skip


def plan_rollback(checkpoint: str | os.PathLike[str], to_batch: int) -> dict[str, Any]:
    """What a rollback to committed batch ``to_batch`` deletes (it becomes the last one)."""
    cp = load_checkpoint(checkpoint)
    pending = refuse_pending_rollback(cp.root, to_batch)
    _refuse_gaps(cp)
    last = cp.last_committed_batch
    if cp.commits and to_batch < min(cp.commits):
        raise CheckpointError(
            f"{cp.root}: batch {to_batch} is older than the oldest retained batch "
            f"({min(cp.commits)}): cleanup removed it; roll back to a later batch, or restore "
            "an older backup"
        )
    if to_batch not in cp.commits:
        raise CheckpointError(
            f"{cp.root}: batch {to_batch} is not a committed batch (last committed batch: "
            f"{last}); pick a batch listed by `stateops inspect`"
        )
    keep = set(_restart_set(cp, to_batch, "roll back to a later batch, or restore an older backup"))
    delete: dict[str, str] = {}
    for log, batches in (("commits", cp.commits), ("offsets", cp.offsets)):
        delete.update({f"{log}/{b}": "after-rollback-point" for b in batches if b > to_batch})
    for name, log in cp.sources.items():
        upper = cp.file_log_offset(to_batch, int(name)) if name.isdigit() else None
        upper = to_batch if upper is None else upper  # other sources' logs go by batch id
        for i, rel in log.items():
            if i > upper:
                delete[rel] = "after-rollback-point"
    for op in cp.operators:
        for b, rel in op.metadata_files.items():
            if b is not None and b > to_batch:
                delete[rel] = "after-rollback-point"
        for rel, written_by in op.schema_files.items():
            if written_by > to_batch and rel not in keep:
                delete[rel] = "after-rollback-point"
        for store in op.stores:
            for v in store.versions:
                if v > to_batch + 1:
                    delete.update(dict.fromkeys(store.version_files(v), "after-rollback-point"))
    return _plan(cp, "rollback", delete, keep, to_batch=to_batch, resumes=pending)


def execute_plan(
    plan: dict[str, Any], progress: Callable[[str], None] = print, every_seconds: float = 5.0
) -> None:
    """Delete the plan's files in its order; a file already gone was deleted by a killed run."""
    root = Path(plan["checkpoint"])
    total = plan["delete"]["files"]
    last_log = time.time()
    done = 0
    for rels in plan["files"].values():
        for rel in rels:
            faults.point("delete")
            (root / rel).unlink(missing_ok=True)
            done += 1
            if time.time() - last_log > every_seconds:
                progress(f"  deleted {done}/{total} files")
                last_log = time.time()


def _audit(plan: dict[str, Any], run_id: str, result: str, **details: Any) -> None:
    append_audit(
        plan["checkpoint"], plan["operation"], run_id=run_id, result=result,
        batch_before=plan["last_committed_batch"],
        batch_after=plan.get("to_batch", plan["last_committed_batch"]),
        deleted_files=plan["delete"]["files"], deleted_bytes=plan["delete"]["bytes"], **details,
    )  # fmt: skip


def plan_digest(plan: dict[str, Any]) -> str:
    """What a plan does, as a short digest: the files it deletes, by category, and the sink
    folders it moves (equal digests, equal work)."""
    what = [plan["checkpoint"], plan["files"], (plan.get("sink") or {}).get("folders")]
    return hashlib.sha256(json.dumps(what, sort_keys=True).encode()).hexdigest()[:16]


def format_plan(plan: dict[str, Any], dry_run: bool) -> str:
    """The plan for a person: what goes, grouped, and what is kept and why."""
    lines = [f"{plan['operation']} plan for {plan['checkpoint']}"]
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
            lines.append(
                f"  operator {op} store {store}: {action} {len(gs)} snapshot groups "
                f"(versions {versions}, {sum(g['files'] for g in gs)} files, "
                f"{format_bytes(sum(g['bytes'] for g in gs))}): {why}"
            )
    else:
        lines.append(
            f"  batch {plan['to_batch']} becomes the last committed batch "
            f"(now {plan['last_committed_batch']}); everything after it goes"
        )
        sink = plan.get("sink")
        if sink:
            lines.append(
                f"  sink {sink['path']}: move {len(sink['folders'])} batch folders and "
                f"{len(sink['data_files'])} data files aside (_rolled_back/), drop "
                f"{len(sink['log_entries'])} _spark_metadata entries"
            )
        if not plan.get("backup_first"):
            warning = "WARNING: no backup is taken first (--no-backup)"
            lines.append(f"  \033[31m{warning}\033[0m" if sys.stdout.isatty() else f"  {warning}")
    for why, entry in plan["by_category"].items():
        lines.append(
            f"  delete {entry['files']} files, {format_bytes(entry['bytes'])}: {CATEGORIES[why]}"
        )
    verb = "would delete" if dry_run else "deletes"
    lines.append(
        f"  {verb} {plan['delete']['files']} files, {format_bytes(plan['delete']['bytes'])}; "
        f"keeps {plan['keep']['files']} files, {format_bytes(plan['keep']['bytes'])}"
    )
    return "\n".join(lines)


def refuse_unwritable_plan(plan: dict[str, Any], lock: QueryLock) -> None:
    """Refuse, before the lock, the backup, the marker or any deletion, a plan this process
    could not carry out to the end: a read-only checkpoint, sink or audit folder."""
    root = Path(plan["checkpoint"])
    audit = audit_dir(root)
    write = [audit / "audit.jsonl", lock.path, lock.path.with_name(lock.path.name + ".guard")]
    if plan["operation"] == "rollback":
        write.append(rollback_marker(root))
    move: list[Path] = []
    delete = [root / rel for rels in plan["files"].values() for rel in rels]
    sink = plan.get("sink")
    if sink:
        sink_root = Path(sink["path"])
        move += [sink_root / name for name in sink["folders"]]
        move += [Path(uri.removeprefix("file:")) for uri in sink["data_files"]]
        delete += [sink_root / "_spark_metadata" / name for name in sink["log_entries"]]
        if sink["folders"] or sink["data_files"]:
            write.append(sink_root / "_rolled_back" / "x")
    refuse_unwritable(f"{plan['operation']} of {root}", delete=delete, write=write, move=move)


def run_cleanup(
    checkpoint: str | os.PathLike[str],
    retain_batches: int,
    lock: QueryLock,
    *,
    dry_run: bool = False,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Plan, print the plan, and (unless a dry run) delete under the query's lock.

    The first plan, before the lock, checks that the path is a checkpoint and that every file
    it deletes can be deleted, so a refusal leaves nothing behind (not even a lock file); the
    deletions follow a second plan made under the lock, since a run may commit in between.
    """
    plan = plan_cleanup(checkpoint, retain_batches)
    if dry_run:
        log(format_plan(plan, dry_run=True))
        return plan
    refuse_unwritable_plan(plan, lock)
    with lock:
        started = time.time()
        plan = plan_cleanup(checkpoint, retain_batches)
        refuse_unwritable_plan(plan, lock)
        log(format_plan(plan, dry_run=False))
        execute_plan(plan, log)
        seconds = round(time.time() - started, 1)
        _audit(plan, lock.run_id, "succeeded", retained=plan["retained"], seconds=seconds)
    log(
        f"cleanup {lock.run_id} of {plan['checkpoint']}: deleted {plan['delete']['files']} "
        f"files, {format_bytes(plan['delete']['bytes'])}; kept {plan['keep']['files']} files, "
        f"{format_bytes(plan['keep']['bytes'])}; {seconds} s"
    )
    return plan


def plan_sink_rollback(
    sink: str | os.PathLike[str], to_batch: int, batch_offset: int = 0
) -> dict[str, Any]:
    """What makes a sink consistent with a rollback to ``to_batch``.

    A per-batch sink (``batch_id=K`` folders, the registered queries' ``foreachBatch``; K is
    the batch plus the sink's ``batch_offset``) moves the folders of later batches aside.
    Spark's file sink drops its ``_spark_metadata`` entries after ``to_batch`` and moves the
    data files only they name aside. Moved aside is
    ``<sink>/_rolled_back/<run id>/``: readers skip ``_`` folders, and nothing is lost.
    """
    root = Path(sink)
    folders = sorted(
        p.name
        for p in root.glob("batch_id=*")
        if int(p.name.split("=", 1)[1]) > to_batch + batch_offset
    )
    log_dir = root / "_spark_metadata"
    entries = {}
    if log_dir.is_dir():
        for p in log_dir.iterdir():
            m = re.fullmatch(r"(\d+)(\.compact)?", p.name)
            if m:
                entries[int(m.group(1))] = p.name
    later = sorted((b for b in entries if b > to_batch), reverse=True)
    data_files: list[str] = []
    if later:
        compacts = [b for b in entries if b <= to_batch and entries[b].endswith(".compact")]
        start = max(compacts) if compacts else 0
        kept = [entries.get(b) for b in range(start, to_batch + 1)]
        if None in kept:
            raise StateOpsError(
                f"{log_dir}: compacted after batch {to_batch} and the entries before it are gone; "
                "the file sink cannot be rolled back to that batch"
            )
        named_later = {p for b in later for p in _sink_log_paths(log_dir / entries[b])}
        named_kept = {p for name in kept for p in _sink_log_paths(log_dir / name)}
        data_files = sorted(named_later - named_kept)
    return {
        "path": str(root),
        "folders": folders,
        "log_entries": [entries[b] for b in later],
        "data_files": data_files,
    }


def _sink_log_paths(path: Path) -> list[str]:
    paths = []
    for line in path.read_text(encoding="utf-8").split("\n")[1:]:
        if line.strip():
            paths.append(json.loads(line)["path"])
    return paths


def execute_sink_plan(sink: dict[str, Any], run_id: str) -> None:
    """Move a sink plan's folders and files to ``<sink>/_rolled_back/<run_id>/``."""
    root = Path(sink["path"])
    aside = root / "_rolled_back" / run_id
    for name in sink["folders"]:
        faults.point("move")
        aside.mkdir(parents=True, exist_ok=True)
        if (root / name).exists():
            (root / name).rename(aside / name)
    for name in sink["log_entries"]:  # newest first, like the checkpoint's logs
        faults.point("delete")
        (root / "_spark_metadata" / name).unlink(missing_ok=True)
    for uri in sink["data_files"]:
        faults.point("move")
        src = Path(uri.removeprefix("file:"))
        if src.exists():
            dest = aside / src.relative_to(root)
            dest.parent.mkdir(parents=True, exist_ok=True)
            src.rename(dest)


def run_rollback(
    checkpoint: str | os.PathLike[str],
    to_batch: int,
    lock: QueryLock,
    *,
    sink: str | os.PathLike[str] | None = None,
    sink_batch_offset: int = 0,
    backup: Callable[[], str] | None = None,
    dry_run: bool = False,
    planned: str | None = None,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Make ``to_batch`` the last committed batch: backup (``backup()`` returns its id),
    marker, checkpoint deletions, sink, audit, marker removed. A rerun after a kill resumes.
    The plan it returns names the ``run_id`` (the sink's ``_rolled_back/<run_id>/``) and the
    ``backup_id``. ``planned``: the :func:`plan_digest` of the plan the operator saw (a
    backfill's); the rollback refuses, changing nothing, if the plan made under the lock
    differs from it."""

    def plan_all() -> dict[str, Any]:
        plan = plan_rollback(checkpoint, to_batch)
        plan["sink"] = plan_sink_rollback(sink, to_batch, sink_batch_offset) if sink else None
        plan["backup_first"] = backup is not None
        return plan

    plan = plan_all()  # before the lock, the backup and the marker: see run_cleanup
    if dry_run:
        log(format_plan(plan, dry_run=True))
        return plan
    refuse_unwritable_plan(plan, lock)
    with lock:
        started = time.time()
        plan = plan_all()
        if planned is not None and plan_digest(plan) != planned:
            raise CheckpointError(
                f"{plan['checkpoint']} changed since the plan was made (last committed batch now "
                f"{plan['last_committed_batch']}): nothing was rolled back; plan again"
            )
        refuse_unwritable_plan(plan, lock)
        log(format_plan(plan, dry_run=False))
        if pending := plan["resumes"]:  # an interrupted run already backed up and marked
            run_id, backup_id = pending["run_id"], pending.get("backup_id")
            log(f"resuming the interrupted rollback {run_id}")
        else:
            run_id, backup_id = lock.run_id, backup() if backup else None
            write_rollback(checkpoint, {"to_batch": to_batch, "run_id": run_id,
                                        "backup_id": backup_id})  # fmt: skip
        execute_plan(plan, log)
        if plan["sink"]:
            execute_sink_plan(plan["sink"], run_id)
        seconds = round(time.time() - started, 1)
        _audit(plan, run_id, "succeeded", backup_id=backup_id, seconds=seconds)
        clear_rollback(checkpoint)
    plan.update(run_id=run_id, backup_id=backup_id)
    log(
        f"rollback {run_id} of {plan['checkpoint']}: batch {to_batch} is the last committed "
        "batch; deleted "
        f"{plan['delete']['files']} files, {format_bytes(plan['delete']['bytes'])}"
        + (f"; backup {backup_id}" if backup_id else "; no backup")
        + f"; {seconds} s"
    )
    return plan
