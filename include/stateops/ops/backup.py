"""Checkpoint backup and restore on S3: consistent, incremental, verified. No Spark.

Bucket layout under ``s3://BUCKET/PREFIX``::

    objects/<sha256>              one object per distinct file content
    manifests/<backup id>.json    one per backup, written last: a backup exists once it is there
    drills/<backup id>.json       the last restore drill of that backup (stateops.ops.drill)
    trash/<sha256>.<time>         an object a prune set aside, deleted by a prune after the grace

A backup holds exactly the files a restart after a committed batch needs (the checkpoint
model's restart set). Files of a committed batch do not change, so a backup can run while the
query does; a file that Spark's maintenance deletes during the copy makes the backup start
over on the newest committed batch, reusing every object already uploaded. Restoring one:
:mod:`stateops.ops.restore`.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any

from stateops.control.audit import append_audit
from stateops.core import faults
from stateops.core.checkpoint import load_checkpoint
from stateops.core.errors import CheckpointError, StateOpsError, s3_error
from stateops.core.formats import crc_sidecar
from stateops.core.plans import BackupFirst
from stateops.core.report import format_bytes
from stateops.core.s3 import S3Location, parse_s3_url
from stateops.core.staging import new_stamp
from stateops.core.storage import S3Path, open_stream, same_endpoint
from stateops.core.verify import refuse_damaged, verify_crc

if TYPE_CHECKING:
    from stateops.control.target import Target

__all__ = [
    "backup_first",
    "backup_checkpoint",
    "describe_drill",
    "file_sha256",
    "find_manifest",
    "list_backups",
    "prune_backups",
    "read_drills",
    "read_manifest",
    "read_manifests",
    "run_backup",
    "split_backup_url",
    "transfer_manager",
    "verify_backup",
    "write_drill",
]

FORMAT = "stateops-backup/1"
_CHUNK = 1 << 20


def _digest(stream: Any) -> str:
    """sha256 of a binary stream (a file, or an S3 object's body), read in chunks."""
    digest = hashlib.sha256()
    while chunk := stream.read(_CHUNK):
        digest.update(chunk)
    return digest.hexdigest()


def file_sha256(path: Path | S3Path) -> str:
    with open_stream(path) as f:
        return _digest(f)


def _listing(client: Any, loc: S3Location, folder: str) -> list[dict[str, Any]]:
    """Every object under ``PREFIX/folder/`` (S3's entries: Key, Size, LastModified)."""
    paginator = client.get_paginator("list_objects_v2")
    pages = paginator.paginate(Bucket=loc.bucket, Prefix=loc.key(folder) + "/")
    return [obj for page in pages for obj in page.get("Contents", [])]


def _name(obj: dict[str, Any]) -> str:
    return obj["Key"].rpartition("/")[2]


def transfer_manager(client: Any, workers: int) -> Any:
    from boto3.s3.transfer import TransferConfig, create_transfer_manager

    config = TransferConfig(max_concurrency=workers, multipart_threshold=64 << 20)
    return create_transfer_manager(client, config)


def backup_checkpoint(
    checkpoint: str | os.PathLike[str],
    to: str,
    client: Any,
    *,
    batch: int | None = None,
    workers: int = 8,
    attempts: int = 3,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Back up the restart set of committed ``batch`` (default: the last); the manifest."""
    loc = parse_s3_url(to)
    for attempt in range(1, attempts + 1):
        cp = load_checkpoint(checkpoint)
        n = cp.last_committed_batch if batch is None else batch
        if n is None:
            raise CheckpointError(f"{checkpoint}: no committed batch yet: nothing to back up")
        try:
            return _backup_once(cp, n, loc, client, workers, log)
        except FileNotFoundError as err:
            if batch is not None or attempt == attempts:
                raise CheckpointError(
                    f"{checkpoint}: {Path(err.filename or '?').name} of batch {n} was deleted "
                    "during the backup (state maintenance); back up a newer batch"
                ) from err
            log(f"a file of batch {n} went away during the copy; retrying on the newest batch")
    raise AssertionError("unreachable")


def run_backup(
    target: Target,
    client: Any,
    *,
    batch: int | None = None,
    to: str | None = None,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Back up ``target``'s checkpoint (committed ``batch``, default the last) to ``to``, else
    its query's place under the registry's ``backups.url``; then, for a registered query backed
    up to that place, apply the registry's retention (``backups.keep_last``, ``backups.max_age``)
    there, one after the other (see :func:`prune_backups`). A backup elsewhere (``to``) keeps
    every backup there: the registry's retention is for the query's own place. What both
    ``stateops backup`` and the scheduled DAG do. No lock: a backup runs while the query does.
    Returns the manifest without its file list, with ``retention`` (what the prune did) when
    it applied."""
    location = target.backup_location(to)
    manifest = backup_checkpoint(target.checkpoint, location, client, batch=batch, log=log)
    summary = {k: v for k, v in manifest.items() if k != "files"}
    if target.query is None or location != target.backup_location():
        return summary
    settings = target.require_registry().backups
    retention = prune_backups(
        location, client, keep_last=settings.keep_last, max_age=settings.max_age
    )
    log(
        f"retention: kept {len(retention['kept'])} backups, deleted "
        f"{len(retention['deleted_backups'])} and {retention['deleted_objects']} unreferenced "
        f"objects ({retention['freed_bytes']} bytes)"
    )
    return summary | {"retention": retention}


def backup_first(
    target: Target,
    client: Any,
    operation: str,
    *,
    to: str | None = None,
    give: str = "--backup-to s3://BUCKET/PREFIX (or --no-backup)",
    log: Callable[[str], None] = print,
) -> BackupFirst:
    """The one "back up first" step of every operation that changes a checkpoint: the backup of
    ``target``'s checkpoint to ``to``, else its query's place under the registry's
    ``backups.url`` (no location: refused here, in one line that says what to ``give``, before
    any lock). ``client``: an S3 client, or a function that makes one when the backup is taken
    (an Airflow task reads its connection only then)."""
    location = target.backup_location(to, give)

    def take() -> str:
        log(f"backup of {target.checkpoint} to {location} before the {operation}")
        s3 = client() if callable(client) else client
        return backup_checkpoint(target.checkpoint, location, s3, log=log)["backup_id"]

    return BackupFirst(location, take)


def _backup_once(cp: Any, n: int, loc: S3Location, client: Any, workers: int, log) -> dict:
    from botocore.exceptions import BotoCoreError, ClientError

    started = time.time()
    rels = cp.restart_files(n)
    refuse_damaged(cp, rels, f"backup of {cp.root} batch {n}")  # it would not restore
    with ThreadPoolExecutor(workers) as pool:  # an S3 checkpoint's reads overlap
        digests = list(pool.map(lambda rel: file_sha256(cp.root / rel), rels))
    files = [
        {"path": rel, "size": cp.sizes[rel], "sha256": sha}
        for rel, sha in zip(rels, digests, strict=True)
    ]
    total = sum(f["size"] for f in files)
    providers = sorted({op.provider for op in cp.operators})
    backup_id = f"b-{n:06d}-{new_stamp()}"
    log(f"backup {backup_id}: batch {n}, {len(files)} files, {format_bytes(total)} to {loc}")
    try:
        # Reuse an object only at its full size: a store killed mid-write may keep a stub.
        existing = {(_name(obj), obj["Size"]) for obj in _listing(client, loc, "objects")}
        todo: dict[str, dict] = {}
        for f in files:
            if (f["sha256"], f["size"]) not in existing:
                todo.setdefault(f["sha256"], f)
        uploaded = sum(f["size"] for f in todo.values())
        _upload(client, cp.root, loc, todo, workers, log)
        manifest = {
            "format": FORMAT,
            "backup_id": backup_id,
            "query_id": cp.query_id,
            "batch_id": n,
            "spark_version": metadata.version("pyspark"),
            "provider": providers[0] if len(providers) == 1 else providers,
            "created_at": datetime.now(UTC).isoformat(timespec="seconds"),
            "source": str(cp.root.resolve()),
            "files": files,
            "bytes": total,
            "uploaded": {"objects": len(todo), "bytes": uploaded},
            "reused": {"files": len(files) - len(todo), "bytes": total - uploaded},
        }
        faults.point("manifest")
        client.put_object(
            Bucket=loc.bucket,
            Key=loc.key("manifests", f"{backup_id}.json"),
            Body=json.dumps(manifest, indent=1).encode("utf-8"),
            ContentType="application/json",
        )
        _keep_objects(client, cp.root, loc, manifest, workers, log)
    except (BotoCoreError, ClientError) as err:
        raise s3_error(err, f"backup to {loc}") from None
    manifest["seconds"] = round(time.time() - started, 1)
    append_audit(  # a backup leaves the checkpoint at the batch it copied
        cp.root,
        "backup",
        run_id=backup_id,
        result="succeeded",
        batch_before=n,
        batch_after=n,
        to=str(loc),
        uploaded_bytes=uploaded,
        reused_bytes=total - uploaded,
    )
    log(
        f"backup {backup_id}: batch {n}, {len(files)} files, {format_bytes(uploaded)} uploaded "
        f"({len(todo)} objects), {format_bytes(total - uploaded)} reused, {manifest['seconds']} s"
    )
    return manifest


def _upload(
    client: Any, root: Path | S3Path, loc: S3Location, todo: dict[str, dict], workers: int, log
) -> None:
    """Put each file of ``todo`` (sha256 -> manifest entry) at ``objects/<sha256>``."""
    manager = transfer_manager(client, workers)
    with manager:
        futures = [
            (_transfer(manager, client, root / f["path"], loc, sha), f) for sha, f in todo.items()
        ]
        done_bytes, last_log = 0, time.time()
        for i, (future, f) in enumerate(futures, 1):
            future.result()
            faults.point("upload")
            done_bytes += f["size"]
            if time.time() - last_log > 5:
                log(f"  uploaded {i}/{len(futures)} objects, {format_bytes(done_bytes)}")
                last_log = time.time()


def _keep_objects(
    client: Any, root: Path | S3Path, loc: S3Location, manifest: dict, workers: int, log
) -> None:
    """After the manifest is written: every object it names is in ``objects/``, or is put back.

    A prune that read the manifests before this one was written may have set aside, as
    unreferenced, an object this backup reuses. The prune reads the manifests again once its
    moves are done and puts back what they name: if this manifest was written before that
    second read, the prune sees it; if after, every move came before this check, which comes
    after the manifest and sees the object gone. An object set aside is copied back from
    ``trash/``; one deleted for good is uploaded again from the checkpoint. If its file is gone
    too, the manifest is deleted and the backup fails: no backup is listed that does not
    restore."""
    present = {(_name(obj), obj["Size"]) for obj in _listing(client, loc, "objects")}
    missing = {f["sha256"]: f for f in manifest["files"] if (f["sha256"], f["size"]) not in present}
    if not missing:
        return
    aside = {_name(obj).partition(".")[0]: obj["Key"] for obj in _listing(client, loc, "trash")}
    for sha in missing.keys() & aside.keys():
        _copy(client, loc, aside[sha], loc.key("objects", sha))
    upload = {sha: f for sha, f in missing.items() if sha not in aside}
    try:
        _upload(client, root, loc, upload, workers, log)
    except FileNotFoundError as err:
        client.delete_object(
            Bucket=loc.bucket, Key=loc.key("manifests", f"{manifest['backup_id']}.json")
        )
        raise CheckpointError(
            f"backup {manifest['backup_id']}: a prune beside it deleted objects it reuses, and "
            f"{Path(err.filename or '?').name} is gone from the checkpoint too; the backup was "
            "withdrawn: take it again"
        ) from err
    log(
        f"backup {manifest['backup_id']}: {len(missing)} objects a prune beside it had set "
        f"aside were put back ({len(missing) - len(upload)} from trash/, {len(upload)} uploaded "
        "again)"
    )


def _transfer(manager: Any, client: Any, source: Path | S3Path, loc: S3Location, sha: str) -> Any:
    """Start putting ``source`` at ``objects/<sha>``: an upload of a local file; for a
    checkpoint in S3, a server-side copy when the backup goes to the same endpoint, else the
    object streamed through."""
    key = loc.key("objects", sha)
    if isinstance(source, Path):
        return manager.upload(str(source), loc.bucket, key)
    if same_endpoint(source, client):
        return manager.copy({"Bucket": source.bucket, "Key": source.key}, loc.bucket, key)
    from s3transfer.subscribers import BaseSubscriber

    stream = open_stream(source)

    class CloseWhenDone(BaseSubscriber):
        def on_done(self, future: Any, **kwargs: Any) -> None:
            stream.close()

    return manager.upload(stream, loc.bucket, key, subscribers=[CloseWhenDone()])


def split_backup_url(url: str) -> tuple[S3Location, str]:
    """(where the backups are, the backup id or ``latest``) of ``s3://BUCKET/PREFIX/BACKUP_ID``."""
    loc = parse_s3_url(url)
    prefix, _, backup_id = loc.prefix.rpartition("/")
    if backup_id != "latest" and not backup_id.startswith("b-"):
        raise StateOpsError(
            f"{url}: no backup id at the end; use s3://BUCKET/PREFIX/BACKUP_ID or .../latest "
            "(see `stateops backups list s3://BUCKET/PREFIX`)"
        )
    return S3Location(loc.bucket, prefix), backup_id


def find_manifest(client: Any, loc: S3Location, backup_id: str) -> dict[str, Any]:
    """The manifest of backup ``backup_id`` under ``loc``, or of the newest for ``latest``."""
    if backup_id != "latest":
        return read_manifest(client, loc, backup_id)
    manifests = read_manifests(client, loc)
    if not manifests:
        raise StateOpsError(f"no backups under {loc}; back the query up first (stateops backup)")
    return manifests[-1]


def read_manifest(client: Any, loc: S3Location, backup_id: str) -> dict[str, Any]:
    from botocore.exceptions import BotoCoreError, ClientError

    key = loc.key("manifests", f"{backup_id}.json")
    try:
        body = client.get_object(Bucket=loc.bucket, Key=key)["Body"].read()
    except (BotoCoreError, ClientError) as err:
        raise s3_error(err, f"read manifest s3://{loc.bucket}/{key}") from None
    try:
        manifest = json.loads(body)
        assert manifest["format"] == FORMAT and isinstance(manifest["files"], list)
    except (ValueError, KeyError, AssertionError, TypeError):
        raise StateOpsError(f"s3://{loc.bucket}/{key}: not a stateops backup manifest") from None
    for i, entry in enumerate(manifest["files"]):
        # Checked here, once, so no caller meets a TypeError deep inside a restore or prune.
        if not _file_entry(entry):
            raise StateOpsError(
                f"s3://{loc.bucket}/{key}: files[{i}] is not a file entry (path and sha256 "
                "strings, size a whole number): the manifest is damaged; use another backup"
            )
    return manifest


def _file_entry(entry: Any) -> bool:
    return (
        isinstance(entry, dict)
        and isinstance(entry.get("path"), str)
        and isinstance(entry.get("sha256"), str)
        and isinstance(entry.get("size"), int)
        and not isinstance(entry.get("size"), bool)
    )


def read_manifests(client: Any, loc: S3Location) -> list[dict[str, Any]]:
    """Every backup manifest under ``loc``, oldest first."""
    from botocore.exceptions import BotoCoreError, ClientError

    try:
        ids = [_name(obj).removesuffix(".json") for obj in _listing(client, loc, "manifests")]
    except (BotoCoreError, ClientError) as err:
        raise s3_error(err, f"list {loc}") from None
    manifests = [read_manifest(client, loc, backup_id) for backup_id in ids]
    return sorted(manifests, key=_age)


def _age(manifest: dict[str, Any]) -> tuple[datetime, str]:
    """A manifest's place among its neighbours, oldest first: when it was written (to the
    second), then when its backup started (the stamp that ends its id): not the id itself,
    which begins with the batch, so that a backup of an older batch taken in the same second
    after a newer one is the later (``latest``, and what ``keep_last`` keeps)."""
    return datetime.fromisoformat(manifest["created_at"]), manifest["backup_id"].rpartition("-")[2]


def read_drills(client: Any, loc: S3Location) -> dict[str, dict[str, Any]]:
    """The restore drill records under ``loc`` (``drills/<backup id>.json``), by backup id."""
    from botocore.exceptions import BotoCoreError, ClientError

    drills = {}
    try:
        for obj in _listing(client, loc, "drills"):
            body = client.get_object(Bucket=loc.bucket, Key=obj["Key"])["Body"].read()
            try:
                record = json.loads(body)
                drills[record["backup_id"]] = record
            except (ValueError, KeyError, TypeError):
                raise StateOpsError(
                    f"s3://{loc.bucket}/{obj['Key']}: not a restore drill record; delete it "
                    "and drill again (stateops drill QUERY)"
                ) from None
    except (BotoCoreError, ClientError) as err:
        raise s3_error(err, f"list the drills of {loc}") from None
    return drills


def write_drill(client: Any, loc: S3Location, record: dict[str, Any]) -> None:
    """Record a restore drill of backup ``record["backup_id"]`` (replacing an earlier one)."""
    from botocore.exceptions import BotoCoreError, ClientError

    key = loc.key("drills", f"{record['backup_id']}.json")
    try:
        client.put_object(Bucket=loc.bucket, Key=key, Body=json.dumps(record, indent=2).encode())
    except (BotoCoreError, ClientError) as err:
        raise s3_error(err, f"write s3://{loc.bucket}/{key}") from None


def _drill_summary(record: dict[str, Any] | None) -> dict[str, Any] | None:
    return record and {k: record[k] for k in ("ok", "drilled_at", "problem")}


def describe_drill(drill: dict[str, Any] | None) -> str:
    """A backup's last drill (``list_backups``'s ``drill``) in a few words."""
    if drill is None:
        return "never drilled"
    if drill["ok"]:
        return f"drill passed {drill['drilled_at']}"
    return f"drill FAILED {drill['drilled_at']}: {drill['problem']}"


def list_backups(url: str, client: Any) -> list[dict[str, Any]]:
    """The backups under ``s3://BUCKET/PREFIX``, oldest first: a summary of each manifest, with
    its last restore drill (``drill``: ok, drilled_at, problem; None: never drilled)."""
    loc = parse_s3_url(url)
    drills = read_drills(client, loc)
    return [
        {k: m[k] for k in ("backup_id", "batch_id", "created_at", "bytes", "query_id")}
        | {"files": len(m["files"]), "drill": _drill_summary(drills.get(m["backup_id"]))}
        for m in read_manifests(client, loc)
    ]


def verify_backup(url: str, client: Any) -> dict[str, Any]:
    """Check every object a backup names: present, and its sha256 as the manifest says."""
    from botocore.exceptions import BotoCoreError, ClientError

    loc, backup_id = split_backup_url(url)
    manifest = find_manifest(client, loc, backup_id)
    problems = []
    for sha in sorted({f["sha256"] for f in manifest["files"]}):
        key = loc.key("objects", sha)
        try:
            if _digest(client.get_object(Bucket=loc.bucket, Key=key)["Body"]) != sha:
                problems.append(f"s3://{loc.bucket}/{key}: content does not match its sha256")
        except ClientError as err:
            problems.append(f"s3://{loc.bucket}/{key}: {s3_error(err, 'get')}")
        except BotoCoreError as err:
            raise s3_error(err, f"verify {url}") from None
    if not problems:
        problems = _damaged_files(manifest, loc, client)
    return {
        "backup_id": manifest["backup_id"],
        "objects": len({f["sha256"] for f in manifest["files"]}),
        "ok": not problems,
        "problems": problems,
    }


def _damaged_files(manifest: dict[str, Any], loc: S3Location, client: Any) -> list[str]:
    """The files of a backup that do not match their checksum sidecar (backed up damaged:
    restore would refuse them), each a line."""
    from botocore.exceptions import BotoCoreError, ClientError

    by_path = {f["path"]: f["sha256"] for f in manifest["files"]}

    def body(sha: str) -> bytes:
        return client.get_object(Bucket=loc.bucket, Key=loc.key("objects", sha))["Body"].read()

    problems = []
    for path, sha in sorted(by_path.items()):
        crc = by_path.get(crc_sidecar(path))
        try:
            problem = crc and verify_crc(body(sha), body(crc))
        except (BotoCoreError, ClientError) as err:
            raise s3_error(err, f"verify s3://{loc.bucket}/{loc.key('objects', sha)}") from None
        if problem:
            problems.append(f"{path}: {problem} (it was damaged when it was backed up)")
    return problems


def _age_seconds(text: str) -> float:
    """``30d``, ``12h``, ``90m``, ``45s`` in seconds."""
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    if len(text) < 2 or text[-1] not in units or not text[:-1].isdigit():
        raise StateOpsError(f"{text!r}: not an age; use e.g. 30d, 12h, 90m")
    return int(text[:-1]) * units[text[-1]]


def prune_backups(
    url: str,
    client: Any,
    *,
    keep_last: int | None = None,
    max_age: str | None = None,
    grace: str = "1h",
    dry_run: bool = False,
    now: datetime | None = None,
) -> dict[str, Any]:
    """Retention: keep the last ``keep_last`` backups and those younger than ``max_age``
    (and always the newest, and the newest that passed a restore drill); then set aside the
    objects no kept manifest names, and delete the drill records of the backups deleted.

    Manifests go first, objects after: an object is set aside only once no manifest that names
    it is left. Unreferenced objects younger than ``grace`` (by the store's clock) are kept: a
    running backup uploads its objects before it writes its manifest.

    A backup may run beside a prune and reuse an object the prune found unreferenced, so an
    object is *set aside* (:func:`_set_aside`), and a backup checks its objects after its
    manifest (:func:`_keep_objects`); ``trash/`` is emptied after ``grace`` (:func:`_empty_trash`).
    """
    from botocore.exceptions import BotoCoreError, ClientError

    if keep_last is None and max_age is None:
        raise StateOpsError("say what to keep: --keep-last K and/or --max-age AGE")
    if keep_last is not None and keep_last < 1:
        raise StateOpsError("--keep-last must be at least 1: the newest backup is always kept")
    loc = parse_s3_url(url)
    now = now or datetime.now(UTC)
    backups = read_manifests(client, loc)
    keep = {b["backup_id"] for b in backups[-(keep_last or 1) :]}
    if max_age is not None:
        oldest = now.timestamp() - _age_seconds(max_age)
        keep |= {
            b["backup_id"]
            for b in backups
            if datetime.fromisoformat(b["created_at"]).timestamp() >= oldest
        }
    drills = read_drills(client, loc)
    passed = [b["backup_id"] for b in backups if drills.get(b["backup_id"], {}).get("ok")]
    kept_for_drill = passed[-1] if passed and passed[-1] not in keep else None
    keep |= set(passed[-1:])
    drop = [b["backup_id"] for b in backups if b["backup_id"] not in keep]
    try:
        referenced = {f["sha256"] for b in backups if b["backup_id"] in keep for f in b["files"]}
        grace_start = _store_time(client, loc) - _age_seconds(grace)
        objects = _listing(client, loc, "objects")
        unreferenced = [
            (obj["Key"], obj["Size"])
            for obj in objects
            if _name(obj) not in referenced and obj["LastModified"].timestamp() < grace_start
        ]
        trash = _listing(client, loc, "trash")
        faults.point("prune")
        back: set[str] = set()
        if not dry_run:
            for backup_id in drop:
                manifest_key = loc.key("manifests", f"{backup_id}.json")
                client.delete_object(Bucket=loc.bucket, Key=manifest_key)
            for backup_id in sorted(drills.keys() - keep):  # after its manifest: never alone
                client.delete_object(Bucket=loc.bucket, Key=loc.key("drills", f"{backup_id}.json"))
            back = _set_aside(client, loc, [key for key, _ in unreferenced])
            present = {_name(obj) for obj in objects}
            back |= _empty_trash(client, loc, trash, referenced - present, grace_start)
    except (BotoCoreError, ClientError) as err:
        raise s3_error(err, f"prune {loc}") from None
    gone = [(key, size) for key, size in unreferenced if key.rpartition("/")[2] not in back]
    return {
        "dry_run": dry_run,
        "kept": sorted(keep),
        "kept_for_drill": kept_for_drill,
        "deleted_backups": drop,
        "deleted_objects": len(gone),
        "put_back": len(back),
        "freed_bytes": sum(size for _, size in gone),
    }


def _set_aside(client: Any, loc: S3Location, keys: list[str]) -> set[str]:
    """Move the objects ``keys`` to ``trash/``, then read the manifests again and put back the
    ones a backup written meanwhile names; their names (sha256)."""
    aside = {}
    for key in keys:
        sha = key.rpartition("/")[2]
        aside[sha] = loc.key("trash", f"{sha}.{new_stamp()}")
        _copy(client, loc, key, aside[sha])
        client.delete_object(Bucket=loc.bucket, Key=key)
    named = {f["sha256"] for b in read_manifests(client, loc) for f in b["files"]}
    for sha in sorted(aside.keys() & named):
        _copy(client, loc, aside[sha], loc.key("objects", sha))
    return aside.keys() & named


def _empty_trash(
    client: Any, loc: S3Location, trash: list[dict], missing: set[str], grace_start: float
) -> set[str]:
    """Delete for good what lies in ``trash/`` since before ``grace_start``, but first put back
    the objects a kept backup names and ``objects/`` lacks (``missing``: set aside by a prune
    killed before its second read of the manifests); their names."""
    back = set()
    for obj in trash:
        sha = _name(obj).partition(".")[0]
        if sha in missing and sha not in back:
            _copy(client, loc, obj["Key"], loc.key("objects", sha))
            back.add(sha)
        elif obj["LastModified"].timestamp() < grace_start:
            client.delete_object(Bucket=loc.bucket, Key=obj["Key"])
    return back


def _copy(client: Any, loc: S3Location, source: str, key: str) -> None:
    client.copy_object(CopySource={"Bucket": loc.bucket, "Key": source}, Bucket=loc.bucket, Key=key)


def _store_time(client: Any, loc: S3Location) -> float:
    """The store's clock (the ``Date`` of a response, read as the end of its whole second), not
    this host's: a prune host whose clock runs ahead must not find a running backup's new
    objects older than the grace."""
    from email.utils import parsedate_to_datetime

    response = client.list_objects_v2(Bucket=loc.bucket, Prefix=loc.key("objects") + "/", MaxKeys=1)
    date = response.get("ResponseMetadata", {}).get("HTTPHeaders", {}).get("date")
    return parsedate_to_datetime(date).timestamp() + 1 if date else time.time()
