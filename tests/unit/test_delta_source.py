"""A Delta table as a source, read from its log (pure logic over the log's commits; the
Spark-written tables, the stream and the refusals on them: tests/spark/test_delta_source.py):
where a new checkpoint starts it (a time, its beginning, its end, startingVersion), which entry
is the table's, the lag in versions, a cleaned-up log and vacuumed files said in one line, the
rollback's line, a drain that left versions."""

from __future__ import annotations

import json

import pytest

from stateops.core.errors import StateOpsError
from stateops.kinds import Source, kind_at, source_at
from stateops.kinds.delta import DELTA_SOURCE
from tests.unit.test_delta_log import Table

pytestmark = pytest.mark.unit

TABLE_ID = "6f1c0b7e-0000-4000-8000-000000000001"
T0 = 1_800_000_000_000  # epoch ms of version 0; version v is committed at T0 + v minutes


@pytest.fixture
def table(tmp_path) -> Table:
    t = Table(tmp_path / "events")
    meta = {"metaData": {"id": TABLE_ID, "schemaString": json.dumps(_schema("user", "page"))}}
    t.commit(meta, info={"timestamp": T0})
    for v in range(1, 4):
        name = f"part-{v}.parquet"
        (t.root / name).write_bytes(b"")
        t.commit({"add": {"path": name, "dataChange": True}}, info={"timestamp": T0 + v * 60_000})
    return t


def _schema(*names: str) -> dict:
    return {"type": "struct", "fields": [{"name": n, "type": "string"} for n in names]}


def _source(table: Table, **options) -> Source:
    return Source.model_validate(
        {"format": "delta", "path": str(table.root), "schema": "user STRING", "options": options}
    )


def _at(version: int, index: int = -1, **extra) -> dict:
    return {"sourceVersion": 1, "reservoirId": TABLE_ID, "reservoirVersion": version,
            "index": index, "isStartingVersion": False, **extra}  # fmt: skip


def test_a_new_checkpoint_starts_at_a_version_by_time_first_or_latest(table):
    source = _source(table)
    starts = {
        "earliest": 0,
        "latest": 4,  # the next version written
        T0 + 90_000: 2,  # the first committed at or after the time
        T0 + 120_000: 2,
        T0 + 10 * 60_000: 4,  # after every version: the next one
    }
    for at, version in starts.items():
        entry = json.loads(DELTA_SOURCE.start_entry(source, at))
        assert entry == _at(version), at
    assert DELTA_SOURCE.start_of(_source(table, startingVersion=1), "q") == json.dumps(_at(1))
    snapshot = json.loads(DELTA_SOURCE.start_of(source, "q"))
    assert (snapshot["reservoirVersion"], snapshot["isStartingVersion"]) == (3, True)
    started = DELTA_SOURCE.starting(_source(table, startingTimestamp="x"), json.dumps(_at(2)))
    assert started.options == {"startingVersion": 2}


def test_a_start_the_log_no_longer_holds_is_refused(table):
    for v in (0, 1):
        (table.root / "_delta_log" / f"{v:020d}.json").unlink()
    with pytest.raises(StateOpsError, match="its log no longer holds version 0 .*cleaned up"):
        DELTA_SOURCE.start_entry(_source(table), "earliest")
    with pytest.raises(StateOpsError, match="the cutover is no longer in the log of table"):
        DELTA_SOURCE.start_entry(_source(table), T0)


def test_the_entry_is_the_tables_by_its_shape_and_id(table):
    source = _source(table)
    assert kind_at(_at(2)) is DELTA_SOURCE and kind_at({"logOffset": 2}) is not DELTA_SOURCE
    assert source_at(_at(2), [source]) is source
    assert source_at({**_at(2), "reservoirId": "another table"}, [source]) is None


def test_the_lag_is_in_versions_and_a_vacuumed_or_cleaned_version_is_said(table):
    source = _source(table)
    part = DELTA_SOURCE.position(source, _at(2), 0.1)
    assert (part["lag_total"], part["lag_unit"], part["lost"]) == (2, "versions", [])
    assert part["said"] == "lag 2 versions (next version 2, latest 3)"
    end = DELTA_SOURCE.position(source, _at(3, 2**63 - 1), 0.1)
    assert (end["lag_total"], end["next_version"]) == (0, 4)
    # after the last (only) file of version 1, as Delta's source says it: version 2 is next
    assert DELTA_SOURCE.position(source, _at(1, 0), 0.1)["next_version"] == 2
    # inside the initial snapshot of version 3 (its 3 files), then at its last file
    snapshot = {"isStartingVersion": True}
    assert DELTA_SOURCE.position(source, _at(3, 1, **snapshot), 0.1)["next_version"] == 3
    assert DELTA_SOURCE.position(source, _at(3, 2, **snapshot), 0.1)["next_version"] == 4
    (table.root / "part-3.parquet").unlink()
    assert DELTA_SOURCE.unreadable(source, _at(2)) == (
        "the data files of versions 3 on were vacuumed (1 files, e.g. part-3.parquet)"
    )
    assert DELTA_SOURCE.unreadable(source, _at(3, 0, isStartingVersion=True)) == (
        "the data files of its snapshot of version 3 were vacuumed (1 files, e.g. part-3.parquet)"
    )
    assert DELTA_SOURCE.unreadable(source, _at(4)) == ""
    (table.root / "_delta_log" / f"{0:020d}.json").unlink()
    assert "its log no longer holds versions 0..0" in DELTA_SOURCE.unreadable(source, _at(0))
    [finding] = DELTA_SOURCE.findings("q", {**part, "source": "s", "committed_batch": 1,
                                            "lost": ["x"]}, None)  # fmt: skip
    assert finding[0] == "retention_passed"


