"""The Delta sink's undo plan, read from a table's log (pure logic over the log's commits;
the Spark-written tables, the RESTORE and the reprocessing are tests/spark/test_delta_sink.py):
which version holds the writer's batches up to N, across an earlier undo's RESTORE; a log
cleaned past it, another writer's rows after it and vacuumed files refused in one line; every
rollback of an existing table sets its writer's new application id."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from stateops.core.errors import StateOpsError
from stateops.kinds import Sink

pytestmark = pytest.mark.unit


class Table:
    """A table's ``_delta_log``, one commit at a time (the actions Delta writes)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        (root / "_delta_log").mkdir(parents=True)
        self.version = -1

    def commit(self, *actions: dict, info: dict | None = None) -> int:
        self.version += 1
        lines = [{"commitInfo": {"operation": "WRITE", **(info or {})}}, *actions]
        path = self.root / "_delta_log" / f"{self.version:020d}.json"
        path.write_text("".join(json.dumps(a) + "\n" for a in lines))
        return self.version

    def batch(self, batch: int, app: str = "stateops", rows: int = 2) -> int:
        name = f"part-{self.version + 1}.parquet"
        (self.root / name).write_bytes(b"")
        stats = json.dumps({"numRecords": rows})
        return self.commit(
            {"txn": {"appId": app, "version": batch}},
            {"add": {"path": name, "dataChange": True, "stats": stats}},
        )

    def undo(self, to: int, run: str) -> None:
        meta = {"userMetadata": f"stateops undo {run}"}
        self.commit(info={**meta, "operation": "RESTORE", "operationParameters": {"version": to}})
        self.commit(info={**meta, "operation": "SET TBLPROPERTIES"})

    def plan(self, to_batch: int) -> dict:
        sink = Sink(format="delta", path=str(self.root))
        return sink.kind.undo_plan(sink, to_batch)


@pytest.fixture
def table(tmp_path) -> Table:
    return Table(tmp_path / "t")


def test_the_version_of_batch_n_and_what_its_restore_undoes(table):
    for b in range(6):
        table.batch(b)
    plan = table.plan(2)
    assert (plan["restore_to"], plan["latest"], plan["batches"], plan["rows"]) == (2, 5, [2, 5], 6)
    assert plan["others"] == []
    assert table.plan(5)["restore_to"] is None, "nothing after the last batch"


def test_an_earlier_undo_is_followed_through_its_restore(table):
    for b in range(4):
        table.batch(b)  # versions 0-3
    table.undo(1, "r1")  # 4: RESTORE to version 1 (batch 1), 5: the new application id
    table.batch(2, "stateops-r1")  # 6
    table.batch(3, "stateops-r1")  # 7
    assert table.plan(2)["restore_to"] == 6
    assert table.plan(1)["restore_to"] == 5, "the undo's own table: batches up to 1, the new id"
    assert table.plan(0)["restore_to"] == 0


def test_a_log_cleaned_past_the_batch_is_refused(table):
    for b in range(5):
        table.batch(b)
    for v in (0, 1, 2):
        (table.root / "_delta_log" / f"{v:020d}.json").unlink()
    assert table.plan(3)["restore_to"] == 3
    with pytest.raises(StateOpsError, match=r"no longer holds the version after batch 1 ") as err:
        table.plan(1)
    assert "\n" not in str(err.value)


def test_another_writers_rows_are_refused_and_its_other_commits_shown(table):
    for b in range(3):
        table.batch(b)
    optimize = {"operation": "OPTIMIZE"}
    table.commit({"add": {"path": "part-1.parquet", "dataChange": False}}, info=optimize)
    assert table.plan(0)["others"] == ["3 OPTIMIZE"]
    table.commit({"add": {"path": "theirs.parquet", "dataChange": True}})
    with pytest.raises(StateOpsError, match=r"version 4 \(WRITE\) was written by another writer"):
        table.plan(0)


