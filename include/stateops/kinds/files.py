"""Files in a folder in (json, parquet, csv: Spark's file source), and a folder of per-batch
folders out.

In: Spark's file source logs the files each batch read (``sources/<i>/<batch>``) and counts its
own log entries in the offsets (``{"logOffset": K}``).

Out: batch K of the checkpoint writes ``<path>/batch_id=K+batch_offset`` (overwritten when a
batch runs again: exactly once per batch id); readers skip the folders that start with ``_``
(``_rolled_back``, where a rollback sets later batches aside).
"""

from __future__ import annotations

import io
import json
import re
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any

from stateops.core import faults, fence
from stateops.core.errors import StateOpsError
from stateops.core.storage import S3Path, delete_keys, list_files, location, spark_url
from stateops.kinds.base import Sink, Source, register_sink, register_source
from stateops.kinds.rows import COUNTS, diff_rows, frozen

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

__all__ = ["FILES", "FOLDER"]


class Files:
    name = "files"
    fields = ("path",)
    connector = None
    connection_type = None
    session_conf: dict[str, str] = {}

    def check(self, source: Source) -> None:
        if not source.path:
            raise ValueError(f"a {source.format} source reads a folder: give its path")
        if source.encoding != "json":  # Spark's file readers decode the files by format
            raise ValueError(
                f"encoding {source.encoding} is for kafka sources: a {source.format} source's "
                f"files are read as {source.format}"
            )

    def jars(self, source: Source) -> tuple[str, ...]:
        return ()  # Spark's own readers

    def where(self, source: Source) -> str:
        return source.path

    def brief(self, source: Source) -> dict[str, Any]:
        return {"path": source.path}

    def places(self, source: Source) -> list[str]:
        return [source.path]

    def stream(self, spark: SparkSession, source: Source) -> DataFrame:
        reader = spark.readStream.format(source.format).schema(source.schema_)
        return reader.options(**source.reader_options).load(source.path)


class Folder:
    name = "folder"
    fields = ("path",)
    connector = None
    connection_type = None
    session_conf: dict[str, str] = {}
    exclusive = True

    def check(self, sink: Sink) -> None:
        if not sink.path:
            raise ValueError(f"a {sink.format} sink writes a folder: give its path")

    def where(self, sink: Sink) -> str:
        return sink.path

    def places(self, sink: Sink) -> list[str]:
        return [sink.path]

    def write(self, df: DataFrame, batch_id: int, sink: Sink) -> None:
        df.write.mode("overwrite").format(sink.format).save(
            f"{spark_url(sink.path)}/batch_id={sink.folder_batch(batch_id)}"
        )

    def undo_plan(self, sink: Sink, to_batch: int) -> dict[str, Any]:
        """The batch folders after ``to_batch`` (``batch_id=K``, K the batch plus the sink's
        ``batch_offset``), to move aside. A folder Spark's own file sink wrote (its
        ``_spark_metadata`` log) drops its log entries after ``to_batch`` and moves aside the
        data files only they name. Moved aside is ``<sink>/_rolled_back/<run id>/``: readers
        skip ``_`` folders, and nothing is lost. In S3 the folders are moved object by
        object."""
        return {"format": sink.format, **_plan_folder(sink.path, to_batch, sink.batch_offset)}

    def rewrites(self, sink: Sink, first_batch: int, since_ms: int | None) -> None:
        """Nothing is written twice: a batch that runs again replaces its folder."""
        return None

    def set_aside(self, plan: dict[str, Any], run_id: str, submit: object) -> None:
        """Move the plan's folders and files to ``<sink>/_rolled_back/<run_id>/``."""
        _set_aside(plan, run_id)

    def plan_lines(self, plan: dict[str, Any]) -> list[str]:
        return [
            f"  sink {plan['path']}: move {len(plan['folders'])} batch folders and "
            f"{len(plan['data_files'])} data files aside (_rolled_back/), drop "
            f"{len(plan['log_entries'])} _spark_metadata entries"
        ]

    def undo_hint(self, plan: dict[str, Any]) -> str:
        return f"the sink's batch folders back from {plan['path']}/_rolled_back/RUN_ID"

    def touches(self, plan: dict[str, Any]) -> dict[str, list[Path | S3Path]]:
        """What setting the plan aside deletes, writes and moves (to check it may, first)."""
        root = location(plan["path"])  # in S3: no file modes, the checks skip it
        touched: dict[str, list[Path | S3Path]] = {
            "move": [root / name for name in plan["folders"]]
            + [Path(uri.removeprefix("file:")) for uri in plan["data_files"]],
            "delete": [root / "_spark_metadata" / name for name in plan["log_entries"]],
            "write": [],
        }
        if plan["folders"] or plan["data_files"]:
            touched["write"].append(root / "_rolled_back" / "x")
        return touched

    def mark(self, sink: Sink) -> None:
        """Nothing to remember before a reprocessing: its batches are folders of their own."""
        return None

    def compare(
        self,
        sink: Sink,
        *,
        run_id: str,
        after_batch: int,
        key_columns: list[str],
        mark: object,
        before: dict[str, Any] | None,
    ) -> tuple[list[str], dict[str, Any], dict[str, Any]]:
        """The rows the reprocessing wrote against those the rollback set aside (run
        ``run_id``): the report's lines, its counts and everything found."""
        old = location(sink.path) / "_rolled_back" / run_id
        diff = diff_output(sink.path, old, sink.folder_batch(after_batch), key_columns)
        keys = ", ".join(key_columns) or "whole rows"
        lines = [
            f"batches {diff['batches_before']} -> {diff['batches_after']}: "
            f"{diff['rows_before']} rows before, {diff['rows_after']} after; "
            f"{diff['unchanged']} unchanged, {diff['added']} added, {diff['removed']} removed, "
            f"{diff['changed_keys']} keys changed (by {keys}); the old output is kept in {old}"
        ]
        lines += [f"  changed {line}" for line in diff["examples"]]
        return lines, {k: diff[k] for k in COUNTS}, diff


