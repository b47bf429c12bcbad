"""Restore of a checkpoint backup: a plan (which backup, into what, and whether it may go
there), then its execution (staged, verified, swapped in under the target query's lock).

The CLI (``stateops restore``) and the DAG (``stream_restore``) both call these functions, so
they refuse the same things in the same words: a target holding another query's state (unless
the operator allows it), a non-empty target without ``replace``, a query whose lock another
operation holds. A target that already holds exactly the backup (a restore killed after its
swap, or one run twice) is reported as restored. No Spark, no Airflow: the S3 client is passed in.
"""

from __future__ import annotations

import ctypes
import errno
import json
import os
from collections.abc import Callable
from contextlib import nullcontext
from pathlib import Path
from typing import Any

from stateops.control.audit import append_audit, read_audit
from stateops.control.lock import LockInfo, live_lock, read_hold
from stateops.control.markers import refuse_retired
from stateops.control.target import Target, checkpoint_target, query_target
from stateops.core import faults
from stateops.core.checkpoint import load_checkpoint
from stateops.core.errors import StateOpsError, Unreachable, s3_error
from stateops.core.files import relocate_checkpoint, schema_url
from stateops.core.formats import crc_sidecar, hadoop_crc
from stateops.core.plans import plan_head, plan_tail
from stateops.core.registry import Registry
from stateops.core.report import format_bytes
from stateops.core.s3 import S3Location, names_a_url, parse_s3_url
from stateops.core.sources import offsets_entry_sources, unreadable_from
from stateops.core.staging import Staging, has_entries, remove_stale_staging, stale_staging
from stateops.core.storage import S3Path, list_files, location, publish, safe_relative_path
from stateops.core.verify import verify_checkpoint
from stateops.ops.backup import (
    file_sha256,
    find_manifest,
    split_backup_url,
    transfer_manager,
)

__all__ = ["format_restore_plan", "plan_restore", "restore_backup", "run_restore"]

STAGING = "restoring"
RED, RESET = "\x1b[31m", "\x1b[0m"


def _backup_location(
    source: str, backup: str | None, registry: Registry | None
) -> tuple[S3Location, str, Target | None]:
    """(where the backups are, the backup id or ``latest``, the query named) from
    ``s3://BUCKET/PREFIX/BACKUP_ID|latest`` or a registered query's name (+ ``backup``): its
    backups are at its target's backup location."""
    if names_a_url(source):
        if backup is not None:
            raise StateOpsError(
                f"{source}: give the backup in the URL or after a query's name, not both"
            )
        return *split_backup_url(source), None
    if registry is None:
        raise StateOpsError(
            f"{source}: not an S3 URL, and there is no registry to look a query up in; use "
            "s3://BUCKET/PREFIX/BACKUP_ID, or a registered query's name with --registry"
        )
    named = query_target(registry, source)
    return parse_s3_url(named.backup_location()), backup or "latest", named