def test_the_rewind_the_drains_leftovers_and_an_entry_that_goes_back(table):
    source = _source(table)
    rewind = DELTA_SOURCE.rewind(source, _at(1), _at(3, 2**63 - 1))
    assert rewind["line"] == "rewinds to version 1; 3 versions read again"
    assert DELTA_SOURCE.unread(source, _at(3, 2**63 - 1)) == ""
    assert DELTA_SOURCE.unread(source, _at(2)).startswith("2 versions left unread")
    assert DELTA_SOURCE.goes_back(_at(3), _at(2)) == [
        "version 3 index -1 goes back to version 2 index -1"
    ]


def test_the_registry_refuses_a_table_source_without_a_path():
    with pytest.raises(ValueError, match="a delta source reads a table: give its path"):
        Source.model_validate({"format": "delta", "schema": "a STRING"})


def test_once_the_early_commits_are_cleaned_up_the_table_is_read_from_deltas_checkpoint(table):
    """The log's cleanup removes the commits before Delta's newest checkpoint: the table's id,
    columns and snapshot are read from the checkpoint's Parquet."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    meta = {"id": TABLE_ID, "schemaString": json.dumps(_schema("user", "page", "city"))}
    adds = [{"path": f"part-{v}.parquet", "dataChange": False} for v in (1, 2)]
    rows = [{"metaData": meta, "add": None}] + [{"metaData": None, "add": a} for a in adds]
    log = table.root / "_delta_log"
    pq.write_table(pa.Table.from_pylist(rows), log / f"{2:020d}.checkpoint.parquet")
    for v in (0, 1, 2):
        (log / f"{v:020d}.json").unlink()
    source = _source(table)
    assert source_at(_at(3), [source]) is source  # the id, from the checkpoint
    assert DELTA_SOURCE.position(source, _at(3), 0.1)["lag_total"] == 1
    snapshot = {"isStartingVersion": True}  # the snapshot of 3: the checkpoint's 2 files + 1
    assert DELTA_SOURCE.position(source, _at(3, 1, **snapshot), 0.1)["next_version"] == 3
    assert DELTA_SOURCE.position(source, _at(3, 2, **snapshot), 0.1)["next_version"] == 4
    (table.root / "part-1.parquet").unlink()
    assert "snapshot of version 3 were vacuumed" in DELTA_SOURCE.unreadable(
        source, _at(3, 0, **snapshot)
    )


def test_a_table_recreated_under_the_checkpoint_fails_the_status_naming_it(table, tmp_path):
    """The checkpoint read a table whose id is not the registered table's any more (dropped
    and written anew at its path): the status says so, a FAIL, not "no version read yet"."""
    from stateops.core.registry import load_registry
    from stateops.status import query_status
    from tests.conftest import write_registry

    checkpoint = tmp_path / "checkpoints" / "page_visits"
    (checkpoint / "offsets").mkdir(parents=True)
    (checkpoint / "commits").mkdir()
    (checkpoint / "metadata").write_text('{"id":"q-1"}')
    entry = {**_at(2), "reservoirId": "the-table-dropped-since"}
    (checkpoint / "offsets" / "0").write_text(
        'v1\n{"batchWatermarkMs":0,"batchTimestampMs":1,"conf":{}}\n' + json.dumps(entry)
    )
    (checkpoint / "commits" / "0").write_text('v1\n{"nextBatchWatermarkMs":0}')
    schema = "user_id STRING, page STRING, event_time TIMESTAMP"  # page_visits' columns
    source = {"format": "delta", "path": str(table.root), "schema": schema}
    registry = load_registry(write_registry(tmp_path, page_visits={"source": source}))
    status = query_status(registry, "page_visits")
    assert status["changed_under"] == [
        {"source": "source", "where": f"table {table.root}", "entry": "version 2 start"}
    ]
    [found] = [f for f in status["health"]["findings"] if f["rule"] == "source_changed"]
    assert found["level"] == "FAIL" and f"another place than table {table.root}" in found["reason"]
