"""A Delta Lake table in and out (``format: delta``, ``path``: a folder, local or in S3).

In: Delta's own streaming source (:class:`DeltaSource`). Its entry in a checkpoint names the
table's id and a version; the lag is in versions; a version whose commit the log cleaned up,
or whose data files VACUUM deleted, is input a restart can no longer read.

Out: written by Delta's own writer from Spark's ``foreachBatch``.

Exactly once: each batch is appended in one Delta transaction that records the writer's
application id and the batch (Delta's idempotent writes, ``txnAppId`` and ``txnVersion``): a
batch that runs again after it committed is skipped by Delta itself. The table is the query's
alone to write, as its checkpoint is (the query's lease); others may read it.

Rolled back with the checkpoint: the table's versions after batch N are undone with Delta's
own RESTORE, to the last version whose table held batches up to N, and the writer takes a new
application id (the table property ``stateops.appId``, set after the RESTORE): RESTORE keeps
the batch Delta recorded for the old id, and Delta would skip the batches written again
(delta-io/delta#1813). Refused, changing nothing, when another writer changed the table's
rows after that version (RESTORE would undo them too), when the log no longer holds the
commits in between (``delta.logRetentionDuration``), or when the files that version needs
were vacuumed. The plan is read from the table's log (``_delta_log``) here; the RESTORE runs
in Spark (:func:`restore`, the ``undo_sink.py`` job).
"""

from __future__ import annotations

import io
import json
import re
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote, urlsplit

from stateops.core.errors import StateOpsError, query_error_line
from stateops.core.model import schema_fields
from stateops.core.storage import S3Path, list_files, location, spark_url
from stateops.core.times import parse_time
from stateops.kinds.base import (
    Checkpoint,
    Sink,
    Source,
    register_sink,
    register_source,
)
from stateops.kinds.rows import COUNTS, diff_rows, frozen

if TYPE_CHECKING:
    from collections.abc import Callable

    from pyspark.sql import DataFrame, SparkSession

__all__ = ["APP_ID_PROPERTY", "DELTA", "DELTA_SOURCE", "SQL_CONF", "restore"]

CONNECTOR = "delta-spark"
# The table property that names the application id the writer's transactions record; absent:
# FIRST_APP_ID. Every id the writer takes starts with FIRST_APP_ID.
APP_ID_PROPERTY = "stateops.appId"
FIRST_APP_ID = "stateops"
# A commit of the undo (its RESTORE and its property) says so in its commitInfo.userMetadata.
_UNDO = "stateops undo "
_COMMIT = re.compile(r"(\d{20})\.json")
_CHECKPOINT = re.compile(r"(\d{20})\.checkpoint(\.\d+\.\d+)?\.parquet")

# What a session needs for Delta's SQL (RESTORE, DESCRIBE HISTORY, ALTER TABLE), set as it starts.
SQL_CONF = {
    "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
    "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
}


