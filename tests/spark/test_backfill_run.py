"""The backfill's plan is the plan that runs (stateops.ops.backfill): a rollback whose checkpoint
moved on since the plan the operator saw is refused and changes nothing. The whole backfill
through ``stateops backfill`` against the DAG's: tests/dag/test_stream_start_run.py."""

from __future__ import annotations

import pytest

from stateops.core.errors import CheckpointError, StateOpsError
from stateops.core.registry import load_registry
from stateops.ops.backfill import plan_backfill, rollback_for_backfill
from tests.conftest import tree_digest, write_registry
from tests.spark.harness import land, run_in_session

pytestmark = pytest.mark.spark


def test_a_rollback_is_refused_when_the_checkpoint_moved_on_since_its_plan(spark, tmp_path):
    path = write_registry(tmp_path)
    land(tmp_path / "landing", round_=0, files=3)
    run_in_session(spark, path, "page_visits")
    registry = load_registry(path)
    lines: list[str] = []
    plan = plan_backfill(registry, "page_visits", "r1", to_batch=1, log=lines.append)
    assert plan["to_batch"] == 1 and plan["last_committed_batch"] == 2
    assert any("would delete" in line for line in lines), lines
    with pytest.raises(
        StateOpsError, match="^to_batch, input_before: give one of them, the last batch to keep"
    ):
        plan_backfill(registry, "page_visits", "r1", log=lines.append)

    land(tmp_path / "landing", round_=1, files=1)  # the query runs once more after the plan
    run_in_session(spark, path, "page_visits")
    before = tree_digest(tmp_path)
    backups: list[str] = []
    with pytest.raises(CheckpointError, match="changed since the plan was made .* plan again"):
        rollback_for_backfill(registry, plan, lambda: backups.append("taken") or "b-1")
    assert tree_digest(tmp_path) == before and backups == [], "refused before the backup"
