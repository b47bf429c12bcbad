"""stream_code_upgrade through ``airflow dags test`` on local Spark and the embedded S3:
page_visits' new code (views per user and page, stateops.pipelines.page_views) deployed
on the checkpoint its old code wrote. The status says what the new code does to the state, a
dry run prints the plan and changes nothing, a failure after the rewrite rolls back, and the
upgrade switches the query to the rewritten checkpoint. (The rewrite's state and output, and
a failure after each step, at the library level: tests/spark/test_upgrade.py.)"""

from __future__ import annotations

import json

import pytest

from stateops import cli
from stateops.control.audit import audit_dir
from stateops.control.lock import read_hold
from stateops.core.registry import load_registry
from stateops.status import query_status
from tests.conftest import S3_KEY, S3_SECRET
from tests.dag.test_migration import _task_states
from tests.dag.test_stream_start_run import _airflow
from tests.spark.harness import digest
from tests.spark.upgrading import (
    NAME,
    PER_PAGE,
    run_old_code,
    upgrade_registry,
    with_new_code,
)

pytestmark = pytest.mark.dag

# page_visits' count kept as text: Spark refuses it on the old checkpoint.
RETYPED = {
    "processor": {
        "class": "upgrades:CountAs",
        "options": {"max_pages": 1000, "schema": "visits STRING"},
        "time_mode": "None",
        "output_mode": "Update",
    }
}


@pytest.fixture(scope="module")
def old(spark, tmp_path_factory):
    """The one Spark-written old checkpoint of this module; each test upgrades a copy."""
    return run_old_code(spark, tmp_path_factory.mktemp("old-code"), "unsaferow")


def _trigger(root, s3, conf: dict, **env: str) -> tuple[int, str]:
    """``airflow dags test stream_code_upgrade --conf CONF``: its exit code and log."""
    conn = {
        "conn_type": "aws",
        "login": S3_KEY,
        "password": S3_SECRET,
        "extra": {"endpoint_url": s3.endpoint},
    }
    run = _airflow(
        root,
        "dags",
        "test",
        "stream_code_upgrade",
        "--conf",
        json.dumps({"query": NAME, **conf}),
        env={"AIRFLOW_CONN_AWS_DEFAULT": json.dumps(conn), **env},
    )
    return run.returncode, run.stdout + run.stderr


@pytest.mark.whole
def test_the_status_names_the_misfit_a_dry_run_plans_and_the_upgrade_switches(
    old, s3, tmp_path, capsys
):
    registry = with_new_code(old, tmp_path, "unsaferow", **PER_PAGE)
    before = digest(tmp_path / "checkpoints")
    # Code Spark refuses on the old state: the status fails, naming the change and the command.
    upgrade_registry(tmp_path, "unsaferow", **RETYPED)
    assert cli.main(["--registry", str(registry), "status", NAME, "--no-backups"]) == 1
    shown = capsys.readouterr().out
    assert f"{NAME}: FAIL" in shown, shown
    assert (
        "  FAIL            its code does not fit its checkpoint's state: state 'count': needs a "
        "state rewrite ((visits long) in the checkpoint, (visits string) in the new code"
    ) in shown, shown
    assert f"it cannot start: plan the state rewrite with `stateops upgrade {NAME} --dry-run`" in (
        shown
    )
    # The new code Spark would start by dropping the old state, which the registry's mapping
    # keeps: it fails too (stateops run refuses it), and the upgrade rewrites it.
    upgrade_registry(tmp_path, "unsaferow", **PER_PAGE)
    health = query_status(load_registry(registry), NAME)["health"]
    assert health["verdict"] == "FAIL"
    assert any(
        r.startswith(
            "its code does not fit its checkpoint's state: state 'count': Spark "
            "evolves it (removed: Spark drops its state"
        )
        for r in (health["reasons"])
    ), health

    code, log = _trigger(tmp_path, s3, {"dry_run": True})
    assert code == 0, log[-5000:]
    assert f"DRY RUN: nothing changed: code upgrade of {NAME} on {tmp_path}" in log
    for line in (
        "state 'count': Spark evolves it (removed: Spark drops its state; a rewrite",
        "state 'pages': Spark evolves it (removed: Spark drops its state; a rewrite",
        "state 'views': Spark evolves it (added: Spark starts it empty)",
        "map it with stateops.pipelines.page_views:views_from_page_visits and bootstrap",
    ):
        assert line in log, line
    assert "dry run: the plan above is all this run does" in log
    states = _task_states(tmp_path)
    assert states["preflight"] == "success" and states["stop_query"] == "skipped", states
    assert digest(tmp_path / "checkpoints") == before

    old_checkpoint = load_registry(registry).query(NAME).checkpoint
    code, log = _trigger(tmp_path, s3, {"dry_run": False})
    assert code == 0, log[-8000:]
    assert f"{NAME}: the upgrade goes on without approval (registry: approval: none)" in log
    query = load_registry(registry).query(NAME)
    assert query.checkpoint == f"{old_checkpoint}.v2"
    assert f"{NAME} upgraded: it runs its new code on {query.checkpoint}" in log
    lineage = json.loads((audit_dir(query.checkpoint) / "lineage.json").read_text())
    assert lineage["operation"] == "upgrade" and lineage["from"]["checkpoint"] == old_checkpoint
    status = query_status(load_registry(registry), NAME)
    assert {c["verdict"] for c in status["code"]} == {"unchanged"}, status["code"]
    assert status["health"]["verdict"] != "FAIL", status["health"]
    assert not [r for r in status["health"]["reasons"] if "its code" in r], status["health"]


def test_a_failure_after_the_rewrite_rolls_back_to_the_old_checkpoint_as_it_was(old, s3, tmp_path):
    registry = with_new_code(old, tmp_path, "unsaferow", **PER_PAGE)
    checkpoint = load_registry(registry).query(NAME).checkpoint
    before = digest(checkpoint)
    code, log = _trigger(tmp_path, s3, {"dry_run": False}, STATEOPS_FAIL_AFTER="rewrite")
    assert code != 0, log[-3000:]
    assert "injected failure after rewrite" in log
    assert (
        "the upgrade failed (see the failed step's log); it was rolled back and the query "
        "runs its old code on its old checkpoint"
    ) in log, log[-5000:]
    states = _task_states(tmp_path)
    assert (states["rewrite"], states["roll_back"], states["upgraded"]) == (
        "failed",
        "success",
        "upstream_failed",
    ), states
    assert load_registry(registry).query(NAME).checkpoint == checkpoint
    assert digest(checkpoint) == before
    assert read_hold(load_registry(registry).lock_path(NAME)) is None
