"""Rollback's parts that read no checkpoint: an interrupted rollback's marker, and what makes
a sink consistent with the rollback (its plan on Spark-written checkpoints and sinks:
tests/spark/test_rollback.py)."""

from __future__ import annotations

import json

import pytest

from stateops.control.markers import write_rollback
from stateops.core.errors import StateOpsError
from stateops.kinds import Sink
from stateops.ops.pending import refuse_pending_rollback
from stateops.ops.rollback import set_aside

pytestmark = pytest.mark.unit


def test_an_interrupted_rollback_is_resumed_only_to_its_own_batch(tmp_path):
    assert refuse_pending_rollback(tmp_path) is None
    write_rollback(tmp_path, {"to_batch": 4, "run_id": "rollback-1"})
    assert refuse_pending_rollback(tmp_path, 4) == {"to_batch": 4, "run_id": "rollback-1"}
    for other in (3, None):  # another rollback, or a cleanup
        with pytest.raises(
            StateOpsError,
            match=(
                rf"^{tmp_path}: a rollback to batch 4 \(run rollback-1\) was interrupted; "
                rf"finish it first: stateops rollback {tmp_path} --to-batch 4$"
            ),
        ):
            refuse_pending_rollback(tmp_path, other)


def test_a_per_batch_sink_moves_later_batches_aside_with_the_sinks_offset(tmp_path):
    for k in (10, 11, 12, 13):
        (tmp_path / f"batch_id={k}").mkdir()
        (tmp_path / f"batch_id={k}" / "part-0.parquet").write_text(str(k))
    sink = Sink(path=str(tmp_path), batch_offset=10)
    plan = sink.kind.undo_plan(sink, 1)
    assert plan == {
        "format": "parquet",
        "path": str(tmp_path),
        "folders": ["batch_id=12", "batch_id=13"],
        "log_entries": [],
        "data_files": [],
    }
    set_aside(plan, "rollback-1")
    assert sorted(p.name for p in tmp_path.glob("batch_id=*")) == ["batch_id=10", "batch_id=11"]
    aside = tmp_path / "_rolled_back" / "rollback-1"
    assert (aside / "batch_id=13" / "part-0.parquet").read_text() == "13", "moved, not lost"


def _folder(path) -> Sink:
    return Sink(format="json", path=str(path))


def _log(path, files):
    lines = ["v1", *(json.dumps({"path": f"file:{f}", "action": "add"}) for f in files)]
    path.write_text("\n".join(lines))


def test_a_file_sink_drops_later_log_entries_and_moves_only_the_files_they_alone_name(tmp_path):
    log = tmp_path / "_spark_metadata"
    log.mkdir()
    files = [tmp_path / f"part-{b}.parquet" for b in range(4)]
    for f in files:
        f.write_text(f.name)
    _log(log / "0", [files[0]])
    _log(log / "1", [files[1]])
    _log(log / "2.compact", files[:3])  # a compaction repeats what it folds in
    _log(log / "3", [files[3]])
    sink = _folder(tmp_path)
    plan = sink.kind.undo_plan(sink, 1)
    assert plan["log_entries"] == ["3", "2.compact"], "newest first"
    assert plan["data_files"] == [f"file:{files[2]}", f"file:{files[3]}"]
    set_aside(plan, "rollback-1")
    assert sorted(p.name for p in log.iterdir()) == ["0", "1"]
    assert sorted(p.name for p in tmp_path.glob("part-*")) == ["part-0.parquet", "part-1.parquet"]


def test_a_file_sink_compacted_past_the_rollback_point_is_refused(tmp_path):
    log = tmp_path / "_spark_metadata"
    log.mkdir()
    _log(log / "9.compact", [tmp_path / "a"])
    _log(log / "10", [tmp_path / "b"])
    refusal = "compacted after batch 5 and the entries before it are gone; the file sink cannot"
    with pytest.raises(StateOpsError, match=refusal):
        _folder(tmp_path).kind.undo_plan(_folder(tmp_path), 5)


def test_a_kafka_sink_has_nothing_to_set_aside_and_touches_no_folder(tmp_path, monkeypatch):
    """The topic keeps what a batch wrote: no undo plan, whatever folder the process is in
    (a migration's roll back once planned one in the working directory for a Kafka sink)."""
    (tmp_path / "batch_id=7").mkdir()
    monkeypatch.chdir(tmp_path)
    sink = Sink(format="kafka", topic="out")
    assert sink.kind.undo_plan(sink, 1) is None
    assert (tmp_path / "batch_id=7").is_dir()
