"""State transplant: a new checkpoint from the old one's state files, for a new source.

The sessions case has a 300 s timeout: sessions, their timers and the watermark must carry
over exactly. Refusals must name the reason and leave the old checkpoint byte-identical.
"""

from __future__ import annotations

import json
import os
import shutil
from collections import Counter
from pathlib import Path

import pytest
import yaml

from stateops.checkpoint import load_checkpoint
from stateops.errors import StateOpsError
from stateops.pipelines.page_visits import PageVisitsProcessor
from stateops.registry import load_registry
from stateops.transplant import TransplantRefused, transplant_checkpoint
from tests.conftest import ROOT, run_cli, spark_submit_run_query, tree_digest, write_registry
from tests.spark.harness import land, read_sink, read_state

pytestmark = pytest.mark.spark

READS = [{"stateVarName": "events"}, {"readRegisteredTimers": "true"}]
PROCESSOR = yaml.safe_load((ROOT / "registry.yaml").read_text())["queries"]["user_sessions"][
    "processor"
]
DATA = 4  # output columns: user_id, session_start, session_end, num_events, data, closed_by


def _ok(proc) -> dict:
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _all_rows(sink) -> Counter:
    return Counter(row for rows in read_sink(Path(sink)).values() for row in rows)


def _add_late_event(path: Path) -> None:
    """One event long before the old query's watermark, the file's mtime kept."""
    mtime = path.stat().st_mtime
    event = {"user_id": "u00001", "data": "late", "is_last": False,
             "event_time": "2026-01-01T00:00:00Z"}  # fmt: skip
    with open(path, "a") as out:
        out.write(json.dumps(event) + "\n")
    os.utime(path, (mtime, mtime))


def test_transplant_carries_sessions_timers_and_watermark_like_an_uninterrupted_run(
    spark, tmp_path
):
    timed = {"processor": {**PROCESSOR, "options": {"session_timeout_seconds": 300}}}
    # The reference: one query on one source, stopped where the migration cuts over and
    # started again. (Each available-now run ends with a no-data batch that fires the timers
    # due at its watermark before the next input arrives: a run over both rounds at once fires
    # them in the same batch as that input, after it, and differs with a short timeout.)
    whole = write_registry(tmp_path / "whole", user_sessions=timed)
    land(tmp_path / "whole" / "landing", round_=0, files=3)
    _ok(spark_submit_run_query(whole, "user_sessions"))
    land(tmp_path / "whole" / "landing", round_=1, files=3)
    _add_late_event(tmp_path / "whole" / "landing" / "user_sessions" / "events-r001-0000.json")
    _ok(spark_submit_run_query(whole, "user_sessions"))

    old = write_registry(tmp_path / "old", user_sessions=timed)
    land(tmp_path / "old" / "landing", round_=0, files=3)
    _ok(spark_submit_run_query(old, "user_sessions"))
    old_checkpoint = Path(load_registry(old).query("user_sessions").checkpoint)
    last = load_checkpoint(old_checkpoint).last_committed_batch
    before = tree_digest(old_checkpoint)

    new = write_registry(tmp_path / "new", user_sessions=timed)
    land(tmp_path / "new" / "landing", round_=1, files=3)
    _add_late_event(tmp_path / "new" / "landing" / "user_sessions" / "events-r001-0000.json")
    new_query = load_registry(new).query("user_sessions")
    dry = _ok(run_cli("--registry", str(new), "transplant", str(old_checkpoint),
                      new_query.checkpoint, "--query", "user_sessions", "--dry-run"))  # fmt: skip
    assert dry["dry_run"] and dry["batch"] == last and not Path(new_query.checkpoint).exists()
    done = _ok(run_cli("--registry", str(new), "transplant", str(old_checkpoint),
                       new_query.checkpoint, "--query", "user_sessions"))  # fmt: skip
    assert done["batch"] == last and done["query_id"] != done["old_query_id"]
    assert tree_digest(old_checkpoint) == before, "the transplant wrote into the old checkpoint"
    assert load_checkpoint(new_query.checkpoint).last_committed_batch == last
    assert not list(Path(new_query.checkpoint).glob("sources/*")), "the new source starts empty"

    run = _ok(spark_submit_run_query(new, "user_sessions"))  # the new source, first batch proven
    assert run["carry_over"] == "transplant" and run["bootstrap"] == "complete"
    assert run["first_batch_id"] == last + 1 and run["proof"]["ok"], run["proof"]
    assert tree_digest(old_checkpoint) == before, "the proof wrote into the old checkpoint"

    queries = {name: load_registry(reg).query("user_sessions") for name, reg in
               (("whole", whole), ("old", old), ("new", new))}  # fmt: skip
    assert read_state(spark, queries["new"].checkpoint, READS) == read_state(
        spark, queries["whole"].checkpoint, READS
    ), "state (open sessions and their timers) differs from the uninterrupted run's"
    split = _all_rows(queries["old"].sink.path) + _all_rows(queries["new"].sink.path)
    assert split == _all_rows(queries["whole"].sink.path)
    carried = [r for r in _all_rows(queries["new"].sink.path) if r[DATA].startswith("e0-")]
    assert carried, "no carried-over session closed on the new source"


