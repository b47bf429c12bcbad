"""The backfill's plan is the plan that runs (stateops.ops.backfill): a rollback whose checkpoint
moved on since the plan the operator saw is refused and changes nothing. The whole backfill
through ``stateops backfill`` against the DAG's: tests/dag/test_stream_start_run.py."""

from __future__ import annotations

import signal
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import pytest
import yaml

from stateops.control.audit import read_audit
from stateops.control.lock import QueryLock, read_hold
from stateops.control.target import Target, query_target
from stateops.core.checkpoint import load_checkpoint
from stateops.core.errors import CheckpointError, LockHeldError, OperationFailed, StateOpsError
from stateops.core.plans import BackupFirst
from stateops.core.registry import load_registry
from stateops.ops.backfill import plan_backfill, rollback_for_backfill, run_backfill
from stateops.ops.rollback import plan_rollback
from stateops.ops.start import files_before
from stateops.ops.transplant import transplant_refusals
from stateops.status import query_status
from tests.conftest import tree_digest, write_registry
from tests.spark.harness import land, run_in_session

pytestmark = pytest.mark.spark


def test_a_rollback_is_refused_when_the_checkpoint_moved_on_since_its_plan(spark, tmp_path):
    path = write_registry(tmp_path)
    land(tmp_path / "landing", round_=0, files=3)
    run_in_session(spark, path, "page_visits")
    registry = load_registry(path)
    target = query_target(registry, "page_visits")
    lines: list[str] = []
    plan = plan_backfill(target, "r1", to_batch=1, dry_run=True, log=lines.append)
    assert plan["to_batch"] == 1 and plan["last_committed_batch"] == 2
    assert any("would delete" in line for line in lines), lines
    with pytest.raises(
        StateOpsError, match="^to_batch, input_before: give one of them, the last batch to keep"
    ):
        plan_backfill(target, "r1", dry_run=True, log=lines.append)

    land(tmp_path / "landing", round_=1, files=1)  # the query runs once more after the plan
    run_in_session(spark, path, "page_visits")
    before = tree_digest(tmp_path)
    backups: list[str] = []
    with pytest.raises(CheckpointError, match="changed since the plan was made .* plan again"):
        taken = BackupFirst(plan["backup_to"], lambda: backups.append("taken") or "b-1")
        rollback_for_backfill(target, plan, backup=taken)
    assert tree_digest(tmp_path) == before and backups == [], "refused before the backup"

    # Issue 40: a dry run with overrides writes nothing (it wrote the reprocessing's registry).
    everything = sorted(tmp_path.rglob("*"))
    dry = plan_backfill(
        target,
        "r2",
        to_batch=1,
        dry_run=True,
        overrides={"expectations": {"row_change_factor": 5.0}},
        log=lines.append,
    )
    assert dry["changes"] == ["expectations.row_change_factor: 10.0 -> 5.0"]
    assert sorted(tmp_path.rglob("*")) == everything

    # Issue 54: what the reprocessing run would refuse, the plan refuses first (here, code that
    # does not fit the state: a TTL added), changing nothing; with overrides as in the file.
    ttl = {"class": "tests.spark.leaky:VisitsWithTtl", "time_mode": "ProcessingTime"}
    for overrides in ({"processor": ttl}, None):
        if overrides is None:
            raw = yaml.safe_load(path.read_text())
            raw["queries"]["page_visits"]["processor"].update(ttl)
            path.write_text(yaml.safe_dump(raw, sort_keys=False))
        before = tree_digest(tmp_path)
        with pytest.raises(StateOpsError, match="^page_visits: its code does not fit the state in"):
            plan_backfill(
                query_target(path, "page_visits"),
                "r3",
                to_batch=1,
                dry_run=False,
                overrides=overrides,
                log=lines.append,
            )
        assert tree_digest(tmp_path) == before


KILLED = """
import os, signal, sys
from stateops.control.target import query_target
from stateops.core.plans import BackupFirst
from stateops.ops.backfill import plan_backfill, run_backfill
target = query_target(sys.argv[1], "page_visits")
plan = plan_backfill(target, "backfill-k", to_batch=1, dry_run=False)
def reprocess(job, registry_file, args):  # SIGKILL while the reprocessing runs
    os.kill(os.getpid(), signal.SIGKILL)
run_backfill(target, plan, run_id="backfill-k", backup=BackupFirst(plan["backup_to"],
             lambda: "b-1"), run_job=reprocess)
"""