class DeltaSink:
    name = "delta"
    fields = ("path",)
    connector = CONNECTOR
    connection_type = None
    session_conf = SQL_CONF  # Delta's writer and its SQL (RESTORE, history) need both
    exclusive = True

    def check(self, sink: Sink) -> None:
        if not sink.path:
            raise ValueError("a delta sink writes a table: give its path (a folder)")

    def require(self, sink: Sink) -> None:
        return None  # nothing to ask before a run: its place is made as it writes

    def where(self, sink: Sink) -> str:
        return sink.path

    def places(self, sink: Sink) -> list[str]:
        return [sink.path]

    def write(self, df: DataFrame, batch_id: int, sink: Sink) -> None:
        """Append the batch in one transaction recording (application id, batch): Delta skips
        it if that batch of that id committed already."""
        url = spark_url(sink.path)
        app_id = _properties(df.sparkSession, url).get(APP_ID_PROPERTY, FIRST_APP_ID)
        (
            df.write.format("delta")
            .mode("append")
            .option("txnAppId", app_id)
            .option("txnVersion", sink.folder_batch(batch_id))
            .save(url)
        )

    def undo_plan(self, sink: Sink, to_batch: int) -> dict[str, Any]:
        """The table version to restore (``restore_to``: the newest version whose table held
        the writer's batches up to ``to_batch`` and none after; None: nothing to undo) and
        what that undoes, read from the table's log back from its newest commit. Whatever it
        says, an existing table gets a new application id (:meth:`set_aside`)."""
        log = _Log(sink.path)
        plan: dict[str, Any] = {"format": sink.format, "path": str(log.root), "restore_to": None}
        if not log.versions:
            return {**plan, "latest": None}
        latest, batch = log.versions[-1], sink.folder_batch(to_batch)
        plan["latest"] = latest
        restore_to = None
        for version in reversed(log.versions):
            last = log.last_batch(version)
            if last is not None and last <= batch:
                restore_to = version
                break
            if last is None or version == log.versions[0] != 0:  # the log stops short of it
                raise StateOpsError(
                    f"{log.root}: the table's log no longer holds the version after batch "
                    f"{to_batch} (its older commits were cleaned up: "
                    "delta.logRetentionDuration); nothing changed: the table cannot be rolled "
                    "back that far"
                )
        if restore_to is None:
            raise StateOpsError(
                f"{log.root}: the table's first version holds batches after {to_batch}; "
                "nothing changed: roll back to a later batch"
            )
        if restore_to == latest:
            return plan  # nothing of the writer's after the batch
        later = [log.commit(v) for v in log.versions if v > restore_to]
        others = [c for c in later if not c.ours]
        changed = [c for c in others if c.changes_rows]
        if changed:
            c = changed[0]
            raise StateOpsError(
                f"{log.root}: version {c.version} ({c.info.get('operation', 'a commit')}) was "
                f"written by another writer after batch {to_batch}, and Delta's RESTORE would "
                "undo its rows too; nothing changed: undo it by hand, or roll back to a "
                "later batch"
            )
        missing = log.missing_files(later)
        if missing:
            raise StateOpsError(
                f"{log.root}: {len(missing)} data files of version {restore_to} were vacuumed "
                f"(e.g. {missing[0]}); nothing changed: the table cannot be restored to batch "
                f"{to_batch}"
            )
        removed = {r["path"] for c in later for r in c.removes}
        live = [a for c in later if c.batch is not None for a in c.adds if a["path"] not in removed]
        return {
            **plan,
            "restore_to": restore_to,
            "batches": [log.last_batch(restore_to), log.last_batch(latest)],
            "rows": sum(json.loads(a.get("stats") or "{}").get("numRecords", 0) for a in live),
            "others": [f"{c.version} {c.info.get('operation', '')}".strip() for c in others],
        }

    def rewrites(self, sink: Sink, first_batch: int, since_ms: int | None) -> None:
        """Nothing is written twice: the undone versions are gone from the table."""
        return None

    def set_aside(
        self, plan: dict[str, Any], run_id: str, submit: Callable[[str, list[str]], None]
    ) -> None:
        """Delta's RESTORE and the writer's new application id, in Spark (the
        ``undo_sink.py`` job, :func:`restore`); run again after a kill, it finishes it. The
        new id is set even with nothing to restore: the table cannot say cheaply which batch
        Delta recorded for the old one (a kill between an earlier RESTORE and its new id, a
        batch written after its checkpoint was rolled back), and a new id has none."""
        if plan["latest"] is not None:
            submit("undo_sink.py", ["--plan", json.dumps(plan), "--run-id", run_id])

    def plan_lines(self, plan: dict[str, Any]) -> list[str]:
        if plan["latest"] is None:
            return [f"  sink {plan['path']} (Delta): no table yet, nothing to undo"]
        if plan["restore_to"] is None:
            return [f"  sink {plan['path']} (Delta): nothing to undo; a new application id"]
        first, last = plan["batches"][0] + 1, plan["batches"][1]
        also = f"; also undoes {', '.join(plan['others'])}" if plan["others"] else ""
        return [
            f"  sink {plan['path']} (Delta): RESTORE to version {plan['restore_to']} (of "
            f"{plan['latest']}), undoing batches {first}..{last} ({plan['rows']} rows) and a "
            f"new application id{also}"
        ]

    def undo_hint(self, plan: dict[str, Any]) -> str:
        if plan["restore_to"] is None:
            return "nothing of the table's (it keeps its rows; its writer has a new id)"
        return (
            f"the table back with RESTORE TABLE delta.`{spark_url(plan['path'])}` TO VERSION "
            f"AS OF {plan['latest']}"
        )

    def touches(self, plan: dict[str, Any]) -> dict[str, list[Path | S3Path]]:
        return {"move": [], "delete": [], "write": [location(plan["path"]) / "_delta_log" / "x"]}

    def mark(self, sink: Sink) -> dict[str, int | None]:
        """The table's version now: the reprocessing's commits come after it."""
        versions = _Log(sink.path).versions
        return {"version": versions[-1] if versions else None}

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
        """The rows the rollback's RESTORE took out of the table (its commit's removed files,
        less those it put back) against the rows the reprocessing's commits added since
        ``mark``."""
        log = _Log(sink.path)
        since = mark.get("version") if isinstance(mark, dict) else None
        undo: list[_Commit] = []
        for version in reversed([v for v in log.versions if since is None or v <= since]):
            c = log.commit(version)  # back from the mark (the rollback's end) to its RESTORE
            if c.restore and c.info.get("userMetadata") == _UNDO + run_id:
                undo = [c]
                break
        after_commits = [log.commit(v) for v in log.versions if since is None or v > since]
        old = log.rows(undo, removed=True) - log.rows(undo, removed=False)
        new = log.rows(after_commits, removed=False) - log.rows(after_commits, removed=True)
        diff = diff_rows(old, new, key_columns)
        keys = ", ".join(key_columns) or "whole rows"
        kept = (
            f"the old rows stay readable in the table's versions before {undo[0].version} "
            f"(restored to {undo[0].restored_to})"
            if undo
            else "the rollback restored nothing"
        )
        lines = [
            f"{diff['rows_before']} rows before, {diff['rows_after']} after; "
            f"{diff['unchanged']} unchanged, {diff['added']} added, {diff['removed']} removed, "
            f"{diff['changed_keys']} keys changed (by {keys}); {kept}"
        ]
        lines += [f"  changed {line}" for line in diff["examples"]]
        return lines, {k: diff[k] for k in COUNTS}, diff


