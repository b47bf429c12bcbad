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
import os
import re
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any

from stateops.core import faults, fence
from stateops.core.errors import StateOpsError, about
from stateops.core.model import schema_fields
from stateops.core.storage import S3Path, delete_keys, list_files, location, spark_url
from stateops.kinds.base import Checkpoint, Sink, Source, register_sink, register_source
from stateops.kinds.rows import COUNTS, diff_rows, frozen

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

__all__ = ["FILES", "FILE_START", "FOLDER", "files_format", "folder_files", "log_offset"]


# A file source that has read nothing: -1 is "before the first" entry of its (empty) log.
FILE_START = '{"logOffset":-1}'


def log_offset(raw: object) -> int | None:
    """A file source's ``logOffset`` in an offsets entry; None where ``raw`` is not one."""
    if isinstance(raw, dict) and "logOffset" in raw:
        return int(raw["logOffset"])
    return None


class Files:
    """Spark's file source: its entry ``{"logOffset": K}`` counts its own log's entries, which
    name the files each batch read; its files stay readable while they are in the folder (no
    broker to ask), and what waits is the files in the folder its log does not name."""

    name = "files"
    fields = ("path",)
    connector = None
    connection_type = None
    session_conf: dict[str, str] = {}
    positioned = False  # a new checkpoint reads every file its (empty) log does not name
    logs_start = False
    cuts_at_time = True  # a cutover run reads the files modified before the cutover
    expires = False
    starts = ()
    kept = ()
    replay = ("with every input file still in its source folder", "", "file")
    place = "path"  # the migration form's new_source_path
    noun = "folder"
    carried = ("maxFilesPerTrigger", "maxBytesPerTrigger", "maxFileAge", "latestFirst")

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

    # --- its entry in a checkpoint: {"logOffset": K}

    def claims(self, raw: object) -> bool:
        return log_offset(raw) is not None

    def matches(self, source: Source, raw: object) -> None:
        return None  # the entry names no folder (the transplant matches the files it read)

    def goes_on(self, source: Source, cp: Checkpoint, batch: int, index: int) -> bool:
        """``source`` reads on from source ``index`` of ``cp``: that is a file source (its
        entry in ``batch`` a ``logOffset``, or none yet) whose every logged file lies in
        ``source``'s folder."""
        raw = cp.entry(batch, index)
        if raw is not None and not self.claims(raw):
            return False
        seen = [Path(f) for f in cp.seen_files(index)]
        return bool(seen) and all(f.is_relative_to(source.path) for f in seen)

    def stand_in(self, raw: object) -> None:
        return None

    def initial(self, text: str) -> None:
        return None  # its sources/<i>/0 is its own log's first entry, not a start

    def initial_log(self, entry: str) -> None:
        return None  # its log starts empty

    def start_entry(self, source: Source, at: str | int | None) -> str:
        return FILE_START  # before its first file: it reads every file its log does not name

    def start_of(self, source: Source, query: str) -> str:
        return FILE_START

    def unreadable(self, source: Source, raw: object) -> str:
        return ""  # not tracked: a file read again is still in the folder, or the run says so

    def rewind(self, source: Source, raw: object, newest: object) -> None:
        return None  # its log is rolled back with the checkpoint; the plan lists the files

    def older(
        self,
        cp: Checkpoint,
        batch: int,
        index: int,
        source: Source | None,
        limit_ms: float,
        memo: dict[str, Any],
    ) -> bool:
        """Whether every file batch ``batch`` read was modified before ``limit_ms`` (as the
        file source logged their times)."""
        return all(f["timestamp"] < limit_ms for f in cp.input_files(batch, index))

    def unread(self, source: Source, raw: object) -> str:
        return ""  # a drain reads every file of the folder

    def goes_back(self, before: object, after: object) -> list[str]:
        return []  # its log is checked with the checkpoint's files

    def entry_text(self, raw: object) -> str:
        return f"logOffset {log_offset(raw)}"

    def require(self, source: Source) -> None:
        return None

    def batch_read(
        self, spark: SparkSession, source: Source, cp: Checkpoint, batch: int, index: int
    ) -> tuple[DataFrame, list[str]]:
        """The files batch ``batch`` read from source ``index`` (as its log names them), read
        again with the source's format, schema and options."""
        files = [f["path"] for f in cp.input_files(batch, index)]
        if not files:
            return spark.createDataFrame([], source.schema_), []
        reader = spark.read.format(source.format).schema(source.schema_)
        return reader.options(**source.reader_options).load(files), files

    # --- a migration to a new folder

    def same_place(self, a: Source, b: Source) -> bool:
        return (a.format, a.path) == (b.format, b.path)

    def recognizes(self, source: dict[str, Any]) -> bool:
        return False  # any folder: the kind a folder is when no other kind knows it

    def inputs(self, source: dict[str, Any], options: dict[str, Any]) -> list[Any]:
        """The files Spark would read in the new source's local folder, each with the format
        its first bytes tell (:func:`folder_files`; none in S3)."""
        path = str(source.get("path") or "")
        return folder_files(Path(path), options) if path and "://" not in path else []

    def auto_format(self, source: dict[str, Any], inputs: list[Any]) -> str:
        """The format of the files in the new folder (``parquet`` while there are none)."""
        return files_format(Path(str(source.get("path") or "")), inputs)

    def check_new(
        self, source: Source, *, query: str, others: dict[str, Source], inputs: list[Any]
    ) -> int:
        """Refuse a new folder the query cannot run on (``others``: the query's other
        sources; ``inputs``: :meth:`inputs`): the number of its input files."""
        folder = Path(source.path)
        if not folder.is_dir():
            raise StateOpsError(
                f"new source path {folder} does not exist or is not a folder: create it and "
                "land the new source's input there, then trigger again"
            )
        for other, kept in others.items():
            there = Path(kept.path)
            if kept.path and (
                folder == there or there in folder.parents or folder in there.parents
            ):
                raise StateOpsError(
                    f"new source folder {folder} overlaps the folder of {query}'s source "
                    f"{other} ({there}): land the new source's input in a folder of its own"
                )
        files = sum(1 for p in folder.iterdir() if not p.name.startswith((".", "_")))
        if not files:
            raise StateOpsError(
                f"new source folder {folder} has no input yet: land its first files (the "
                "carry-over is proven on the new source's first batch), then trigger again"
            )
        with about("new_source_format"):
            _check_format(source, inputs)
        return files

    def check_input(self, source: Source, inputs: list[Any]) -> None:
        """Parquet files carry their schema: the first one must have the declared columns."""
        _check_files(source, inputs)

    def starting(self, source: Source, entry: str) -> Source:
        return source  # it starts before its first file, whatever its options

    def position(self, source: Source, raw: object, close: float) -> None:
        return None  # what waits is said by :meth:`waiting`

    def findings(self, query: str, part: dict[str, Any], limits: Any) -> list[tuple[str, str]]:
        return []

    def waiting(self, source: Source, cp: Checkpoint, index: int) -> list[float] | None:
        """The modification times of the files in a local folder that the checkpoint's log
        (of its source ``index``) does not name; None for a folder in S3 (not listed for
        this)."""
        folder = Path(source.path)
        if "://" in source.path or not folder.is_dir():
            return None
        seen = cp.seen_files(index)
        return [
            f.stat().st_mtime
            for f in folder.iterdir()
            if f.is_file() and not f.name.startswith((".", "_")) and str(f) not in seen
        ]

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

    def require(self, sink: Sink) -> None:
        return None  # nothing to ask before a run: its place is made as it writes

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


