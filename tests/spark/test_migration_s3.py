"""The migration on S3 (issue 43, docs/migration-on-s3.md): Spark drains, carries over, runs
and proves the first batch on ``s3a://`` (the embedded SeaweedFS endpoint), by both roads, an
S3 checkpoint to a new S3 one and a local checkpoint to a new S3 one. The result equals one
query stopped and restarted at the cutover (tests/spark/migrations.py); a failure after each
step (the session's fault steps) rolls back to an old checkpoint that restarts, the failed new
S3 checkpoint set aside in place under a hold; the retired old checkpoint is refused by
``stateops run``'s and the DAGs' preflight (the run job's own, which both call), by the run
itself and by every lifecycle operation, until ``stateops unretire`` lifts the hold.

The Spark steps run their jobs' own ``main()`` in the shared session
(tests.spark.harness.job_runner); the same step functions run in the DAG
(tests/dag/test_migration.py) and behind ``stateops migrate`` (test_migration_run.py).
"""

from __future__ import annotations

import os
import random
import re
from pathlib import Path

import pytest

from stateops.control.markers import read_retired, refuse_retired
from stateops.control.target import query_target
from stateops.core.checkpoint import load_checkpoint
from stateops.core.errors import CheckpointError, StateOpsError
from stateops.core.registry import load_registry
from stateops.core.staging import occupied
from stateops.core.steps import RUN, fill
from stateops.ops.backup import backup_first
from stateops.ops.cleanup import run_cleanup
from stateops.ops.migration import plan_migration, run_migration
from stateops.ops.start import run_start
from stateops.spark.jobs import job_path, preflight_job
from tests.conftest import run_cli
from tests.spark.harness import digest, job_runner, run_in_session
from tests.spark.migrations import (
    STEPS,
    Migration,
    assert_migrated,
    assert_rolled_back,
    uninterrupted,
)

pytestmark = pytest.mark.spark
NAME = "page_visits"


def s3_faults(road: str) -> list[str]:
    """The steps a run on ``road`` fails after here: the one whose roll back differs most on
    S3 (the transplant road's switch: the new S3 checkpoint set aside in place, the switch
    undone, the retirement lifted; the initialState road's bootstrap: a new S3 checkpoint
    Spark wrote, set aside), and one more of the road's steps chosen by the session's fault
    seed (STATEOPS_FAULT_SEED), so that successive sessions fail after each step on S3 too, as
    tests/spark/test_migration_run.py does on local disk; STATEOPS_ALL_FAULTS=1: every step."""
    off_road = {"transplant", "first_batch"} if road == "initial_state" else set()
    steps = [step for step, on in STEPS if on in ("auto", road) and step not in off_road]
    if os.environ.get("STATEOPS_ALL_FAULTS"):
        return steps
    fixed = "switch" if road == "auto" else "bootstrap"
    seed = os.environ["STATEOPS_FAULT_SEED"]
    rotating = random.Random(f"{seed}:s3:{road}").choice([s for s in steps if s != fixed])
    return [step for step in steps if step in (fixed, rotating)]


@pytest.fixture(scope="module")
def whole(spark, s3a, tmp_path_factory):
    """The module's S3 settings (the library and Spark read them from the environment), a
    ``backups`` bucket on the same endpoint, and what every migration here must equal: the
    query run once over both rounds on one source."""
    with pytest.MonkeyPatch.context() as env:
        s3a.set_env(env)
        client = s3a.client()
        if "backups" not in [b["Name"] for b in client.list_buckets().get("Buckets", [])]:
            client.create_bucket(Bucket="backups")
        yield uninterrupted(spark, tmp_path_factory.mktemp("whole"), NAME)


def _source(m: Migration) -> dict:
    conf = m.conf()
    return {
        "format": conf["new_source_format"],
        "path": conf["new_source_path"],
        "options": conf["new_source_options"],
    }


def _migrate(spark, m: Migration, plan: dict, log: list[str]) -> dict:
    target = query_target(m.path, m.name)
    backup = backup_first(target, m.s3.client(), "migration", log=log.append)
    return run_migration(target, plan, backup=backup, run_job=job_runner(spark), log=log.append)