def _properties(spark: SparkSession, url: str) -> dict[str, str]:
    """The table's properties (none: no table there yet), from Delta's own log reader."""
    from pyspark.sql import DataFrame

    tables = spark._jvm.io.delta.tables.DeltaTable  # noqa: SLF001 (Delta's API from PySpark)
    if not tables.isDeltaTable(spark._jsparkSession, url):  # noqa: SLF001
        return {}
    detail = DataFrame(tables.forPath(spark._jsparkSession, url).detail(), spark)  # noqa: SLF001
    return dict(detail.first()["properties"] or {})


def restore(spark: SparkSession, url: str, plan: dict[str, Any], run_id: str) -> dict[str, Any]:
    """Carry out :meth:`DeltaSink.undo_plan`'s ``plan`` (run ``run_id``) on the table at
    ``url`` (as Spark names it; ``spark`` set to reach it, and started with :data:`SQL_CONF`
    as every session is where Delta's jar is): RESTORE to its version, then the writer's new
    application id; each commit says it is the undo's (``userMetadata``). A step done before
    a kill is not done again; a table written since the plan is refused, nothing changed."""
    app_id, mark = f"{FIRST_APP_ID}-{run_id}", _UNDO + run_id
    if _properties(spark, url).get(APP_ID_PROPERTY) == app_id:
        return {"restored": False, "app_id": app_id}
    table = f"delta.`{url}`"
    restore = plan["restore_to"] is not None
    if restore:  # done before a kill? the undo's RESTORE among the commits since the plan
        since = spark.sql(f"DESCRIBE HISTORY {table}").where(f"version > {int(plan['latest'])}")
        done = since.where(f"operation = 'RESTORE' AND userMetadata = '{mark}'").count() > 0
        if not done and since.count():
            newest = since.agg({"version": "max"}).first()[0]
            raise StateOpsError(
                f"{plan['path']}: the table was written since the plan (version {newest}, the "
                f"plan read {plan['latest']}); nothing changed in it: plan again"
            )
        restore = not done
    spark.conf.set("spark.databricks.delta.commitInfo.userMetadata", mark)
    try:
        if restore:
            spark.sql(f"RESTORE TABLE {table} TO VERSION AS OF {int(plan['restore_to'])}")
        spark.sql(f"ALTER TABLE {table} SET TBLPROPERTIES ('{APP_ID_PROPERTY}' = '{app_id}')")
    except Exception as err:  # Delta's refusal, as a line: the rollback resumes when run again
        raise StateOpsError(
            f"{plan['path']}: Delta refused the undo: {query_error_line(err)}; the checkpoint "
            "is rolled back, and the rollback finishes the table when it runs again"
        ) from None
    finally:
        spark.conf.unset("spark.databricks.delta.commitInfo.userMetadata")
    return {"restored": restore, "app_id": app_id}


class _Commit:
    """One commit of the table's log, as its actions say."""

    def __init__(self, version: int, actions: list[dict[str, Any]]) -> None:
        self.version = version
        infos = [a["commitInfo"] for a in actions if "commitInfo" in a]
        self.info: dict[str, Any] = infos[0] if infos else {}
        self.txn = [a["txn"] for a in actions if "txn" in a]
        self.adds = [a["add"] for a in actions if "add" in a]
        self.removes = [a["remove"] for a in actions if "remove" in a]
        self.actions = actions

    @property
    def batch(self) -> int | None:
        """The writer's batch it appended (None: not one)."""
        mine = [t["version"] for t in self.txn if str(t["appId"]).startswith(FIRST_APP_ID)]
        return mine[0] if mine else None

    @property
    def ours(self) -> bool:
        """A batch of the writer, or a commit of an undo."""
        return self.batch is not None or str(self.info.get("userMetadata", "")).startswith(_UNDO)

    @property
    def restore(self) -> bool:
        return self.info.get("operation") == "RESTORE"

    @property
    def restored_to(self) -> int | None:
        """The version a RESTORE restored (None: not said, as for one to a timestamp)."""
        version = self.info.get("operationParameters", {}).get("version")
        return int(version) if str(version).isdigit() else None

    @property
    def changes_rows(self) -> bool:
        return any(a.get("dataChange", True) for a in self.adds + self.removes)