def test_a_killed_backfill_and_a_planned_batch_are_said_with_what_clears_them(spark, tmp_path):
    """Issue 40: a backfill killed during its reprocessing left no record, `status` said OK,
    and the batch a killed run had planned blocked other operations without saying how to
    clear it. Each is a WARN now, and the command it names clears it."""
    path = write_registry(tmp_path)
    land(tmp_path / "landing", round_=0, files=4)
    run_in_session(spark, path, "page_visits")
    registry = load_registry(path)
    query = registry.query("page_visits")
    ckpt = Path(query.checkpoint)
    assert load_checkpoint(ckpt).last_committed_batch == 3

    killed = subprocess.run(
        [sys.executable, "-c", KILLED, str(path)], capture_output=True, text=True, timeout=300
    )
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    steps = [
        (r["result"], r["run_id"], r["batch_before"], r["batch_after"], r["backup_id"])
        for r in read_audit(ckpt)
        if r["operation"] == "backfill"
    ]
    assert steps == [("rolled back", "backfill-k", 3, 1, "b-1")]
    status = query_status(registry, "page_visits")
    lineage = [(r["operation"], r["result"]) for r in status["lineage"]]
    assert lineage == [("rollback", "succeeded"), ("backfill", "rolled back")]
    health = status["health"]
    said = (
        "backfill run backfill-k did not finish (rolled back): it rolled back to batch 1 "
        "(backup b-1) and did not reprocess; unless its stream_backfill run is still going, "
        "stateops run page_visits --run-id backfill-k reprocesses from there, as the backfill "
        "would have (its hold admits that run only)"
    )
    held = "backfill (run id backfill-k) holds the query (other operations wait)"
    assert health["verdict"] == "WARN" and said in health["reasons"] and held in health["reasons"]
    assert len(health["reasons"]) == 3  # and the input of batches 2 and 3 is waiting again
    assert any(
        r.startswith("2 input files of source landed and not read") for r in health["reasons"]
    )
    # Its hold keeps a scheduled start (the old logic) out; the run the warning names goes in.
    with pytest.raises(LockHeldError, match=r"held by backfill \(run backfill-k\)"):
        QueryLock(registry.lock_path("page_visits"), "page_visits", "run", "s-1").acquire()
    run_in_session(spark, path, "page_visits", "--run-id", "backfill-k")  # what it says
    assert load_checkpoint(ckpt).last_committed_batch == 3
    assert read_hold(registry.lock_path("page_visits")) is None, "its reprocessing ended it"
    assert query_status(registry, "page_visits")["health"] == {
        "verdict": "OK",
        "reasons": [],
        "findings": [],
    }

    for name in ("3", ".3.crc"):  # as a run killed between its offsets and its commit
        (ckpt / "commits" / name).unlink()
    planned = (
        "batch 3 is planned but not committed (a run was interrupted): stateops run page_visits "
        "finishes it (or drop it: stateops rollback page_visits --to-batch 2)"
    )
    assert query_status(registry, "page_visits")["health"]["reasons"] == [planned]
    with pytest.raises(StateOpsError) as refused:
        files_before(query, datetime.now(UTC))
    assert str(refused.value) == (
        "page_visits: batch 3 is planned but not committed (a run was interrupted): finish it "
        "with stateops run page_visits (or drop it: stateops rollback page_visits --to-batch "
        "2), then cut over"
    )
    assert transplant_refusals(load_checkpoint(ckpt), query)[0] == (
        f"batch 3 is planned but not committed (a run was interrupted): a run of its query "
        f"finishes it, or stateops rollback {ckpt} --to-batch 2 drops it"
    )
    dropped = plan_rollback(Target(str(ckpt), None, None), 2)["files"]["after-rollback-point"]
    assert "offsets/3" in dropped  # dropped
    run_in_session(spark, path, "page_visits")  # the run finishes it
    cp = load_checkpoint(ckpt)
    assert (cp.last_committed_batch, cp.uncommitted_batches) == (3, [])
    assert query_status(registry, "page_visits")["health"] == {
        "verdict": "OK",
        "reasons": [],
        "findings": [],
    }

    # A reprocessing that fails is a failed operation (the CLI exits 1, not 2 as for a refusal),
    # recorded with the batch the rollback left, and said by status until a run reprocesses.
    def fails(job: str, registry_file: str, args: list[str]) -> None:
        with pytest.raises(LockHeldError, match=r"held by backfill \(run backfill-f\)"):
            QueryLock(registry.lock_path("page_visits"), "page_visits", "run", "s-2").acquire()
        raise StateOpsError("run_query.py exited with code 1 (its output is above)")

    target = query_target(registry, "page_visits")
    plan = plan_backfill(target, "backfill-f", to_batch=2, dry_run=False, log=lambda _: None)
    with pytest.raises(OperationFailed) as failed:
        run_backfill(
            target,
            plan,
            run_id="backfill-f",
            backup=BackupFirst(plan["backup_to"], lambda: "b-2"),
            run_job=fails,
            log=lambda _: None,
        )
    assert str(failed.value) == (
        "the backfill of page_visits failed after its rollback (run_query.py exited with code 1 "
        "(its output is above)): batch 2 is the last committed batch (backup b-2); fix the "
        "cause, then stateops run page_visits reprocesses from there"
    )
    record = read_audit(ckpt)[-1]
    assert (
        record["operation"],
        record["result"],
        record["batch_before"],
        record["batch_after"],
    ) == ("backfill", "failed", 3, 2)
    assert query_status(registry, "page_visits")["health"]["reasons"][0].startswith(
        "backfill run backfill-f did not finish (failed: run_query.py exited with code 1"
    )
    assert read_hold(registry.lock_path("page_visits")) is None, "the operator's run goes on"
