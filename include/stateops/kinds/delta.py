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
from urllib.parse import unquote

from stateops.core.errors import StateOpsError
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
        the writer's batches up to ``to_batch`` and none after) and what that undoes, read
        from the table's log. ``restore_to`` None: nothing to undo (``finish``: a RESTORE of
        an interrupted undo is done, its new application id is not set yet)."""
        log = _Log(sink.path)
        plan: dict[str, Any] = {"format": sink.format, "path": str(log.root), "restore_to": None}
        if not log.versions:
            return {**plan, "latest": None, "finish": False}
        latest = log.versions[-1]
        plan["latest"] = latest
        newest = log.commit(latest).info
        # a RESTORE of an undo is newest: killed before the new application id was set
        undo = str(newest.get("userMetadata") or "").startswith(_UNDO)
        plan["finish"] = undo and newest.get("operation") == "RESTORE"
        batch = sink.folder_batch(to_batch)
        last = log.last_batches()
        if latest in last and last[latest] <= batch:
            return plan  # nothing of the writer's after the batch
        kept = [v for v, b in last.items() if b <= batch]
        if not kept:
            raise StateOpsError(
                f"{log.root}: the table's log no longer holds the version after batch "
                f"{to_batch} (its older commits were cleaned up: delta.logRetentionDuration); "
                "nothing changed: the table cannot be rolled back that far"
            )
        restore_to = max(kept)
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
        missing = log.missing_files(restore_to, later)
        if missing:
            raise StateOpsError(
                f"{log.root}: {len(missing)} data files of version {restore_to} were vacuumed "
                f"(e.g. {missing[0]}); nothing changed: the table cannot be restored to batch "
                f"{to_batch}"
            )
        return {
            **plan,
            "restore_to": restore_to,
            "batches": [last[restore_to] + 1, last[latest]],
            "rows": sum(c.rows_added for c in later if c.batch is not None),
            "others": [f"{c.version} {c.info.get('operation', '')}".strip() for c in others],
            "finish": False,
        }

    def rewrites(self, sink: Sink, first_batch: int, since_ms: int | None) -> None:
        """Nothing is written twice: the undone versions are gone from the table."""
        return None

    def set_aside(
        self, plan: dict[str, Any], run_id: str, submit: Callable[[str, list[str]], None]
    ) -> None:
        """Delta's RESTORE and the writer's new application id, in Spark (the
        ``undo_sink.py`` job, :func:`restore`); run again after a kill, it finishes it."""
        if plan["restore_to"] is not None or plan["finish"]:
            submit("undo_sink.py", ["--plan", json.dumps(plan), "--run-id", run_id])

    def plan_lines(self, plan: dict[str, Any]) -> list[str]:
        if plan["restore_to"] is None:
            done = "the interrupted undo's new application id set" if plan["finish"] else ""
            return [f"  sink {plan['path']} (Delta): {done or 'nothing to undo'}"]
        first, last = plan["batches"]
        also = f"; also undoes {', '.join(plan['others'])}" if plan["others"] else ""
        return [
            f"  sink {plan['path']} (Delta): RESTORE to version {plan['restore_to']} (of "
            f"{plan['latest']}), undoing batches {first}..{last} ({plan['rows']} rows){also}"
        ]

    def undo_hint(self, plan: dict[str, Any]) -> str:
        return (
            f"the table back with RESTORE TABLE delta.`{plan['path']}` TO VERSION AS OF "
            f"{plan['latest']}"
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
        undo = [
            c
            for c in map(log.commit, log.versions)
            if c.info.get("userMetadata") == _UNDO + run_id and c.info.get("operation") == "RESTORE"
        ]
        since = (mark or {}).get("version") if isinstance(mark, dict) else None
        after_commits = [log.commit(v) for v in log.versions if since is None or v > since]
        old = log.rows(undo, removed=True) - log.rows(undo, removed=False)
        new = log.rows(after_commits, removed=False) - log.rows(after_commits, removed=True)
        diff = diff_rows(old, new, key_columns)
        keys = ", ".join(key_columns) or "whole rows"
        restored = undo[0].info.get("operationParameters", {}).get("version") if undo else None
        lines = [
            f"{diff['rows_before']} rows before, {diff['rows_after']} after; "
            f"{diff['unchanged']} unchanged, {diff['added']} added, {diff['removed']} removed, "
            f"{diff['changed_keys']} keys changed (by {keys}); the old rows stay readable in "
            f"the table's versions before {undo[0].version if undo else '?'} (restored to "
            f"{restored})"
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
        ``url`` (as Spark names it, ``spark`` set to reach it and started with :data:`SQL_CONF`,
    as every session is where Delta's jar is):
        RESTORE to its version, then the writer's new application id; each commit says it is the
        undo's (``userMetadata``). A step done before a kill is not done again; a table written
        since the plan is refused, nothing changed."""
    app_id = f"{FIRST_APP_ID}-{run_id}"
    if _properties(spark, url).get(APP_ID_PROPERTY) == app_id:
        return {"restored": False, "app_id": app_id}
    table = f"delta.`{url}`"
    newest = spark.sql(f"DESCRIBE HISTORY {table} LIMIT 1").first()
    restored = newest["operation"] == "RESTORE" and newest["userMetadata"] == _UNDO + run_id
    if plan["restore_to"] is not None and not restored:
        if newest["version"] != plan["latest"]:
            raise StateOpsError(
                f"{plan['path']}: the table was written since the plan (version "
                f"{newest['version']}, the plan read {plan['latest']}); nothing changed in "
                "it: plan again"
            )
    spark.conf.set("spark.databricks.delta.commitInfo.userMetadata", _UNDO + run_id)
    try:
        if plan["restore_to"] is not None and not restored:
            spark.sql(f"RESTORE TABLE {table} TO VERSION AS OF {int(plan['restore_to'])}")
        spark.sql(f"ALTER TABLE {table} SET TBLPROPERTIES ('{APP_ID_PROPERTY}' = '{app_id}')")
    finally:
        spark.conf.unset("spark.databricks.delta.commitInfo.userMetadata")
    return {"restored": plan["restore_to"] is not None and not restored, "app_id": app_id}


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
    def restored_to(self) -> int | None:
        if self.info.get("operation") != "RESTORE":
            return None
        return int(self.info.get("operationParameters", {}).get("version", -1))

    @property
    def changes_rows(self) -> bool:
        return any(a.get("dataChange", True) for a in self.adds + self.removes)

    @property
    def rows_added(self) -> int:
        return sum(json.loads(a.get("stats") or "{}").get("numRecords", 0) for a in self.adds)