class PagesWithReferrer(PageVisitsProcessor):
    """page_visits with one more field in its list state: a changed state schema."""

    def init(self, handle) -> None:
        self.pages = handle.getListState(
            "pages", "page STRING, visited_at TIMESTAMP, referrer STRING"
        )
        self.count = handle.getValueState("count", "visits LONG")


HDFS = "org.apache.spark.sql.execution.streaming.state.HDFSBackedStateStoreProvider"
REFUSED = [
    ({"shuffle_partitions": 8}, None, r"the old state has 2 partitions, the query 8"),
    ({"processor": {"class": f"{__name__}:PagesWithReferrer", "output_mode": "Update"}}, None,
     r"state 'pages' holds \(page string, visited_at timestamp\) in the old checkpoint, the "
     r"processor declares \(page string, visited_at timestamp, referrer string\)"),
    ({"spark_conf": {"spark.sql.streaming.stateStore.providerClass": HDFS}}, None,
     r"streaming.stateStore.providerClass is .*RocksDBStateStoreProvider in the old checkpoint, "
     r".*HDFSBackedStateStoreProvider for the new query"),
    ({"spark_conf": {"spark.sql.streaming.stateStore.encodingFormat": "avro"}}, None,
     r"streaming.stateStore.encodingFormat is unsaferow in the old checkpoint, avro"),
    ({}, "kafka", r"source format 'kafka': the transplant writes starting offsets for json, "),
]  # fmt: skip


@pytest.fixture(scope="module")
def page_visits(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("transplant")
    path = write_registry(root)
    land(root / "landing", round_=0, files=2)
    _ok(spark_submit_run_query(path, "page_visits"))
    return root


@pytest.mark.parametrize("changes, source_format, reason", REFUSED)
def test_a_transplant_that_does_not_apply_is_refused_with_its_reason(
    page_visits, tmp_path, changes, source_format, reason
):
    old = Path(load_registry(page_visits / "registry.yaml").query("page_visits").checkpoint)
    before = tree_digest(old)
    query = load_registry(write_registry(tmp_path, page_visits=changes)).query("page_visits")
    if source_format:
        source = query.source.model_copy(update={"format": source_format})
        query = query.model_copy(update={"source": source})
    with pytest.raises(TransplantRefused, match=reason):
        transplant_checkpoint(old, tmp_path / "new", query)
    assert not (tmp_path / "new").exists() and tree_digest(old) == before


def test_an_unreadable_state_schema_file_refuses_the_transplant(page_visits, tmp_path):
    query = load_registry(page_visits / "registry.yaml").query("page_visits")
    old = tmp_path / "old"
    shutil.copytree(query.checkpoint, old)
    schema = next(p for p in old.glob("state/0/_stateSchema/default/*") if p.name[0] != ".")
    schema.write_bytes(schema.read_bytes()[:-20])
    with pytest.raises(TransplantRefused, match="the state schemas cannot be compared: .*"
                       "unreadable state schema file"):  # fmt: skip
        transplant_checkpoint(old, tmp_path / "new", query)
    assert not (tmp_path / "new").exists()


def test_the_cli_refuses_in_one_line_and_writes_nothing(page_visits, tmp_path):
    old = Path(load_registry(page_visits / "registry.yaml").query("page_visits").checkpoint)
    before = tree_digest(old)
    changed = write_registry(tmp_path, page_visits={"shuffle_partitions": 8})
    proc = run_cli("--registry", str(changed), "transplant", str(old), str(tmp_path / "new"),
                   "--query", "page_visits")  # fmt: skip
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert proc.stderr.startswith("error: transplant of ") and "partitions" in proc.stderr
    assert not (tmp_path / "new").exists() and tree_digest(old) == before
    marker = load_registry(changed).bootstrap_marker("page_visits")
    assert not marker.exists(), "a refused transplant leaves no pending proof"
    with pytest.raises(StateOpsError, match="not empty"):  # and a used folder is never a target
        transplant_checkpoint(old, page_visits / "landing", load_registry(changed).query(
            "page_visits"))  # fmt: skip