class _Log:
    """A Delta table's log (``<path>/_delta_log``), its JSON commits read as needed."""

    def __init__(self, path: str) -> None:
        self.root = location(path)
        self.dir = self.root / "_delta_log"
        listed = isinstance(self.dir, S3Path) or self.dir.is_dir()
        names = [rel for rel in list_files(self.dir)] if listed else []
        self.versions = sorted(int(m.group(1)) for n in names if (m := _COMMIT.fullmatch(n)))
        self.checkpoints: dict[int, list[str]] = {}  # Delta's own checkpoints of the log
        for n in sorted(names):
            if m := _CHECKPOINT.fullmatch(n):
                self.checkpoints.setdefault(int(m.group(1)), []).append(n)
        self._present = set(self.versions)
        self._commits: dict[int, _Commit] = {}
        self._last: dict[int, int | None] = {}

    def commit(self, version: int) -> _Commit:
        if version not in self._commits:
            text = (self.dir / f"{version:020d}.json").read_text(encoding="utf-8")
            actions = [json.loads(line) for line in text.splitlines() if line.strip()]
            self._commits[version] = _Commit(version, actions)
        return self._commits[version]

    def last_batch(self, version: int) -> int | None:
        """The writer's last batch in the table at ``version`` (-1: none yet), from the log
        back from it: a batch's commit says it, a RESTORE takes the batch of the version it
        restored, any other commit its predecessor's. None: the log cannot tell (cleaned up
        past it, or a RESTORE to a time)."""
        passed: list[int] = []
        while True:
            if version in self._last:
                found = self._last[version]
                break
            if version < 0 or version not in self._present:
                found = -1 if version < 0 else None
                break
            passed.append(version)
            c = self.commit(version)
            if c.batch is not None:
                found = c.batch
                break
            if c.restore:
                if c.restored_to is None:
                    found = None
                    break
                version = c.restored_to
            else:
                version -= 1
        self._last.update(dict.fromkeys(passed, found))
        return found

    def timestamp(self, version: int) -> int:
        """When ``version`` was committed, epoch ms (its commitInfo; else its file's time)."""
        stamp = self.commit(version).info.get("timestamp")
        if stamp is not None:
            return int(stamp)
        return int((self.dir / f"{version:020d}.json").stat().st_mtime * 1000)

    def checkpoint(self, version: int) -> list[dict[str, Any]]:
        """The actions of Delta's checkpoint of ``version`` (its Parquet parts), as the JSON
        commits hold them (a map as a dict)."""
        import pyarrow.parquet as pq

        actions = []
        for name in self.checkpoints.get(version, []):
            table = pq.read_table(io.BytesIO((self.dir / name).read_bytes()))
            for row in table.to_pylist():
                for kind, action in row.items():
                    if action is not None:
                        actions.append({kind: _plain(action)})
        return actions

    def metadata(self) -> dict[str, Any] | None:
        """The table's newest metaData action: from the commits after Delta's newest checkpoint
        of the log, else from that checkpoint (which holds it as of its version; the log's
        cleanup removes the commits before it), so at most the commits since it are read;
        None: neither holds one."""
        newest = max(self.checkpoints, default=-1)  # it holds the metaData as of its version
        for version in reversed(self.versions):
            if version <= newest:
                break
            meta = [a["metaData"] for a in self.commit(version).actions if "metaData" in a]
            if meta:
                return meta[0]
        meta = [a["metaData"] for a in self.checkpoint(newest) if "metaData" in a]
        return meta[0] if meta else None

    def table_id(self) -> str | None:
        """The table's id (None: the log says it nowhere)."""
        meta = self.metadata()
        return None if meta is None else str(meta.get("id"))

    def columns(self) -> list[str] | None:
        """The table's columns, as its newest metaData says (None: the log says it nowhere)."""
        meta = self.metadata()
        if meta is None:
            return None
        schema = json.loads(meta.get("schemaString") or "{}")
        return [f["name"] for f in schema.get("fields", [])]

    def file(self, path: str) -> Path | S3Path:
        return self._file(path)

    def missing_files(self, later: list[_Commit]) -> list[str]:
        """The data files a RESTORE to the version before ``later`` puts back (in its table,
        then removed: a path's first action since is a remove, and its last one too) and
        that are gone."""
        first: dict[str, str] = {}
        last: dict[str, str] = {}
        for c in later:
            for what, actions in (("add", c.adds), ("remove", c.removes)):
                for action in actions:
                    first.setdefault(action["path"], what)
                    last[action["path"]] = what
        needed = sorted(p for p in first if first[p] == last[p] == "remove")
        return [p for p in needed if not self._file(p).exists()]

    def _file(self, path: str) -> Path | S3Path:
        """A data file the log names: relative to the table (URL-encoded), or a URI."""
        url = urlsplit(path)
        if url.scheme == "file":
            return Path(unquote(url.path))
        if url.scheme:
            return location(f"s3://{url.netloc}{unquote(url.path)}")
        return self.root / unquote(path)

    def rows(self, commits: list[_Commit], *, removed: bool) -> Counter:
        """The rows of the files ``commits`` removed (else added), partition values with
        them."""
        import pyarrow.parquet as pq

        rows: Counter = Counter()
        for c in commits:
            for action in c.removes if removed else c.adds:
                table = pq.read_table(io.BytesIO(self._file(action["path"]).read_bytes()))
                parts = action.get("partitionValues") or {}
                rows.update(frozen({**r, **parts}) for r in table.to_pylist())
        return rows