class _Log:
    """A Delta table's log (``<path>/_delta_log``), its JSON commits read as needed."""

    def __init__(self, path: str) -> None:
        self.root = location(path)
        self.dir = self.root / "_delta_log"
        listed = isinstance(self.dir, S3Path) or self.dir.is_dir()
        names = [rel for rel in list_files(self.dir)] if listed else []
        self.versions = sorted(int(m.group(1)) for n in names if (m := _COMMIT.fullmatch(n)))
        self._commits: dict[int, _Commit] = {}

    def commit(self, version: int) -> _Commit:
        if version not in self._commits:
            text = (self.dir / f"{version:020d}.json").read_text(encoding="utf-8")
            actions = [json.loads(line) for line in text.splitlines() if line.strip()]
            self._commits[version] = _Commit(version, actions)
        return self._commits[version]

    def last_batches(self) -> dict[int, int]:
        """The writer's last batch in the table at each version the log can tell: from the
        oldest commit it holds (the table's first: -1 before it), a RESTORE taking the
        batch of the version it restored."""
        known: dict[int, int] = {}
        last: int | None = -1 if self.versions and self.versions[0] == 0 else None
        for version in self.versions:
            c = self.commit(version)
            if c.batch is not None:
                last = c.batch
            elif c.restored_to is not None:
                last = known.get(c.restored_to)
            if last is not None:
                known[version] = last
        return known

    def missing_files(self, version: int, later: list[_Commit]) -> list[str]:
        """The data files of ``version``'s table that later commits removed and are gone."""
        added = {a["path"] for c in later for a in c.adds}
        needed = sorted({r["path"] for c in later for r in c.removes} - added)
        return [p for p in needed if not self._file(p).exists()]

    def _file(self, rel: str) -> Path | S3Path:
        return location(unquote(rel)) if "://" in rel else self.root / unquote(rel)

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
