"""stream_source_migration through ``airflow dags test`` on local Spark and the embedded S3:
the dry run, a failed step rolled back by the DAG's ``roll_back`` task, and both roads of a
migration that succeeds (tests/spark/migrations.py: the scenario and what it must equal).
The same steps fail one by one at the library level, with the same checks
(tests/spark/test_migration_run.py); the REST API of a real stack: tests/e2e/test_airflow.py.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
import yaml

from stateops.control.lock import read_hold
from stateops.core.checkpoint import load_checkpoint
from stateops.core.registry import load_registry
from tests.conftest import tree_digest
from tests.spark.harness import run_in_session
from tests.spark.migrations import Migration, assert_migrated, assert_rolled_back, uninterrupted

pytestmark = [pytest.mark.dag, pytest.mark.whole]


def test_a_failed_step_rolls_back_then_a_new_trigger_migrates_by_the_road_that_applies(
    spark, s3, tmp_path
):
    """The dry run changes nothing. A failed step (here the first Spark step, the drain) runs
    the DAG's ``roll_back``, with the checks of the library's failure after each step. Then,
    after the registry's shuffle_partitions changed (the old state files have 2 partitions,
    the query now wants 3), the initialState road, chosen in the form, repartitions the state
    (auto takes the transplant and Spark's repartition: tests/spark/test_migration_run.py;
    where the transplant does not apply, auto falls back to this road:
    tests/spark/test_migration_preflight.py). (The transplant road through the DAG:
    tests/e2e/test_airflow.py; user_sessions' list state and timers on the initialState
    road, repartitioned: tests/spark/test_initial_state_road.py.)"""
    whole = uninterrupted(spark, tmp_path, "page_visits")
    m = Migration(spark, tmp_path, "page_visits", s3)
    old = Path(m.query().checkpoint)
    lock = load_registry(m.path).lock_path("page_visits")
    before = tree_digest(m.root / "checkpoints")
    # A dry run whose preflight refuses fails, and roll_back is skipped with its reason, not
    # red: there was nothing to roll back. (A dry run that succeeds, its plan and its gate's
    # reason in the task logs: tests/e2e/test_airflow.py; the CLI's: tests/spark/test_backup.py.)
    (m.root / "empty").mkdir()
    dry, log = m.trigger(m.conf(dry_run=True, new_source_path="empty"))
    assert dry.returncode != 0 and "has no input yet" in log, log[-5000:]
    assert "the preflight failed before anything changed: nothing to roll back" in log
    states = _task_states(m.root)
    assert (states["preflight"], states["roll_back"], states["migrated"]) == (
        "failed",
        "skipped",
        "upstream_failed",
    ), states
    assert tree_digest(m.root / "checkpoints") == before and read_hold(lock) is None

    run, log = m.trigger(m.conf(), STATEOPS_FAIL_AFTER="drain")
    assert run.returncode != 0, log[-3000:]
    assert "injected failure after drain" in log
    assert "migration rolled back; the query runs on" in log, log[-5000:]
    states = _task_states(m.root)  # roll_back did its work; the run failed: migrated did not run
    assert (states["drain"], states["roll_back"], states["migrated"]) == (
        "failed",
        "success",
        "upstream_failed",
    ), states
    drained = assert_rolled_back(m, "drain", None)
    # The old query is still runnable: nothing new to read, so no batch and no change.
    run_in_session(spark, m.path, "page_visits")
    assert tree_digest(old) == drained

    raw = yaml.safe_load(m.path.read_text())
    raw["queries"]["page_visits"]["shuffle_partitions"] = 3
    m.edit_registry(queries=raw["queries"])
    run, log = m.trigger(m.conf(carry_over="initial_state"))
    assert run.returncode == 0, log[-8000:]
    assert "carry-over road: initial_state" in log
    assert_migrated(spark, m, whole, log, "initial_state")
    new = load_checkpoint(m.query().checkpoint)
    assert [op.num_partitions for op in new.operators] == [3]


def _task_states(root: Path) -> dict[str, str]:
    """The task states of the last ``airflow dags test`` run under ``root``."""
    with sqlite3.connect(root / "airflow" / "airflow.db") as db:
        rows = db.execute(
            "SELECT task_id, state FROM task_instance WHERE run_id = "
            "(SELECT run_id FROM dag_run ORDER BY id DESC LIMIT 1)"
        ).fetchall()
    return dict(rows)
