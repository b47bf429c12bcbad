"""A Delta Lake table out (``format: delta``, ``path``: a folder, local or in S3), written
by Delta's own writer from Spark's ``foreachBatch``.

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
from stateops.core.storage import S3Path, list_files, location, spark_url
from stateops.kinds.base import Sink, register_sink
from stateops.kinds.rows import COUNTS, diff_rows, frozen

if TYPE_CHECKING:
    from collections.abc import Callable

    from pyspark.sql import DataFrame, SparkSession

__all__ = ["APP_ID_PROPERTY", "DELTA", "SQL_CONF", "restore"]

CONNECTOR = "delta-spark"
# The table property that names the application id the writer's transactions record; absent:
# FIRST_APP_ID. Every id the writer takes starts with FIRST_APP_ID.
APP_ID_PROPERTY = "stateops.appId"
FIRST_APP_ID = "stateops"
# A commit of the undo (its RESTORE and its property) says so in its commitInfo.userMetadata.
_UNDO = "stateops undo "
_COMMIT = re.compile(r"(\d{20})\.json")

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


DELTA = register_sink(DeltaSink(), "delta")
