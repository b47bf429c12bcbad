"""Checkpoint files written: a restart set copied into a new folder that Spark can run from, and
a copied or restored checkpoint's operator metadata pointed at its own schema files.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from stateops.core import storage
from stateops.core.checkpoint import Checkpoint, load_checkpoint
from stateops.core.errors import CheckpointError
from stateops.core.formats import crc_sidecar, hadoop_crc
from stateops.core.staging import occupied
from stateops.core.storage import S3Path

__all__ = [
    "copy_restart_set",
    "relocate_checkpoint",
    "relocated_metadata",
    "schema_url",
]


def copy_restart_set(cp: Checkpoint, batch: int, dest: str | os.PathLike[str]) -> list[str]:
    """Copy the files a restart after ``batch`` needs into a new folder that Spark can run from.

    Operator metadata v2 (transformWithState) names its schema files by absolute path; a plain
    copy would keep reading (or fail on) the old folder, so those paths are rewritten to ``dest``
    and the rewritten files get fresh ``.crc`` sidecars. Returns the copied relative paths.
    """
    dest = Path(dest)
    if occupied(dest):
        raise CheckpointError(f"{dest}: not empty; copy a checkpoint into a new or empty folder")
    files = cp.restart_files(batch)
    for rel in files:
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(cp.root / rel, target)
    relocate_checkpoint(dest)
    return files


def relocate_checkpoint(
    root: str | os.PathLike[str], location: str | os.PathLike[str] | None = None
) -> list[str]:
    """Point the operator metadata v2 files of a copied checkpoint at its own schema files.

    ``transformWithState`` metadata names ``_stateSchema`` files by absolute path: after a copy
    or a restore they still name the old folder. ``location`` is where the checkpoint will
    live (default: ``root``; a restore stages elsewhere, then renames). Returns the rewritten
    relative paths.
    """
    root = Path(root).resolve()
    location = storage.location(location).resolve() if location is not None else root
    cp = load_checkpoint(root)
    rewritten = []
    for op in cp.operators:
        for key, rel in op.metadata_files.items():
            if key is not None:
                _relocate_schema_paths(root, rel, op.operator_id, location)
                rewritten.append(rel)
    return rewritten


def relocated_metadata(text: str, op_id: int, location: Path | S3Path) -> bytes:
    """An operator metadata v2 file's content with its schema paths under ``location`` (in
    S3, as Spark's S3A connector names them: ``s3a://``)."""
    header, _, body = text.partition("\n")
    meta = json.loads(body.split("\n")[0])
    marker = f"/state/{op_id}/_stateSchema/"
    url = schema_url(location)
    for info in meta.get("stateStoreInfo", []):
        info["stateSchemaFilePaths"] = [
            f"{url}{marker}{str(p).rpartition(marker)[2]}"
            for p in info.get("stateSchemaFilePaths") or []
        ]
    return (header + "\n" + json.dumps(meta, separators=(",", ":"))).encode("utf-8")


def schema_url(location: Path | S3Path) -> str:
    """How Spark names a checkpoint location in operator metadata: ``file:/PATH``, or for S3
    ``s3a://BUCKET/KEY`` (its S3A connector)."""
    return f"file:{location.resolve()}" if isinstance(location, Path) else f"s3a{str(location)[2:]}"


def _relocate_schema_paths(root: Path, rel: str, op_id: int, location: Path | S3Path) -> None:
    path = root / rel
    data = relocated_metadata(path.read_text(encoding="utf-8"), op_id, location)
    path.write_bytes(data)
    crc = root / crc_sidecar(rel)
    if crc.exists():
        crc.write_bytes(hadoop_crc(data))
