"""Carry-over of user_sessions (list state and event-time timers) through export + bootstrap.

The road a source migration takes: the old query stops at a cutover, its state is exported,
and the query starts on the new source with that state. Sessions open at the cutover must
close on the new source exactly as they would have in one uninterrupted query.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
import yaml

from stateops.registry import load_registry
from tests.conftest import ROOT, run_cli, spark_job, spark_submit_run_query, write_registry
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


@pytest.mark.parametrize("timeout", [1800, 300])
def test_open_sessions_carry_over_and_close_like_an_uninterrupted_run(spark, tmp_path, timeout):
    timed = {"processor": {**PROCESSOR, "options": {"session_timeout_seconds": timeout}}}
    # The reference: one query on one source, stopped at the cutover and started again. (Each
    # available-now run ends with a no-data batch that fires the timers due at its watermark
    # before the next input arrives; one run over both rounds would fire them in the same
    # batch as that input, after it: with a 300 s timeout, other sessions.)
    whole = write_registry(tmp_path / "whole", user_sessions=timed)
    land(tmp_path / "whole" / "landing", round_=0, files=3)
    _ok(spark_submit_run_query(whole, "user_sessions"))
    land(tmp_path / "whole" / "landing", round_=1, files=3)
    _ok(spark_submit_run_query(whole, "user_sessions"))

    # The same events split at a cutover: round 0 on the old source, round 1 on the new one.
    old = write_registry(tmp_path / "old", user_sessions=timed)
    land(tmp_path / "old" / "landing", round_=0, files=3)
    _ok(spark_submit_run_query(old, "user_sessions"))
    export = tmp_path / "export"
    assert run_cli("--registry", str(old), "export", "user_sessions", "--out", str(export),
                   check=True)  # fmt: skip
    manifest = json.loads((export / "manifest.json").read_text())
    open_at_cutover = next(e["rows"] for e in manifest["entries"] if e["variable"] == "events")
    assert open_at_cutover > 0, "no session was open at the cutover: nothing is carried over"

    new = write_registry(tmp_path / "new", user_sessions=timed)
    land(tmp_path / "new" / "landing", round_=1, files=3)
    boot = _ok(spark_job("bootstrap_state.py", "--registry", str(new), "--query",
                         "user_sessions", "--initial-state", str(export)))  # fmt: skip
    assert boot["bootstrap"] == "complete" and boot["proof"]["ok"], boot["proof"]
    _ok(spark_submit_run_query(new, "user_sessions"))  # the rest of the new source

    queries = {name: load_registry(reg).query("user_sessions") for name, reg in
               (("whole", whole), ("old", old), ("new", new))}  # fmt: skip
    assert read_state(spark, queries["new"].checkpoint, READS) == read_state(
        spark, queries["whole"].checkpoint, READS
    ), "state (open sessions and their timers) differs from the uninterrupted run's"
    split = _all_rows(queries["old"].sink.path) + _all_rows(queries["new"].sink.path)
    assert split == _all_rows(queries["whole"].sink.path)
    # Sessions that began before the cutover (round 0 events are "e0-...") ended after it.
    carried = [r for r in _all_rows(queries["new"].sink.path) if r[DATA].startswith("e0-")]
    assert carried, "no carried-over session closed on the new source"