_ARROW_TYPES = {
    "string": "STRING",
    "large_string": "STRING",
    "bool": "BOOLEAN",
    "int32": "INT",
    "int64": "BIGINT",
    "float": "FLOAT",
    "double": "DOUBLE",
    "date32[day]": "DATE",
}


# How a file's first bytes tell its format: Parquet starts (and ends) with PAR1; a JSON lines
# record starts with '{' (a JSON document with '[' too); other text is read as CSV.
_PARQUET_MAGIC = b"PAR1"
_GZIP_MAGIC = b"\x1f\x8b"


def _file_format(path: Path) -> str | None:
    """``parquet``, ``json`` or ``csv`` by the first bytes of ``path`` (of a gzip file, by its
    content: Spark's text readers decompress it), or None where they do not tell (an empty
    file, another binary format or compression)."""
    with path.open("rb") as f:
        head = f.read(4096)
        if head.startswith(_PARQUET_MAGIC):  # and a whole file, not one still being written
            f.seek(max(f.seek(0, os.SEEK_END) - 4, 4))
            return "parquet" if f.read(4) == _PARQUET_MAGIC else None
    if head.startswith(_GZIP_MAGIC):
        import gzip
        import zlib

        try:
            with gzip.open(path, "rb") as f:
                head = f.read(4096)
        except (OSError, EOFError, zlib.error):
            return None
    text = head.lstrip(b"\xef\xbb\xbf \t\r\n")
    if not text or b"\x00" in text:
        return None
    return "json" if text[:1] in (b"{", b"[") else "csv"