# A Delta source's entry (Delta's DeltaSourceOffset): the table's id, the version and the
# index of the last file read in it, the base index (-1, or -100 from its version 3 on: none
# of the version read yet) or the end index (all of it read).
_BASE = (-1, -100)
_END = 2**63 - 1


def _position(raw: object) -> tuple[int, int, bool] | None:
    """(version, index, in the initial snapshot) of a Delta source's entry; None: not one."""
    if not isinstance(raw, dict) or not {"reservoirId", "reservoirVersion"} <= set(raw):
        return None
    return (
        int(raw["reservoirVersion"]),
        int(raw.get("index", -1)),
        bool(raw.get("isStartingVersion")),
    )


def _next(raw: object, log: _Log) -> int:
    """The first version of the table whose changes the entry has not read in full: after the
    last file of a version (its end index, or the index of its last added file) the next one;
    inside a version, or inside the initial snapshot of a version, that version."""
    at = _position(raw)
    if at is None:
        return 0
    version, index, snapshot = at
    if index == _END:
        return version + 1
    if index in _BASE:
        return version
    files = _snapshot(log, version) if snapshot else _added(log, version)
    if files is None:  # a snapshot the log cannot tell: not read in full
        return version
    return version + 1 if index >= len(files) - 1 else version


def _order(index: int) -> int:
    """An entry's index in the order Delta reads a version: its base (written -1, or -100),
    its schema change's (-20, -19), its files, its end."""
    return -100 if index in _BASE else index


def _waiting(log: _Log, first: int) -> list[int]:
    """The versions from ``first`` on that add data (what the stream reads: a commit that adds
    none, an OPTIMIZE's or a VACUUM's, leaves nothing to read)."""
    return [v for v in log.versions if v >= first and _added(log, v)]


def _added(log: _Log, version: int) -> list[dict[str, Any]]:
    """The data files ``version`` added, in the order Delta's source indexes them."""
    if version not in log.versions:
        return []
    return [a for a in log.commit(version).adds if a.get("dataChange", True)]


def _snapshot(log: _Log, version: int) -> list[str] | None:
    """The data files of the table at ``version``: its log replayed from version 0, or from
    Delta's newest checkpoint at or before it; None where the log holds neither."""
    base = max((c for c in log.checkpoints if c <= version), default=None)
    start = 0 if log.versions and log.versions[0] == 0 else None
    if base is not None and (start is None or base > start):
        files = dict.fromkeys(a["add"]["path"] for a in log.checkpoint(base) if "add" in a)
        start = base + 1
    elif start is None:
        return None
    else:
        files = {}
    for v in range(start, version + 1):
        if v not in log.versions:
            return None  # a gap: the log cannot tell
        for a in log.commit(v).removes:
            files.pop(a["path"], None)
        for a in log.commit(v).adds:
            files[a["path"]] = None
    return list(files)


