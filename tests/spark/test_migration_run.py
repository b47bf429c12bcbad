"""The migration's steps in one process (``stateops.ops.migration.run_migration``, behind
``stateops migrate``): a failure after each step rolls the run back, and a new run migrates,
to the state and output of one uninterrupted query (tests/spark/migrations.py), by transplant
and, as the query now wants another partition count, Spark's repartition. The Spark
steps run their jobs' own ``main()`` in the shared session while failing one by one; the
migration that succeeds is ``stateops migrate`` itself, its jobs through ``spark-submit``.
The DAG runs the same step functions: tests/dag/test_migration.py.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
import yaml

from stateops.control.lock import read_hold
from stateops.control.target import query_target
from stateops.core.checkpoint import load_checkpoint
from stateops.core.errors import StateOpsError
from stateops.core.registry import load_registry
from stateops.ops.backup import backup_first
from stateops.ops.migration import plan_migration, run_migration
from tests.conftest import run_cli, tree_digest
from tests.spark.harness import (
    USER_CODE,
    V2_STATE_STORE,
    job_runner,
    land,
    run_in_session,
    shape_registry,
    state_and_output,
)
from tests.spark.migrations import (
    FAULTS,
    FILES,
    Migration,
    as_parquet,
    assert_migrated,
    assert_rolled_back,
    uninterrupted,
)

pytestmark = pytest.mark.spark


def _cli_args(m: Migration, road: str = "auto") -> list[str]:
    conf = m.conf(carry_over=road)
    return [
        "--registry",
        str(m.path),
        "migrate",
        m.name,
        "--new-source-path",
        conf["new_source_path"],
        "--new-source-format",
        conf["new_source_format"],
        "--new-source-option",
        "maxFilesPerTrigger=1",
        "--carry-over",
        road,
    ]


@pytest.mark.whole
def test_a_failure_after_each_step_rolls_back_then_stateops_migrate_migrates(
    spark, s3, tmp_path, monkeypatch
):
    """The processor is the user's own (tests/spark/user_code/my_visits.py), found through the
    registry's ``code_paths`` only: every step that imports it, by either road, applies them."""
    whole = uninterrupted(spark, tmp_path, "page_visits")
    mine = {"class": "my_visits:MyVisits", "options": {"max_pages": 1000}}
    m = Migration(spark, tmp_path, "page_visits", s3, code_paths=(USER_CODE,), processor=mine)
    old = Path(m.query().checkpoint)
    before = tree_digest(m.root / "checkpoints")
    # Not importable here but through the registry (the old run in this process imported it).
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p != str(USER_CODE)])
    monkeypatch.delitem(sys.modules, "my_visits")

    for road in ("transplant", "initial_state"):
        dry = run_cli(*_cli_args(m, road), "--dry-run")
        assert dry.returncode == 0, dry.stderr
        assert "DRY RUN: nothing changed: migration of page_visits" in dry.stderr
        assert json.loads(dry.stdout)["carry_over"]["road"] == road
    assert tree_digest(m.root / "checkpoints") == before
    assert read_hold(load_registry(m.path).lock_path("page_visits")) is None

    run_job = job_runner(spark)
    drained = None
    for i, (step, road) in enumerate(FAULTS):
        target = query_target(m.path, m.name)
        conf = m.conf(carry_over=road)
        source = {
            "format": conf["new_source_format"],
            "path": conf["new_source_path"],
            "options": conf["new_source_options"],
        }
        plan = plan_migration(target, source, "", f"m-fail-{i}", carry_over=road)
        monkeypatch.setenv("STATEOPS_FAIL_AFTER", step)
        log: list[str] = []
        with pytest.raises(StateOpsError) as failed:
            run_migration(
                target,
                plan,
                backup=_backup(target, s3.client(), log),
                run_job=run_job,
                log=log.append,
            )
        assert f"failed at {step} (injected failure after {step}" in str(failed.value)
        assert "it was rolled back" in str(failed.value)
        assert "page_visits: migration rolled back; the query runs on" in "\n".join(log)
        drained = assert_rolled_back(m, step, drained)
    monkeypatch.delenv("STATEOPS_FAIL_AFTER")
    assert len(list(tmp_path.glob("checkpoints/page_visits.v2.failed-*"))) >= 2  # kept aside

    # The old query is still runnable: nothing new to read, so no batch and no change.
    run_in_session(spark, m.path, "page_visits")
    assert tree_digest(old) == drained

    # The query now wants 3 partitions (its old state has 2): the transplant keeps 2, and the
    # first batch's job has Spark repartition the new checkpoint before it runs.
    raw = yaml.safe_load(m.path.read_text())
    raw["queries"]["page_visits"]["shuffle_partitions"] = 3
    m.edit_registry(queries=raw["queries"])
    migrated = run_cli(*_cli_args(m), env=m.s3.env(), timeout=600)
    log = migrated.stdout + migrated.stderr
    assert migrated.returncode == 0, log[-8000:]
    assert "carry-over road: transplant" in log and "transplant done:" in log
    last = load_checkpoint(old).last_committed_batch
    assert f"then Spark's repartition writes batch {last + 1}" in log
    assert f": 2 -> 3 state partitions in batch {last + 1}; proven:" in log, log[-8000:]
    assert json.loads(migrated.stdout.strip().splitlines()[-1])["carry_over"] == "transplant"
    assert_migrated(spark, m, whole, log, "transplant")
    new = load_checkpoint(m.query().checkpoint)
    assert new.repartition_batches() == {last + 1: (2, 3)}
    assert new.partitions(new.last_committed_batch) == 3