def _plan_folder(sink: str, to_batch: int, batch_offset: int) -> dict[str, Any]:
    root = location(sink)
    if isinstance(root, S3Path):
        names = root.top_level()
        if "_spark_metadata" in names:
            raise StateOpsError(
                f"{root}: a Spark file sink (its _spark_metadata log) in S3 cannot be rolled "
                "back by stateops yet; nothing changed: use a per-batch sink (the registry's "
                "folder sinks) or move the sink's later files aside by hand"
            )
        later = [n for n in names if n.startswith("batch_id=")]
        folders = sorted(n for n in later if int(n.split("=", 1)[1]) > to_batch + batch_offset)
        return {"path": str(root), "folders": folders, "log_entries": [], "data_files": []}
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


def _set_aside(plan: dict[str, Any], run_id: str) -> None:
    root = location(plan["path"])
    aside = root / "_rolled_back" / run_id
    if isinstance(root, S3Path):
        for name in plan["folders"]:
            faults.point("move")
            fence.guard()
            _move_s3(root, name, aside)
        return
    for name in plan["folders"]:
        faults.point("move")
        fence.guard()
        aside.mkdir(parents=True, exist_ok=True)
        if (root / name).exists():
            (root / name).rename(aside / name)
    for name in plan["log_entries"]:  # newest first, like the checkpoint's logs
        faults.point("delete")
        fence.guard()
        (root / "_spark_metadata" / name).unlink(missing_ok=True)
    for uri in plan["data_files"]:
        faults.point("move")
        fence.guard()
        src = Path(uri.removeprefix("file:"))
        if src.exists():
            dest = aside / src.relative_to(root)
            dest.parent.mkdir(parents=True, exist_ok=True)
            src.rename(dest)


def _move_s3(root: S3Path, folder: str, aside: S3Path) -> None:
    """``root/folder`` to ``aside/folder`` in S3, which has no rename: each object copied
    server-side (boto3's managed copy, as a backup's: in parts above its threshold, so an
    object over CopyObject's 5 GB too), then the originals deleted, S3A's directory markers
    with them (a kill in between leaves both, never neither; the next run copies again what
    is left)."""
    source = root / folder
    keys = sorted(source._list(source.key + "/", delimiter=False, markers=True)[0])
    for key in keys:
        if not key.endswith("/"):
            dest = aside / folder / key[len(source.key) + 1 :]
            root._client.call(
                f"copy s3://{root.bucket}/{key} to {dest}",
                "copy",
                Bucket=dest.bucket,
                Key=dest.key,
                CopySource={"Bucket": root.bucket, "Key": key},
            )
    delete_keys(root, keys)


def diff_output(
    sink: str | Path,
    rolled_back: str | Path | S3Path,
    after_batch: int,
    key_columns: list[str],
) -> dict[str, Any]:
    """What reprocessing changed: the output moved aside by the rollback (``rolled_back``,
    its ``batch_id=K`` folders) against the new ``batch_id=K`` folders after ``after_batch``
    (:func:`stateops.kinds.rows.diff_rows`)."""
    before = _rows(location(rolled_back), lambda k: True)
    after = _rows(location(sink), lambda k: k > after_batch)
    return {
        "batches_before": before["batches"],
        "batches_after": after["batches"],
        **diff_rows(before["rows"], after["rows"], key_columns),
    }


def _rows(folder: Path | S3Path, wanted) -> dict[str, Any]:
    """The rows of the ``batch_id=K`` folders under ``folder`` (local or in S3) whose K is
    ``wanted``."""
    rows: Counter = Counter()
    files: dict[int, list[str]] = {}
    listed = isinstance(folder, S3Path) or folder.is_dir()  # S3: a missing prefix lists empty
    for rel in sorted(list_files(folder)) if listed else []:
        top, _, name = rel.partition("/")
        if top.startswith("batch_id=") and "/" not in name:
            files.setdefault(int(top.split("=", 1)[1]), []).append(rel)
    batches = sorted(b for b in files if wanted(b))
    for batch in batches:
        rows.update(frozen(r) for r in _read_batch(folder, files[batch]))
    return {"rows": rows, "batches": batches}


def _read_batch(folder: Path | S3Path, rels: list[str]) -> list[dict]:
    """A batch folder's rows: its Parquet files, else its JSON lines files."""
    parquet = [rel for rel in rels if rel.endswith(".parquet")]
    if parquet:
        import pyarrow.parquet as pq

        return [
            r
            for rel in parquet
            for r in pq.read_table(io.BytesIO((folder / rel).read_bytes())).to_pylist()
        ]
    return [
        json.loads(line)
        for rel in rels
        if rel.endswith(".json")
        for line in (folder / rel).read_text(encoding="utf-8").splitlines()
        if line.strip()
    ]


FILES = register_source(Files(), "json", "parquet", "csv")
FOLDER = register_sink(Folder(), "parquet", "json")