def _plain(value: Any) -> Any:
    """A checkpoint's action as JSON holds it: Parquet's maps (lists of pairs) as dicts."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list) and all(isinstance(x, tuple) and len(x) == 2 for x in value):
        return {k: _plain(v) for k, v in value}
    return value


class DeltaSource:
    """A Delta table read as a stream (Delta's own streaming source): its entry names the
    table's id and a version; a new checkpoint starts at a version (its beginning, its end
    now, or the first version committed at or after a time); its input can be removed under a
    checkpoint (the log's old commits cleaned up, the data files vacuumed), which a restart
    would fail on; its lag is in versions."""

    name = "delta"
    fields = ("path",)
    connector = CONNECTOR
    connection_type = None
    session_conf = SQL_CONF
    positioned = True
    logs_start = False  # its start is its first entry in offsets/
    cuts_at_time = False  # a cutover run reads the table to its end; the time starts the next
    expires = True  # VACUUM and the log's cleanup remove versions under a checkpoint
    starts = ("cutover", "earliest", "latest")
    kept = ()
    carried = ()
    place = "path"
    noun = "table"
    replay = (
        "with its table still holding every version from the first (a version whose files "
        "were vacuumed, or whose commit was cleaned up, is not replayed, and the rebuilt state "
        "would differ)",
        ", `startingVersion: 0`",
        "version",
    )

    def check(self, source: Source) -> None:
        if not source.path:
            raise ValueError("a delta source reads a table: give its path (a folder)")
        if source.encoding != "json":
            raise ValueError(f"encoding {source.encoding} is for kafka sources, not a table")

    def jars(self, source: Source) -> tuple[str, ...]:
        return (CONNECTOR,)

    def where(self, source: Source) -> str:
        return f"table {source.path}"

    def brief(self, source: Source) -> dict[str, Any]:
        return {"path": source.path}

    def places(self, source: Source) -> list[str]:
        return [source.path]

    def stream(self, spark: SparkSession, source: Source) -> DataFrame:
        """The table's changes as Delta's streaming source reads them, the columns of
        ``schema`` picked and cast."""
        reader = spark.readStream.format("delta").options(**source.reader_options)
        return _picked(reader.load(spark_url(source.path)), source)

    # --- its entry in a checkpoint

    def claims(self, raw: object) -> bool:
        return _position(raw) is not None

    def matches(self, source: Source, raw: object) -> bool:
        """The entry is of the registered ``source``'s table (its id)."""
        return self.claims(raw) and str(raw["reservoirId"]) == _Log(source.path).table_id()  # type: ignore[index]

    def goes_on(self, source: Source, cp: Checkpoint, batch: int, index: int) -> bool:
        return self.matches(source, cp.entry(batch, index))

    def stand_in(self, raw: object) -> None:
        return None  # the entry names a table's id, not where it is

    def initial(self, text: str) -> None:
        return None

    def initial_log(self, entry: str) -> None:
        return None  # its start is the entry in offsets/ alone

    def start_entry(self, source: Source, at: str | int | None) -> str:
        """The entry that starts a new checkpoint at a version of the table: ``earliest``
        (version 0), ``latest`` (the next version written) or the first version committed at
        or after an epoch-ms time. Refused in one line where the log no longer holds it."""
        log = _Log(source.path)
        if not log.versions:
            raise StateOpsError(f"{source.path} holds no Delta table (no commit in _delta_log)")
        if at is None:
            raise StateOpsError(
                f"table {source.path}: say where the new checkpoint starts it: a cutover time, "
                "its end (latest) or its beginning (earliest)"
            )
        if at == "latest":
            version = log.versions[-1] + 1
        elif at == "earliest":
            version = 0
        else:
            version = next((v for v in log.versions if log.timestamp(v) >= int(at)), None)
            version = log.versions[-1] + 1 if version is None else version
        if version < log.versions[0]:
            raise StateOpsError(
                f"table {source.path}: its log no longer holds version {version} (versions "
                f"before {log.versions[0]} were cleaned up: delta.logRetentionDuration); start "
                "at a later time, or at its end (latest)"
            )
        if isinstance(at, int) and version == log.versions[0] > 0:
            raise StateOpsError(
                f"the cutover is no longer in the log of table {source.path}: versions before "
                f"{version} were cleaned up, and some may have been committed after the "
                "cutover; choose a later cutover, or its end (latest)"
            )
        return _entry(log, version)

    def start_of(self, source: Source, query: str) -> str:
        """Where Delta would start the table on a new checkpoint: ``startingVersion`` (a
        version, or latest), else ``startingTimestamp``, else a snapshot of it as it is now
        (its latest version, read whole first)."""
        options = {k.lower(): str(v) for k, v in source.options.items()}
        given = options.get("startingversion")
        if given is not None:
            if given == "latest":
                return self.start_entry(source, "latest")
            if not given.isdigit():
                raise StateOpsError(
                    f"query {query}: startingVersion {given!r} is not a version or latest"
                )
            return _entry(_Log(source.path), int(given))
        if "startingtimestamp" in options:
            at = int(
                parse_time(options["startingtimestamp"], "startingTimestamp").timestamp() * 1000
            )
            return self.start_entry(source, at)
        log = _Log(source.path)
        if not log.versions:
            raise StateOpsError(f"{source.path} holds no Delta table (no commit in _delta_log)")
        return _entry(log, log.versions[-1], snapshot=True)

    def starting(self, source: Source, entry: str) -> Source:
        """``source`` set to start at ``entry``'s version by ``startingVersion`` (a start
        time given before gives way to it)."""
        at = _position(json.loads(entry))
        options = {k: v for k, v in source.options.items() if k.lower() != "startingtimestamp"}
        if at is not None and not at[2]:
            options["startingVersion"] = at[0]
        return source.model_copy(update={"options": options})

    def unreadable(self, source: Source, raw: object) -> str:
        """What a restart from the entry would no longer find in the table, one line (empty:
        all there): versions the log no longer holds, data files vacuumed (of the versions
        from the entry on, and of the snapshot it was reading)."""
        return _lost(_Log(source.path), raw, source.path)

    def rewind(self, source: Source, raw: object, newest: object) -> dict[str, Any]:
        log = _Log(source.path)
        to = _next(raw, log)
        again = max(0, _next(newest, log) - to) if newest is not None else 0
        return {
            "where": self.where(source),
            "line": f"rewinds to version {to}; {again} versions read again",
            "reads_again": again,
            "version": to,
        }

    def older(
        self,
        cp: Checkpoint,
        batch: int,
        index: int,
        source: Source | None,
        limit_ms: float,
        memo: dict[str, Any],
    ) -> bool:
        """Whether every version batch ``batch`` and those before it read was committed
        before ``limit_ms``."""
        if source is None:
            raise StateOpsError(
                f"{cp.root}: source {index} reads a Delta table no registered source names, so "
                "its versions' times are unknown; roll back to a batch id instead"
            )
        raw = cp.entry(batch, index)
        if "log" not in memo:
            memo["log"] = _Log(source.path)
        log = memo["log"]
        at = _position(raw)
        last = _next(raw, log) - 1 if at is None or at[1] in _BASE else at[0]
        if last < 0:
            return True
        return last in log.versions and log.timestamp(last) < limit_ms

    def unread(self, source: Source, raw: object) -> str:
        log = _Log(source.path)
        left = _waiting(log, _next(raw, log))
        if not left:
            return ""
        return (
            f"{len(left)} versions left unread on the old table after the drain "
            f"(versions {left[0]}..{left[-1]}); stop its writers (or let them switch to the new "
            "source), then migrate again"
        )

    def goes_back(self, before: object, after: object) -> list[str]:
        was, now = _position(before), _position(after)
        if was is None or now is None:
            return []
        if before["reservoirId"] != after["reservoirId"]:  # type: ignore[index]
            return [
                f"the table's id changes from {before['reservoirId']} to {after['reservoirId']}"
            ]  # type: ignore[index]
        if (now[0], _order(now[1])) < (was[0], _order(was[1])):
            return [f"version {was[0]} index {was[1]} goes back to version {now[0]} index {now[1]}"]
        return []

    def entry_text(self, raw: object) -> str:
        at = _position(raw)
        if at is None:
            return "?"
        version, index, snapshot = at
        where = (
            "start"
            if index in _BASE
            else "end"
            if index == _END
            else "schema change"
            if index in (-20, -19)
            else f"file {index}"
        )
        return f"version {version} {where}" + (" (snapshot)" if snapshot else "")

    def require(self, source: Source) -> None:
        if not _Log(source.path).versions:
            raise StateOpsError(
                f"table {source.path} holds no Delta table (no commit in _delta_log): create it, "
                "or fix the source's path"
            )

    def batch_read(
        self, spark: SparkSession, source: Source, cp: Checkpoint, batch: int, index: int
    ) -> tuple[DataFrame, list[str]]:
        """The rows of the versions batch ``batch`` read from source ``index`` (the data
        files those versions added, with their partition values), and the versions
        (``table@v``). Where no earlier batch read the table, it started where the source's
        ``startingVersion`` says (a migration's road sets it). Refused where the batch began
        or ended inside a version, or read a snapshot (the proof reads whole versions)."""
        end = cp.entry(batch, index)
        earlier = (cp.entry(b, index) for b in range(batch - 1, -1, -1) if b in cp.offsets)
        start = next((e for e in earlier if self.claims(e)), None)
        log = _Log(source.path)
        if start is None:
            given = {k.lower(): str(v) for k, v in source.options.items()}
            if not given.get("startingversion", "").isdigit():
                raise StateOpsError(
                    f"batch {batch} of {cp.root} is the first to read table {source.path} and "
                    "the source gives no startingVersion: Delta read a snapshot of it, which "
                    "the proof does not read again; start the table at a version"
                )
            first = int(given["startingversion"])
        else:
            first = _next(start, log)
        for raw in (start, end):
            at = _position(raw)
            inside = at is not None and at[1] not in _BASE and _next(raw, log) == at[0]
            if at is not None and (at[2] or inside):
                raise StateOpsError(
                    f"batch {batch} of {cp.root} began or ended inside version {at[0]} of table "
                    f"{source.path}"
                    + (" (its initial snapshot: give startingVersion)" if at[2] else "")
                    + ": the proof reads whole versions (no maxFilesPerTrigger smaller than a "
                    "version)"
                )
        versions = [v for v in log.versions if first <= v < _next(end, log)]
        added = [a for v in versions for a in _added(log, v)]
        if not added:
            return spark.createDataFrame([], source.schema_), []
        return _read_files(spark, log, added, source), [f"{source.path}@{v}" for v in versions]

    # --- a migration to a new table

    def same_place(self, a: Source, b: Source) -> bool:
        return a.path == b.path

    def recognizes(self, source: dict[str, Any]) -> bool:
        return bool(source.get("path")) and bool(_Log(str(source["path"])).versions)

    def inputs(self, source: dict[str, Any], options: dict[str, Any]) -> list[Any]:
        return []

    def auto_format(self, source: dict[str, Any], inputs: list[Any]) -> str:
        return "delta"

    def check_new(
        self, source: Source, *, query: str, others: dict[str, Source], inputs: list[Any]
    ) -> int:
        """Refuse a new table the query cannot run on: a folder that holds no Delta table;
        the number of its versions."""
        log = _Log(source.path)
        if not log.versions:
            raise StateOpsError(
                f"new source path {source.path} holds no Delta table (no commit in "
                "_delta_log): write the table first, or give its path"
            )
        return len(log.versions)

    def check_input(self, source: Source, inputs: list[Any]) -> None:
        """The table has every column of the new source's schema."""
        columns = _Log(source.path).columns()
        for column, _ in schema_fields(source.schema_):
            if columns is not None and column not in columns:
                raise StateOpsError(
                    f"new_source_schema: table {source.path} has no column {column!r} (its "
                    f"columns: {', '.join(columns)})"
                )

    # --- its part of `stateops status`

    def position(self, source: Source, raw: object, close: float) -> dict[str, Any]:
        """Where the entry stands in the table: the next version to read, the latest, the
        lag in versions; what the table no longer holds; a table recreated since."""
        part: dict[str, Any] = {
            "kind": self.name,
            "where": self.where(source),
            "committed": raw,
            "lag_unit": "versions",
            "lag_total": None,
            "said": "no version read yet",
            "table": None,
            "lost": [],
            "close": [],
            "ahead": [],
        }
        if raw is None:
            return part
        log = _Log(source.path)
        latest = log.versions[-1] if log.versions else -1
        first = _next(raw, log)
        lag = len(_waiting(log, first))
        lost = _lost(log, raw, source.path)  # on the log read once here
        ahead = [f"next version {first}, the table's latest {latest}"] if first > latest + 1 else []
        part.update(
            lag_total=lag,
            next_version=first,
            latest_version=latest,
            lost=[lost] if lost else [],
            ahead=ahead,
            said=f"lag {lag} versions (next version {first}, latest {latest})",
            table={
                "columns": ["table", "next version", "latest version", "lag"],
                "rows": [[source.path, first, latest, lag]],
            },
        )
        return part

    def findings(self, query: str, part: dict[str, Any], limits: Any) -> list[tuple[str, str]]:
        head = f"delta {part['source']}"
        found = []
        if part["lost"]:
            found.append(
                (
                    "retention_passed",
                    f"{head}: {part['where']} no longer holds what the checkpoint has not read "
                    f"(batch {part['committed_batch']}): {'; '.join(part['lost'])}; a restart "
                    "fails on it",
                )
            )
        if part["ahead"]:
            found.append(
                (
                    "offsets_ahead",
                    f"{head}: the version committed by batch {part['committed_batch']} is past "
                    f"the table's ({', '.join(part['ahead'])}): it was recreated or restored; "
                    "restore a backup or migrate to the table as it is",
                )
            )
        return found

    def waiting(self, source: Source, cp: Checkpoint, index: int) -> None:
        return None  # its lag says what waits


def _lost(log: _Log, raw: object, path: str) -> str:
    """:meth:`DeltaSource.unreadable` of the table at ``path`` on its log ``log``."""
    first = _next(raw, log)
    if not log.versions:
        return f"table {path} is gone (no commit in _delta_log)"
    if first < log.versions[0]:
        return (
            f"its log no longer holds versions {first}..{log.versions[0] - 1} (cleaned up: "
            "delta.logRetentionDuration)"
        )
    at = _position(raw)
    if at is not None and at[2] and first == at[0]:  # inside its initial snapshot
        gone = [p for p in _snapshot(log, at[0]) or [] if not log.file(p).exists()]
        if gone:
            return (
                f"the data files of its snapshot of version {at[0]} were vacuumed "
                f"({len(gone)} files, e.g. {gone[0]})"
            )
        first += 1
    gone_files = [
        (v, a["path"])
        for v in log.versions
        if v >= first
        for a in _added(log, v)  # what the stream reads: data changes only
        if not log.file(a["path"]).exists()
    ]
    if gone_files:
        return (
            f"the data files of versions {gone_files[0][0]} on were vacuumed "
            f"({len(gone_files)} files, e.g. {gone_files[0][1]})"
        )
    return ""


def _entry(log: _Log, version: int, *, snapshot: bool = False) -> str:
    """A Delta source's entry that starts at ``version`` (nothing of it read yet)."""
    table_id = log.table_id()
    if table_id is None:
        raise StateOpsError(
            f"{log.root}: its log holds no metaData action (cleaned up): its id is unknown"
        )
    return json.dumps(
        {
            "sourceVersion": 1,
            "reservoirId": table_id,
            "reservoirVersion": version,
            "index": -1,
            "isStartingVersion": snapshot,
        }
    )


def _read_files(
    spark: SparkSession, log: _Log, added: list[dict[str, Any]], source: Source
) -> DataFrame:
    """The rows of the data files ``added`` (their add actions), each file's partition values
    as columns, the source's columns picked."""
    from functools import reduce

    from pyspark.sql import functions as F

    groups: dict[tuple, list[str]] = {}
    for a in added:
        parts = tuple(sorted((a.get("partitionValues") or {}).items()))
        groups.setdefault(parts, []).append(spark_url(str(log.file(a["path"]))))
    frames = []
    for parts, files in groups.items():
        df = spark.read.parquet(*files)
        for name, value in parts:
            df = df.withColumn(name, F.lit(value))
        frames.append(_picked(df, source))
    return reduce(lambda a, b: a.unionByName(b), frames)


def _picked(df: DataFrame, source: Source) -> DataFrame:
    """The columns of the source's ``schema``, cast to its types."""
    from pyspark.sql import functions as F

    return df.select(*[F.col(n).cast(t).alias(n) for n, t in schema_fields(source.schema_)])


DELTA = register_sink(DeltaSink(), "delta")
DELTA_SOURCE = register_source(DeltaSource(), "delta")