def test_a_transforms_state_moves_to_the_new_source_by_transplant(spark, s3, tmp_path):
    """The windowed count (Spark's aggregation on the HDFS-backed store): the same steps, the
    carried state proven store by store, to the state and output of one query over both
    rounds on one source."""
    whole = uninterrupted(spark, tmp_path, "page_counts")
    m = Migration(spark, tmp_path, "page_counts", s3)
    log = _migrated_in_session(spark, m, "m-transform")
    assert "carry-over road: transplant" in log
    assert_migrated(spark, m, whole, "\n".join(log), "transplant")


def _backup(target, client, log: list[str]):
    """The migration's backup (stateops.ops.backup.backup_first), said into ``log``."""
    return backup_first(target, client, "migration", log=log.append)


def _migrated_in_session(spark, m: Migration, run_id: str) -> list[str]:
    """``m``'s migration planned and run in one process (its Spark steps in the shared
    session), by the transplant road that ``auto`` must choose: its log lines."""
    target, conf = query_target(m.path, m.name), m.conf()
    source = {
        "format": conf["new_source_format"],
        "path": conf["new_source_path"],
        "options": conf["new_source_options"],
    }
    plan = plan_migration(target, source, "", run_id)
    assert plan["carry_over"]["road"] == "transplant", plan["carry_over"]
    log: list[str] = []
    run_migration(
        target,
        plan,
        backup=_backup(target, m.s3.client(), log),
        run_job=job_runner(spark),
        log=log.append,
    )
    return log


@pytest.mark.whole
def test_a_v2_checkpoint_moves_to_the_new_source_by_transplant(spark, s3, tmp_path):
    """Checkpoint format v2 (issue 21): the transplant copies the restart set the commit's ids
    name, and the commits that name them, so the new checkpoint goes on in v2 to the state
    and output of one query over both rounds on one source."""
    entry = {"state_store": V2_STATE_STORE}
    whole = uninterrupted(spark, tmp_path, "page_visits", **entry)
    m = Migration(spark, tmp_path, "page_visits", s3, **entry)
    log = _migrated_in_session(spark, m, "m-v2")
    assert_migrated(spark, m, whole, "\n".join(log), "transplant")
    assert load_checkpoint(m.query().checkpoint).format_version == 2


def _land_round(root: Path, round_: int, *datasets: str) -> None:
    """Round ``round_`` of the sample events, only ``datasets`` of it, into ``root/landing``."""
    staged = root / f"round{round_}"
    land(staged, round_=round_, files=FILES)
    for dataset in datasets:
        for f in sorted((staged / dataset).iterdir()):
            os.replace(f, root / "landing" / dataset / f.name)  # mtimes kept: the file order


@pytest.mark.whole
def test_a_join_moves_one_of_its_two_sources_by_transplant(spark, s3, tmp_path):
    """The stream-stream join of views and events: events move from JSON to Parquet and views
    stay where they are. State and output equal one query on the JSON sources that stopped and
    restarted at the cutover: round 1's events, then round 1's views."""
    name = "views_near_events"
    control = shape_registry(tmp_path / "control")
    land(control.parent / "landing", round_=0, files=FILES)
    run_in_session(spark, control, name)
    _land_round(control.parent, 1, "user_sessions")
    run_in_session(spark, control, name)
    _land_round(control.parent, 1, "page_visits")
    run_in_session(spark, control, name)

    root = tmp_path / "touched"
    touched = shape_registry(root)
    land(root / "landing", round_=0, files=FILES)
    run_in_session(spark, touched, name)  # all of round 0: the drain finds nothing new
    events = load_registry(touched).query(name).sources["events"]
    land(root / "round1", round_=1, files=FILES)
    as_parquet(
        sorted((root / "round1" / "user_sessions").iterdir()),
        root / "landing_v2" / "user_sessions",
        events.schema_,
    )

    target = query_target(touched, name)
    new_source = {
        "format": "parquet",
        "path": "landing_v2/user_sessions",
        "options": {"maxFilesPerTrigger": 1},
    }
    with pytest.raises(StateOpsError, match="name the one that moves"):
        plan_migration(target, new_source, "", "m-join")
    plan = plan_migration(target, new_source, "", "m-join", moved_source="events")
    assert plan["carry_over"]["road"] == "transplant", plan["carry_over"]
    log: list[str] = []
    run_migration(
        target,
        plan,
        backup=_backup(target, s3.client(), log),
        run_job=job_runner(spark),
        log=log.append,
    )
    said = "\n".join(log)
    assert "1 source read anew, 1 kept" in said and "carry-over proven" in said, said

    query = load_registry(touched).query(name)
    assert query.sources["events"].format == "parquet"
    assert query.sources["views"] == load_registry(control).query(name).sources["views"].model_copy(
        update={"path": str(root / "landing" / "page_visits")}
    ), "views stay where they were"
    for f in sorted((root / "round1" / "page_visits").iterdir()):
        os.replace(f, root / "landing" / "page_visits" / f.name)
    run_in_session(spark, touched, name)
    assert state_and_output(spark, touched, name) == state_and_output(spark, control, name)