def _fail_then_migrate(spark, m: Migration, road: str, steps: list[str], new, monkeypatch) -> tuple:
    """A run failing after each of ``steps``, each rolled back (the old query then restarts,
    reading nothing new), then one that migrates; ``new(i)``: run i's new checkpoint ("":
    the default). Returns the successful plan, its log and the new checkpoints set aside."""
    drained, aside = None, []
    for i, step in enumerate(steps):
        target = query_target(m.path, m.name)
        plan = plan_migration(target, _source(m), new(i), f"m-fail-{i}", carry_over=road)
        monkeypatch.setenv("STATEOPS_FAIL_AFTER", step)
        log: list[str] = []
        with pytest.raises(StateOpsError, match=f"failed at {step} .*it was rolled back"):
            _migrate(spark, m, plan, log)
        drained = assert_rolled_back(m, step, drained, new=plan["new"]["checkpoint"])
        if occupied(plan["new"]["checkpoint"]):
            aside.append(plan["new"]["checkpoint"])
    monkeypatch.delenv("STATEOPS_FAIL_AFTER", raising=False)
    if steps:
        run_in_session(spark, m.path, m.name)  # the old query restarts: nothing new to read
        if drained is not None:
            assert digest(m.old) == drained
    plan = plan_migration(
        query_target(m.path, m.name), _source(m), new(len(steps)), "m-ok", carry_over=road
    )
    log: list[str] = []
    _migrate(spark, m, plan, log)
    return plan, "\n".join(log), aside


def _assert_held(m: Migration, aside: list[str]) -> None:
    """The retired old checkpoint, once the switch is undone (the registry points at it
    again), is refused by the run job's preflight (``stateops run`` and the DAGs' Spark
    operator call it before spark-submit), by the run itself and by a cleanup, changing
    nothing; ``stateops unretire`` lifts the hold and the preflight passes. A failed run's
    checkpoint set aside is refused just the same."""
    old = m.old
    registry = load_registry(m.path)
    registry.switch_path(m.name).unlink()  # the undo's first step
    assert m.query().checkpoint == old
    before = digest(old)
    said = rf"^{re.escape(old)}: retired by the migration of {m.name} \(run m-ok\) to "
    job, _, args = fill(RUN, {"query": m.name, "mode": "available-now", "run_id": "r-held"})
    preflight = [job_path(job), ["--registry", str(m.path), *args]]
    with pytest.raises(CheckpointError, match=said + r".*stateops unretire"):
        preflight_job(*preflight)
    cli = run_cli("--registry", str(m.path), "run", m.name, env=m.s3.env())  # the user's door
    assert cli.returncode == 2 and re.search(said[1:], cli.stderr), cli.stderr
    target = query_target(m.path, m.name)
    with pytest.raises(CheckpointError, match=said):
        run_start(target, run_id="r-held")
    with pytest.raises(CheckpointError, match=said):
        run_cleanup(target, 1, run_id="c-held", log=lambda line: None)
    assert digest(old) == before
    for checkpoint in aside:
        with pytest.raises(CheckpointError, match="set aside: the new checkpoint of the failed"):
            refuse_retired(checkpoint)
    lifted = run_cli("--registry", str(m.path), "unretire", old, env=m.s3.env())
    assert lifted.returncode == 0, lifted.stderr
    assert read_retired(old) is None
    preflight_job(*preflight)


@pytest.mark.whole  # the gate: a migration on local disk (test_migration_run)
def test_an_s3_checkpoint_migrates_to_s3_by_transplant_and_its_failures_roll_back(
    spark, s3a, whole, tmp_path, monkeypatch
):
    m = Migration(spark, tmp_path, NAME, s3a, checkpoint=s3a.url(f"{tmp_path.name}/{NAME}"))
    steps = s3_faults("auto")
    plan, log, aside = _fail_then_migrate(spark, m, "auto", steps, lambda i: "", monkeypatch)
    assert plan["carry_over"]["road"] == "transplant" and plan["new"]["checkpoint"].startswith(
        f"{m.old}.v"
    )
    assert "carry-over road: transplant" in log
    assert_migrated(spark, m, whole, log, "transplant", new=plan["new"]["checkpoint"])
    _assert_held(m, aside)


@pytest.mark.whole
def test_a_local_checkpoint_migrates_to_s3_by_initial_state_and_its_failures_roll_back(
    spark, s3a, whole, tmp_path, monkeypatch
):
    m = Migration(spark, tmp_path, NAME, s3a)
    assert not m.old.startswith("s3") and Path(m.old).is_dir()
    steps = s3_faults("initial_state")
    plan, log, aside = _fail_then_migrate(
        spark,
        m,
        "initial_state",
        steps,
        lambda i: s3a.url(f"{tmp_path.name}/{NAME}-{i}"),
        monkeypatch,
    )
    assert "carry-over road: initial_state" in log
    assert_migrated(spark, m, whole, log, "initial_state", new=plan["new"]["checkpoint"])
    assert load_checkpoint(plan["new"]["checkpoint"]).last_committed_batch is not None
    _assert_held(m, aside)
