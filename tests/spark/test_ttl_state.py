"""A processor with a TTL on its value, map and list state, in ProcessingTime mode
(tests/spark/user_code/ttl_visits.py). Spark stores each value wrapped as ``{value,
ttlExpirationMs}`` and restarts the same code on such a checkpoint without complaint: the code
check reads the state as Spark does, so the query runs again after its first run and after
every operation (rollback, repartition, backfill, restore), through ``stateops run`` too.
Library-level in the shared session (stream_start runs the same preflight as the run job)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml

from stateops.control.lock import new_run_id
from stateops.control.target import query_target
from stateops.core.checkpoint import load_checkpoint
from stateops.core.registry import load_registry
from stateops.ops.backfill import plan_backfill, run_backfill
from stateops.ops.backup import backup_checkpoint, backup_first
from stateops.ops.repartition import run_repartition
from stateops.ops.restore import plan_restore, run_restore
from stateops.ops.rollback import run_rollback
from stateops.ops.upgrade import UNCHANGED, check_code_change
from tests.conftest import log_trouble, run_cli, write_registry
from tests.spark.harness import (
    USER_CODE,
    copy_query,
    in_session,
    job_runner,
    land,
    last_committed,
    repoint,
    run_in_session,
)

pytestmark = [pytest.mark.spark, pytest.mark.whole]  # a shape: state with a TTL

NAME = "page_visits"
TTL = {"class": "ttl_visits:TtlVisits", "time_mode": "ProcessingTime", "output_mode": "Update"}


def quiet(_: str) -> None:
    pass


def ttl_registry(root: Path) -> Path:
    """registry.yaml's page_visits running the TTL processor from ``code_paths``, backed up to
    the test's S3."""
    path = write_registry(root, **{NAME: {"processor": TTL}})
    raw = yaml.safe_load(path.read_text())
    raw["code_paths"] = [str(USER_CODE)]
    raw["backups"]["url"] = f"s3://backups/ttl-{root.name}"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


@pytest.fixture(scope="module")
def ran(spark, tmp_path_factory) -> Path:
    """The query run once by Spark over 4 files of round 0 (a batch each): copied below."""
    root = tmp_path_factory.mktemp("ttl")
    registry = ttl_registry(root)
    land(root / "landing", round_=0, files=4)
    run_in_session(spark, registry, NAME)
    return registry


@pytest.fixture
def query_copy(ran, tmp_path) -> Path:
    """A copy of the query run once (its input, checkpoint and output) to operate on."""
    shutil.copytree(ran.parent / "landing", tmp_path / "landing")
    registry = ttl_registry(tmp_path)
    copy_query(ran, registry, NAME)
    repoint(Path(load_registry(registry).query(NAME).checkpoint), ran.parent, tmp_path)
    return registry


def runs_again(spark, registry: Path) -> None:
    """New input, and a run (its preflight checks the code against the state first)."""
    before = last_committed(Path(load_registry(registry).query(NAME).checkpoint))
    land(registry.parent / "landing", round_=1, files=1)
    summary = run_in_session(spark, registry, NAME)
    assert summary["status"] == "succeeded", summary
    assert last_committed(Path(load_registry(registry).query(NAME).checkpoint)) > before


def test_the_code_check_reads_ttl_state_as_spark_restarts_it(ran, query_copy):
    query = load_registry(ran).query(NAME)
    cp = load_checkpoint(query.checkpoint)
    stored = {v["stateName"]: v["ttlEnabled"] for v in _variables(cp)}
    assert stored == {"count": True, "per_page": True, "recent": True}, stored
    changes = check_code_change(cp, query)
    assert {c.what: c.verdict for c in changes} == {
        "key": UNCHANGED,
        "state 'count'": UNCHANGED,
        "state 'per_page'": UNCHANGED,
        "state 'recent'": UNCHANGED,
    }, changes

    # The status's verdict and the CLI's run agree with Spark's restart.
    status = run_cli("--registry", str(query_copy), "status", NAME, "--json", "--no-backups")
    assert status.returncode == 0, status.stdout + status.stderr
    assert json.loads(status.stdout)[0]["health"]["verdict"] != "FAIL", status.stdout
    land(query_copy.parent / "landing", round_=1, files=1)
    run = run_cli("--registry", str(query_copy), "run", NAME, timeout=600)
    assert run.returncode == 0, run.stderr[-4000:]
    assert "TransformWithStateInPySparkStateServer" not in run.stderr  # a WARN per new key
    assert log_trouble(run.stderr, said=run.stdout) == [], run.stderr[-4000:]
    after = last_committed(Path(load_registry(query_copy).query(NAME).checkpoint))
    assert after > cp.last_committed_batch


def _variables(cp) -> list[dict]:
    from stateops.ops.state_schema import operator_properties

    props, _ = operator_properties(cp, cp.last_committed_batch)
    return [v for v in props["stateVariables"] if not v["stateName"].startswith("$")]


def test_rolled_back_it_runs_again(spark, query_copy):
    last = last_committed(Path(load_registry(query_copy).query(NAME).checkpoint))
    target = query_target(query_copy, NAME)
    run_rollback(target, last - 2, run_id=new_run_id("rollback"), log=quiet)
    runs_again(spark, query_copy)


def test_repartitioned_it_runs_again(spark, query_copy):
    done = run_repartition(
        query_target(query_copy, NAME),
        3,
        run_id=new_run_id("repartition"),
        log=quiet,
        submit=in_session(spark, query_copy),
    )
    assert done["proof"]["ok"], done["proof"]
    runs_again(spark, query_copy)


def test_backfilled_then_restored_it_runs_again(spark, s3, query_copy):
    target = query_target(query_copy, NAME)
    client = s3.client()
    last = last_committed(Path(target.require_query("").checkpoint))
    backup = backup_checkpoint(
        target.require_query("").checkpoint, target.backup_location(), client, log=quiet
    )
    run_id = new_run_id("backfill")
    # Batches 0-3 read a file each; the clock drove the later ones (no input: TTL eviction).
    plan = plan_backfill(target, run_id, to_batch=1, dry_run=False, log=quiet)
    done = run_backfill(
        target,
        plan,
        run_id=run_id,
        backup=backup_first(target, client, "backfill", log=quiet),
        run_job=job_runner(spark),
        log=quiet,
    )
    assert done["summary"]["batches_run"] >= 2, done["summary"]
    runs_again(spark, query_copy)

    registry = load_registry(query_copy)
    restore = plan_restore(
        NAME, client, backup=backup["backup_id"], registry=registry, replace=True
    )
    run_restore(restore, client, registry=registry, log=quiet)
    assert last_committed(Path(registry.query(NAME).checkpoint)) == last
    runs_again(spark, query_copy)