def test_files_a_restore_needs_that_were_vacuumed_are_refused(table):
    for b in range(3):
        table.batch(b)
    table.commit(
        {"remove": {"path": "part-0.parquet", "dataChange": False}},
        {"add": {"path": "part-9.parquet", "dataChange": False}},
        info={"operation": "OPTIMIZE"},
    )
    assert table.plan(0)["restore_to"] == 0
    (table.root / "part-0.parquet").unlink()
    with pytest.raises(StateOpsError, match=r"1 data files of version 0 were vacuumed"):
        table.plan(0)


def test_every_rollback_of_a_table_gives_its_writer_a_new_id(table):
    for b in range(4):
        table.batch(b)
    meta = {"userMetadata": "stateops undo r1", "operation": "RESTORE"}
    table.commit(info={**meta, "operationParameters": {"version": 1}})  # killed before the id
    table.commit(
        {"add": {"path": "part-1.parquet", "dataChange": False}}, info={"operation": "OPTIMIZE"}
    )
    plan = table.plan(1)  # the rollback resumed: nothing left to restore
    assert plan["restore_to"] is None and plan["latest"] == 5
    submitted = []
    sink = Sink(format="delta", path=str(table.root))
    sink.kind.set_aside(plan, "r1", lambda job, args: submitted.append((job, args[:1])))
    assert submitted == [("undo_sink.py", ["--plan"])], "the new id is set all the same"


def test_a_table_not_written_yet_has_nothing_to_undo(tmp_path):
    sink = Sink(format="delta", path=str(tmp_path / "none"))
    plan = sink.kind.undo_plan(sink, 3)
    assert (plan["restore_to"], plan["latest"]) == (None, None)
    sink.kind.set_aside(plan, "r1", lambda job, args: pytest.fail("no table: no job"))


def test_a_restore_to_a_time_or_absolute_paths_are_read_as_they_are(table, tmp_path):
    for b in range(3):
        table.batch(b)
    elsewhere = tmp_path / "elsewhere.parquet"
    elsewhere.write_bytes(b"")
    table.commit(
        {"remove": {"path": f"file:{elsewhere}", "dataChange": False}},
        {"add": {"path": "part-9.parquet", "dataChange": False}},
        info={"operation": "OPTIMIZE"},
    )
    assert table.plan(0)["restore_to"] == 0, "file:/ paths are local files"
    table.commit(info={"operation": "RESTORE", "operationParameters": {"timestamp": "x"}})
    with pytest.raises(StateOpsError, match="no longer holds the version after batch 0"):
        table.plan(0)


def test_the_backfill_report_compares_the_rows_the_restore_removed_with_the_new_ones(table):
    import pyarrow as pa
    import pyarrow.parquet as pq

    def batch(b: int, app: str, rows: list[tuple[str, int]]) -> str:
        name = f"b{b}-{app}.parquet"
        pq.write_table(pa.table({"user": [u for u, _ in rows], "n": [n for _, n in rows]}),
                       table.root / name)  # fmt: skip
        table.commit(
            {"txn": {"appId": app, "version": b}},
            {"add": {"path": name, "dataChange": True}},
        )
        return name

    batch(0, "stateops", [("a", 1)])
    gone = [batch(1, "stateops", [("a", 2), ("b", 1)]), batch(2, "stateops", [("c", 1)])]
    meta = {"userMetadata": "stateops undo r1"}
    table.commit(
        *({"remove": {"path": p, "dataChange": True}} for p in gone),
        info={**meta, "operation": "RESTORE", "operationParameters": {"version": 0}},
    )
    mark = {"version": table.commit(info={**meta, "operation": "SET TBLPROPERTIES"})}
    batch(1, "stateops-r1", [("a", 2), ("b", 5)])  # b changed, c gone, d new
    batch(2, "stateops-r1", [("d", 1)])
    sink = Sink(format="delta", path=str(table.root))
    lines, counts, _ = sink.kind.compare(
        sink, run_id="r1", after_batch=0, key_columns=["user"], mark=mark, before=None
    )
    assert counts == {
        "rows_before": 3,
        "rows_after": 3,
        "unchanged": 1,
        "added": 1,
        "removed": 1,
        "changed_keys": 1,
    }
    assert lines[0].endswith("the old rows stay readable in the table's versions before 3 "
                             "(restored to 0)")  # fmt: skip