def _query_id(target: Path | S3Path) -> str | None:
    """The query id in ``target/metadata``, or None (no such file, or not readable as one):
    read alone, so a checkpoint damaged elsewhere still says whose it is."""
    try:
        return str(json.loads((target / "metadata").read_text(encoding="utf-8"))["id"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _last_batch(target: Path | S3Path) -> int | None:
    try:
        return load_checkpoint(target).last_committed_batch
    except StateOpsError:
        return None


def _names_location(path: Path | S3Path, location: Path | S3Path) -> bool:
    """A v2 operator metadata file names its schema files inside ``location`` (what a restore
    writes into the manifest's copy of it; see ``stateops.core.files.relocate_checkpoint``)."""
    try:
        meta = json.loads(path.read_text(encoding="utf-8").split("\n")[1])
        paths = [
            p
            for info in meta.get("stateStoreInfo", [])
            for p in info.get("stateSchemaFilePaths") or []
        ]
    except (OSError, ValueError, IndexError, AttributeError, TypeError):
        return False
    return all(str(p).startswith(f"{schema_url(location)}/state/") for p in paths)


def _holds_backup(target: Path | S3Path, manifest: dict[str, Any]) -> bool:
    """``target`` has exactly the manifest's files with their content: byte for byte, but for
    the operator metadata a restore rewrites for the new location (and their checksums)."""
    files = {f["path"]: f for f in manifest["files"]}
    sizes = list_files(target)
    if set(sizes) != set(files):
        return False
    try:
        cp = load_checkpoint(target)
    except StateOpsError:
        return False
    relocated = {
        rel for op in cp.operators for key, rel in op.metadata_files.items() if key is not None
    }
    sidecars = {crc_sidecar(rel): rel for rel in relocated}
    for rel, f in files.items():
        path = target / rel
        if rel in relocated:
            if not _names_location(path, target):
                return False
        elif rel in sidecars:
            if path.read_bytes() != hadoop_crc((target / sidecars[rel]).read_bytes()):
                return False
        elif sizes[rel] != f["size"] or file_sha256(path) != f["sha256"]:
            return False
    return True


def _holder(info: LockInfo) -> str:
    return f"{info.operation} (run {info.run_id}, {info.owner})"


def _target(
    source: str, to: str | os.PathLike[str] | None, named: Target | None, registry: Registry | None
) -> tuple[Path | S3Path, Target]:
    """The restore's target, the checkpoint restored into: ``to``, or the named query's own
    checkpoint (never through a link); as a path, and as a :class:`Target` with the registered
    query that owns it (whose lock the restore takes), resolved here once."""
    if to is None:
        if named is None:
            raise StateOpsError(f"{source}: say where to restore it: --to PATH")
        to = named.checkpoint
    if isinstance(location(to), S3Path):
        path: Path | S3Path = location(to)
    else:
        path = Path(to).absolute()
        if path.is_symlink():
            raise StateOpsError(
                f"{path}: a symbolic link; restore into the folder itself "
                f"({os.path.realpath(path)})"
            )
        if path.exists() and not path.is_dir():
            raise StateOpsError(f"{path}: not a folder; restore into a new or empty folder")
    if registry is None:
        return path, Target(str(path), None, None)
    return path, checkpoint_target(registry, path)


def _lock_state(target: Target) -> dict[str, Any] | None:
    """Who holds the lock or hold of the query that owns ``target`` now (the plan shows it; the
    restore decides again); None for a checkpoint no query owns."""
    if target.query is None or target.registry is None:
        return None
    held = read_hold(target.lock_file) or live_lock(target.lock_file)
    return {"query": target.query.name, "held_by": _holder(held) if held else None}


def _plan(
    into: tuple[Path | S3Path, Target],
    loc: S3Location,
    wanted: str,
    client: Any,
    *,
    query: str | None,
    replace: bool,
    allow_other_query: bool,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The plan of restoring backup ``wanted`` (an id or ``latest``) under ``loc`` into
    ``into`` (:func:`_target`), and the backup's manifest (kept out of the plan: thousands of
    file entries). ``query``: the query named as the source, if one was."""
    target, owner = into
    filled = has_entries(target)
    target_id = _query_id(target) if filled else None
    target_batch = _last_batch(target) if target_id is not None else None

    manifest = find_manifest(client, loc, wanted)
    for f in manifest["files"]:
        safe_relative_path(f["path"], "the restore target")
    backup_id, backup_qid = manifest["backup_id"], manifest.get("query_id")
    other = target_id is not None and backup_qid is not None and target_id != str(backup_qid)
    done = (
        target_id is not None
        and target_id == str(backup_qid)
        and target_batch == manifest["batch_id"]
        and _holds_backup(target, manifest)
    )
    plan = {
        "operation": "restore",
        "query": query,
        "location": str(loc),
        "url": f"{loc}/{backup_id}",
        "backup": {
            "backup_id": backup_id,
            "query_id": backup_qid,
            "batch_id": manifest["batch_id"],
            "created_at": manifest.get("created_at"),
            "source": manifest.get("source"),
            "files": len(manifest["files"]),
            "bytes": manifest.get("bytes"),
        },
        "target": str(target),
        "target_contents": "checkpoint" if target_id else "unknown" if filled else "none",
        "target_query_id": target_id,
        "target_batch": target_batch,
        "owner": owner.name,
        "lock": _lock_state(owner),
        "other_query": other,
        "allow_other_query": allow_other_query,
        "replace": replace,
        "already_restored": done,
        "stale_staging": [str(p) for p in stale_staging(target, STAGING)],
    }
    if done:
        return plan, manifest
    if other and not allow_other_query:
        raise StateOpsError(
            f"{target} holds query {target_id}, but backup {backup_id} is of query "
            f"{backup_qid}: refused, so that one query's state does not replace another's; "
            f"restore a backup of {target_id}, or allow another query's backup "
            "(--allow-other-query; in the DAG form: allow_other_query)"
        )
    if filled and isinstance(target, S3Path):
        raise StateOpsError(
            f"{target}: not empty, and an S3 checkpoint cannot be replaced in one step (S3 has "
            "no rename); restore into a new prefix (--to s3://BUCKET/NEW) and point the query "
            "at it"
        )
    if filled and not replace:
        raise StateOpsError(
            f"{target}: not empty; restore into a new folder, or pass --replace to move it aside"
        )
    plan["input_retained"] = _input_retained(owner, manifest, loc, client)
    return plan, manifest


def _input_retained(owner: Target, manifest: dict[str, Any], loc: S3Location, client: Any) -> str:
    """Whether the inputs whose input expires (a topic's retention) still hold all a restart
    from the backup reads (from its batch's offsets on): the checkpoint is the only record of
    such a query's progress, and a restart from offsets retention has passed fails
    (``failOnDataLoss``) or skips them. Refused in one line; servers that do not answer are
    said, not refused (a restore is what one does when things are down). ``none``: the
    target's query reads no such input (or no query owns the target: nothing says where)."""
    from botocore.exceptions import BotoCoreError, ClientError

    inputs = owner.query.inputs.values() if owner.query else []
    sources = [s for s in inputs if s.kind.expires]
    rel = f"offsets/{manifest['batch_id']}"
    entry = next((f for f in manifest["files"] if f["path"] == rel), None)
    if not sources or entry is None:
        return "none"
    try:
        body = client.get_object(Bucket=loc.bucket, Key=loc.key("objects", entry["sha256"]))
        entries = offsets_entry_sources(body["Body"].read().decode("utf-8"))
    except (BotoCoreError, ClientError) as err:
        raise s3_error(err, f"read {rel} of backup {manifest['backup_id']}") from None
    try:
        gone = unreadable_from(sources, entries)
    except Unreachable as err:
        return f"not checked: {err}"
    if gone:
        raise StateOpsError(
            f"backup {manifest['backup_id']} resumes at offsets its input no longer holds "
            f"({gone}): a restart would fail or skip them; nothing was restored; restore a "
            "newer backup"
        )
    return "yes"


def plan_restore(
    source: str,
    client: Any,
    *,
    backup: str | None = None,
    to: str | os.PathLike[str] | None = None,
    registry: Registry | None = None,
    replace: bool = False,
    allow_other_query: bool = False,
) -> dict[str, Any]:
    """What a restore would do, or a refusal (StateOpsError) of what it must not do.

    ``source``: ``s3://BUCKET/PREFIX/BACKUP_ID`` (or ``.../latest``), or a registered query's
    name, whose backups are under the registry's ``backups.url`` (``backup``: an id, default
    ``latest``) and whose checkpoint is the default target. Reads the backup's manifest and the
    target; changes nothing. Refused: another query's state in the target (its ``metadata``
    id is not the backup's) without ``allow_other_query``, and a non-empty target without
    ``replace``, unless the target already holds exactly this backup (``already_restored``).
    """
    loc, wanted, named = _backup_location(source, backup, registry)
    into = _target(source, to, named, registry)
    plan, _ = _plan(
        into,
        loc,
        wanted,
        client,
        query=named.name if named is not None else None,
        replace=replace,
        allow_other_query=allow_other_query,
    )
    return plan


def format_restore_plan(plan: dict[str, Any], *, dry_run: bool = True, color: bool = False) -> str:
    """The plan for a person; ``color``: another query's state marked in red (ANSI)."""
    b = plan["backup"]
    size = format_bytes(b["bytes"]) if isinstance(b["bytes"], int) else "? bytes"
    lines = [
        plan_head(dry_run, f"restore of backup {b['backup_id']} into {plan['target']}"),
        f"  backup {b['backup_id']} of query {b['query_id']} (batch {b['batch_id']}, "
        f"{b['files']} files, {size}, taken {b['created_at']} of {b['source']})",
        f"  from {plan['location']}",
        f"  into {plan['target']}"
        + (f" (checkpoint of {plan['owner']}: under its lock)" if plan["owner"] else ""),
    ]
    if plan["already_restored"]:
        lines.append("  already restored: the target holds exactly this backup; nothing to do")
    elif plan["target_contents"] == "none":
        lines.append("  the target is new or empty")
    else:
        held = (
            f"query {plan['target_query_id']} at batch {plan['target_batch']}"
            if plan["target_contents"] == "checkpoint"
            else "files but no readable query id (its identity cannot be checked)"
        )
        lines.append(
            f"  the target holds {held}: "
            + (
                "moved aside to <target>.replaced-<time>, never deleted"
                if plan["replace"]
                else "refused without --replace"
            )
        )
    if plan["other_query"]:
        # Only ever shown allowed: without the flag the plan is a refusal.
        mark = (
            f"!! ANOTHER QUERY: the state of query {b['query_id']} replaces that of query "
            f"{plan['target_query_id']} (allowed by --allow-other-query)"
        )
        lines.append("  " + (f"{RED}{mark}{RESET}" if color else mark))
    if plan["lock"] and plan["lock"]["held_by"]:
        lines.append(
            f"  {plan['lock']['query']} is locked by {plan['lock']['held_by']}: "
            "the restore is refused until that operation ends"
        )
    retained = plan.get("input_retained", "none")
    if retained != "none":
        lines.append(
            "  input: still held from the backup's offsets on (a topic's records)"
            if retained == "yes"
            else f"  input: whether it is still held from the backup's offsets was {retained}"
        )
    if plan["stale_staging"]:
        lines.append(
            "  staging folders of killed restores, to remove: " + ", ".join(plan["stale_staging"])
        )
    target, replaced = plan["target"], plan["target_contents"] != "none"
    lines += plan_tail(
        irreversible="nothing: "
        + (
            "the target's files are moved aside, never deleted"
            if replaced
            else "the target is new or empty"
        ),
        backup="none needed: nothing is deleted",
        undo=(
            f"remove {target}, then move {target}.replaced-<time> (the restore prints it) "
            f"back to {target}"
        )
        if replaced
        else f"remove {target}",
    )
    return "\n".join(lines)


_AT_FDCWD, _RENAME_EXCHANGE = -100, 2


def _exchange(a: Path, b: Path) -> bool:
    """Swap two paths in one step (Linux ``renameat2``); False where the system cannot."""
    try:
        renameat2 = ctypes.CDLL(None, use_errno=True).renameat2
    except (AttributeError, OSError):
        return False
    if renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.ENOTSUP):
        return False
    raise OSError(err, os.strerror(err), str(a), None, str(b))


def _swap_in(staging: Path, target: Path, aside: Path) -> None:
    """Put the verified ``staging`` at ``target`` and the old target at ``aside``.

    The staging folder first takes the aside name, then one exchange swaps it with the target:
    ``target`` is at every moment the old checkpoint or the new one, and a staging folder (which
    the next restore removes) never holds the old one. Killed between the two steps, the old
    checkpoint is still in place, and a verified copy of the backup is under the aside name.
    """
    os.rename(staging, aside)
    faults.point("swap")
    try:
        swapped = _exchange(aside, target)
    except OSError:
        os.rename(aside, staging)  # a staging folder again: removed as the failed run's
        raise
    if not swapped:
        # No atomic exchange here (not Linux, or a filesystem without it): two renames, and
        # for a moment no checkpoint at the target; the old one is never at a staging name.
        os.rename(aside, staging)
        os.rename(target, aside)
        os.rename(staging, target)


def _download(
    client: Any, loc: S3Location, manifest: dict[str, Any], staging: Path, workers: int
) -> None:
    """Every file of the manifest into ``staging``, each checked against its sha256."""
    from botocore.exceptions import BotoCoreError, ClientError

    manager = transfer_manager(client, workers)
    with manager:
        futures = []
        for f in manifest["files"]:
            dest = staging / safe_relative_path(f["path"], "the restore target")
            dest.parent.mkdir(parents=True, exist_ok=True)
            key = loc.key("objects", f["sha256"])
            futures.append((manager.download(loc.bucket, key, str(dest)), dest, key, f))
        for future, _, key, _ in futures:
            try:
                future.result()
            except (BotoCoreError, ClientError) as err:
                raise s3_error(err, f"download s3://{loc.bucket}/{key}") from None
            faults.point("download")
    for _, dest, key, f in futures:
        if file_sha256(dest) != f["sha256"]:
            raise StateOpsError(
                f"s3://{loc.bucket}/{key} is corrupt: its content does not match the sha256 "
                f"of {f['path']} in the manifest; restore an older backup"
            )


def _record_completed(target: Path, plan: dict[str, Any], run_id: str | None) -> None:
    """Audit a restore found complete whose own record is missing (killed after its swap)."""
    restores = [r for r in read_audit(target) if r["operation"] == "restore"]
    b = plan["backup"]
    if restores and restores[-1]["run_id"] == b["backup_id"]:
        return
    _audit_restore(target, plan, run_id, found_complete=True)


def _audit_restore(target: Path, plan: dict[str, Any], run_id: str | None, **details: Any) -> None:
    """The audit record of a restore that succeeded: the backup and where it came from."""
    b = plan["backup"]
    append_audit(
        target,
        "restore",
        run_id=b["backup_id"],
        result="succeeded",
        batch_after=b["batch_id"],
        backup=plan["url"],
        restored_from=b["source"],
        query_id=b["query_id"],
        restore_run=run_id,
        **details,
    )


def _stage_and_swap(
    target: Path | S3Path,
    plan: dict[str, Any],
    manifest: dict[str, Any],
    client: Any,
    result: dict[str, Any],
    *,
    workers: int,
    log: Callable[[str], None],
) -> None:
    """The restore's changes, under its lock: a staging folder beside ``target`` (removing
    those of killed restores), the backup downloaded into it and verified, then swapped in;
    what was removed and moved aside goes into ``result``."""
    loc = parse_s3_url(plan["location"])
    with Staging(target, STAGING) as staging:
        for folder in staging.removed:
            log(f"removed {folder}: the staging folder of a killed restore")
        result["removed_staging"] = staging.removed
        _download(client, loc, manifest, staging.path, workers)
        relocate_checkpoint(staging.path, location=target)
        verified = verify_checkpoint(staging.path)
        if not verified["ok"]:
            first = next(f for f in verified["findings"] if f["severity"] == "error")
            raise StateOpsError(
                f"restored checkpoint fails verification: {first['path']}: {first['problem']}"
            )
        faults.point("stage")
        if isinstance(target, S3Path):
            publish(staging.path, target)  # onto an empty prefix: whole or unfinished
        elif plan["target_contents"] == "none":
            os.rename(staging.path, target)  # onto a missing or empty folder: one step
        else:
            aside = target.with_name(f"{target.name}.replaced-{staging.stamp}")
            _swap_in(staging.path, target, aside)
            result["moved_aside"] = str(aside)


def run_restore(
    plan: dict[str, Any],
    client: Any,
    *,
    registry: Registry | None = None,
    run_id: str | None = None,
    workers: int = 8,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Carry out ``plan`` (from :func:`plan_restore`; its dry run is the plan itself): the
    restore's target (``plan["target"]``) resolved once in ``registry``, under the lock of the
    query whose checkpoint it is (it takes the lock itself; a checkpoint no query owns: no
    lock, nothing else runs on it), decide again on what the target holds now, remove staging
    folders of killed restores, then download into a new staging folder beside the target,
    check every file's sha256, point the metadata at the target and verify the files; only
    then swap it in (the old target moved aside, never deleted). Any failure: the staging
    folder is removed and the target is as it was; a kill: the target is the old checkpoint or
    the verified new one, and the next restore cleans up.
    """
    into = _target(plan["target"], plan["target"], None, registry)
    target, owner = into
    if owner.query is None:  # no lock to refuse it: a retired checkpoint stays as it is
        refuse_retired(target)
    lock = owner.lock("restore", run_id) if owner.query is not None else nullcontext()
    with lock:
        # The DAG plans in another task: the target may have changed since.
        plan, manifest = _plan(
            into,
            *split_backup_url(plan["url"]),
            client,
            query=None,
            replace=plan["replace"],
            allow_other_query=plan["allow_other_query"],
        )
        b = plan["backup"]
        result = {
            "backup_id": b["backup_id"],
            "query_id": b["query_id"],
            "batch_id": b["batch_id"],
            "files": b["files"],
            "bytes": b["bytes"],
            "target": str(target),
            "already_restored": plan["already_restored"],
            "moved_aside": None,
            "removed_staging": [],
        }
        if plan["already_restored"]:
            result["removed_staging"] = remove_stale_staging(target, STAGING)
            _record_completed(target, plan, run_id)
            log(
                f"restore {b['backup_id']}: already restored: {target} holds exactly this "
                f"backup (batch {b['batch_id']}); nothing to do"
            )
            return result
        log(f"restore {b['backup_id']}: batch {b['batch_id']}, {b['files']} files to {target}")
        _stage_and_swap(target, plan, manifest, client, result, workers=workers, log=log)
        _audit_restore(
            target,
            plan,
            run_id,
            batch_before=plan["target_batch"],
            replaced_query_id=plan["target_query_id"],
            moved_aside=result["moved_aside"],
            allowed_other_query=plan["other_query"],
        )
    log(f"restore {b['backup_id']}: done; batch {b['batch_id']} is the last committed batch")
    return result


def restore_backup(
    url: str,
    to: str | os.PathLike[str],
    client: Any,
    *,
    replace: bool = False,
    allow_other_query: bool = False,
    workers: int = 8,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Restore backup ``url`` into ``to``: :func:`plan_restore` and :func:`run_restore`
    without a registry (so without a query's lock)."""
    plan = plan_restore(url, client, to=to, replace=replace, allow_other_query=allow_other_query)
    return run_restore(plan, client, workers=workers, log=log)