def folder_files(folder: Path, options: dict[str, Any]) -> list[tuple[Path, str | None]]:
    """The files Spark's file source would read in ``folder`` (names starting with ``.`` or
    ``_`` left out, ``pathGlobFilter`` applied), each with the format its first bytes tell;
    refused when the filter leaves none of its files."""
    import fnmatch

    if not folder.is_dir():
        return []
    glob = next((str(v) for k, v in options.items() if k.lower() == "pathglobfilter"), "*")
    patterns = _glob_alternatives(glob)
    files = [
        p
        for p in sorted(folder.rglob("*"))
        if p.is_file()
        and not any(part.startswith((".", "_")) for part in p.relative_to(folder).parts)
    ]
    kept = [p for p in files if any(fnmatch.fnmatch(p.name, g) for g in patterns)]
    if files and not kept:
        with about("new_source_options"):
            raise StateOpsError(
                f"pathGlobFilter {glob!r} matches none of the {len(files)} files in {folder} "
                f"(e.g. {files[0].name}): fix the filter, or land files it matches"
            )
    return [(p, _file_format(p)) for p in kept]


def _glob_alternatives(glob: str) -> list[str]:
    """Hadoop's glob alternatives (``*.{json,jsonl}``) as patterns ``fnmatch`` takes."""
    found = re.search(r"\{([^{}]*)\}", glob)
    if found is None:
        return [glob]
    head, tail = glob[: found.start()], glob[found.end() :]
    return [g for alt in found.group(1).split(",") for g in _glob_alternatives(head + alt + tail)]


def files_format(folder: Path, files: list[tuple[Path, str | None]]) -> str:
    """The format of the input files in ``folder`` (``files``: :func:`folder_files`), for a
    new source given without one; ``parquet`` while there are none (the folder's checks then
    say what to do)."""
    kinds = {kind: path for path, kind in reversed(files) if kind is not None}
    with about("new_source_format"):
        if len(kinds) > 1:
            found = " and ".join(
                f"{kind} files ({path.name})" for kind, path in sorted(kinds.items())
            )
            raise StateOpsError(
                f"{folder} holds {found}: land one format in the new source's folder"
            )
        if not kinds and any(path.stat().st_size for path, _ in files):
            raise StateOpsError(
                f"the files in {folder} ({files[0][0].name}, ...) are not parquet, JSON or CSV "
                "by their first bytes: give the new source's format (--new-source-format)"
            )
    return next(iter(kinds), "parquet")


def _check_format(source: Source, files: list[tuple[Path, str | None]]) -> None:
    """Every input file in the new source's folder (``files``: :func:`folder_files`) is in its
    format, as far as its first bytes tell: Spark would otherwise fail at the first batch,
    after the old query was stopped and drained."""
    for path, kind in files:
        if kind is not None and kind != source.format:
            raise StateOpsError(
                f"{path} is a {kind} file, but the new source's format is {source.format}: "
                f"give the format of its files (--new-source-format {kind}), or land only "
                f"{source.format} files there"
            )


def _check_files(source: Source, files: list[tuple[Path, str | None]]) -> None:
    """Parquet files carry their schema: the first one must have the declared columns."""
    if source.format != "parquet":
        return
    import pyarrow.parquet as pq

    first = next((path for path, kind in files if kind == "parquet"), None)
    if first is None:
        return
    found = {f.name: _ARROW_TYPES.get(str(f.type), str(f.type)) for f in pq.read_schema(first)}
    for column, kind in schema_fields(source.schema_):
        have = found.get(column)
        if have is None:
            raise StateOpsError(f"{first}: no column {column!r} (the new source schema has it)")
        if have != kind and not (kind == "TIMESTAMP" and have.startswith("timestamp")):
            raise StateOpsError(f"{first}: column {column!r} is {have}, not {kind}")
