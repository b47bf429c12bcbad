"""Restore safety on Spark-written checkpoints, against a real S3 API (rclone serve s3): the
target query's lock, the backup's query identity, staging folders of killed restores, and a
restore found complete. Spark writes two checkpoints once for the module; each test restores
over its own copy."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from stateops.control.audit import read_audit
from stateops.core.checkpoint import load_checkpoint
from stateops.core.errors import StateOpsError
from stateops.core.registry import load_registry
from stateops.core.verify import verify_checkpoint
from stateops.ops.backup import backup_checkpoint
from stateops.ops.restore import plan_restore, run_restore
from tests.conftest import run_cli, tree_digest, write_registry
from tests.spark.harness import aggregation_case, land, pipeline_case

pytestmark = pytest.mark.spark

BACKUPS = "s3://backups/restore-safety"
QUIET = {"log": lambda _: None}


@pytest.fixture(scope="module")
def written(spark, s3, tmp_path_factory) -> dict[str, dict]:
    """Two queries Spark ran once, each backed up: page_visits (``mine``; its backups where the
    registry of each test looks for them) and an aggregation (``other``: another query id)."""
    root = tmp_path_factory.mktemp("restore-safety")
    land(root / "landing", round_=0, files=2)
    mine, other = root / "page_visits", root / "aggregation"
    pipeline_case("page_visits", []).run(spark, root, mine, root / "sink-mine")
    aggregation_case("rocksdb").run(spark, root, other, root / "sink-other")
    client = s3.client()
    return {
        "mine": {
            "checkpoint": mine,
            "backup": backup_checkpoint(mine, f"{BACKUPS}/page_visits", client, **QUIET),
        },
        "other": {
            "checkpoint": other,
            "backup": backup_checkpoint(other, f"{BACKUPS}/other", client, **QUIET),
        },
    }


@pytest.fixture
def registered(tmp_path, written) -> tuple[Path, Path]:
    """(registry, page_visits's registered checkpoint): a copy of the Spark-written one."""
    path = write_registry(tmp_path / "data")
    raw = yaml.safe_load(path.read_text())
    raw["backups"] = {"url": BACKUPS}
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    checkpoint = Path(load_registry(path).query("page_visits").checkpoint)
    shutil.copytree(written["mine"]["checkpoint"], checkpoint, symlinks=True)
    return path, checkpoint


def _siblings(path: Path) -> list[str]:
    return sorted(p.name for p in path.parent.iterdir())


def _errors(proc: subprocess.CompletedProcess) -> list[str]:
    assert "Traceback" not in proc.stderr, proc.stderr
    return [line for line in proc.stderr.splitlines() if line.startswith("error:")]


def _holds(target: Path, backup: dict) -> bool:
    """``target`` is the backup restored: its query, its last batch, and sound."""
    cp = load_checkpoint(target)
    return (
        cp.query_id == backup["query_id"]
        and cp.last_committed_batch == backup["batch_id"]
        and verify_checkpoint(target)["ok"]
    )


HOLDER = """
import sys
from pathlib import Path
from stateops.control.lock import QueryLock
with QueryLock(Path(sys.argv[1]), "page_visits", "run", run_id="run-holding-it"):
    print("held", flush=True)
    sys.stdin.read()
"""


def test_a_restore_over_a_query_whose_lock_another_process_holds_is_refused(
    s3, registered, written
):
    registry, checkpoint = registered
    lock = load_registry(registry).lock_path("page_visits")
    before, siblings = tree_digest(checkpoint), _siblings(checkpoint)
    cli = ("--registry", str(registry), "restore", "page_visits", "--backup", "latest", "--replace")
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(lock)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline() == "held\n"
        dry = run_cli(*cli, "--dry-run", env=s3.env())
        assert dry.returncode == 0, dry.stderr
        assert "page_visits is locked by run (run run-holding-it" in dry.stderr, dry.stderr
        refused = run_cli(*cli, env=s3.env())
        assert refused.returncode == 2
        [error] = _errors(refused)
        assert "query 'page_visits' is locked by run (run run-holding-it" in error, error
        assert f":{holder.pid})" in error, "the holder is named, its process too"
        assert tree_digest(checkpoint) == before and _siblings(checkpoint) == siblings
    finally:
        holder.communicate(timeout=30)  # stdin closed: the holder releases and exits

    # Released: the same restore goes through and the old checkpoint is kept aside.
    done = run_cli(*cli, env=s3.env())
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["backup_id"] == written["mine"]["backup"]["backup_id"]
    assert _holds(checkpoint, written["mine"]["backup"])
    assert tree_digest(Path(result["moved_aside"])) == before
    # The same again: already there, nothing changed, exit 0.
    restored = tree_digest(checkpoint)
    again = run_cli(*cli, env=s3.env())
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout)["already_restored"] is True
    assert "already restored" in again.stderr
    assert tree_digest(checkpoint) == restored


def test_a_backup_of_another_query_is_refused_naming_both_ids_unless_allowed(
    s3, registered, written
):
    registry, checkpoint = registered
    mine = load_checkpoint(checkpoint).query_id
    other = written["other"]["backup"]
    assert other["query_id"] != mine
    url = f"{BACKUPS}/other/{other['backup_id']}"
    cli = ("--registry", str(registry), "restore", url, "--to", str(checkpoint), "--replace")
    before, siblings = tree_digest(checkpoint), _siblings(checkpoint)

    refused = run_cli(*cli, env=s3.env())
    assert refused.returncode == 2
    [error] = _errors(refused)
    assert f"holds query {mine}, but backup {other['backup_id']} is of query " in error
    assert other["query_id"] in error and "--allow-other-query" in error
    # The library refuses the same (the DAG's plan task calls it).
    with pytest.raises(StateOpsError, match=f"holds query {mine}, but backup"):
        plan_restore(
            url, s3.client(), to=checkpoint, registry=load_registry(registry), replace=True
        )
    assert tree_digest(checkpoint) == before and _siblings(checkpoint) == siblings

    dry = run_cli(*cli, "--allow-other-query", "--dry-run", env=s3.env())
    assert dry.returncode == 0, dry.stderr
    assert (
        f"!! ANOTHER QUERY: the state of query {other['query_id']} replaces that of query {mine}"
        in dry.stderr
    ), dry.stderr
    assert tree_digest(checkpoint) == before and _siblings(checkpoint) == siblings

    allowed = run_cli(*cli, "--allow-other-query", env=s3.env())
    assert allowed.returncode == 0, allowed.stderr
    result = json.loads(allowed.stdout)
    assert _holds(checkpoint, other)
    assert tree_digest(Path(result["moved_aside"])) == before
    record = read_audit(checkpoint)[-1]
    assert record["operation"] == "restore" and record["allowed_other_query"] is True
    assert (record["query_id"], record["replaced_query_id"]) == (other["query_id"], mine)


# Where a restore is killed (SIGKILL, at a point of stateops.core.faults).
KILL_POINTS = {
    "downloading": "download:3",  # some files downloaded
    "swapping": "swap:1",  # the verified copy renamed aside, not yet exchanged
    "recording": "audit:1",  # swapped in, the audit record not yet written
}


@pytest.mark.parametrize("point", KILL_POINTS)
def test_a_killed_restore_leaves_the_old_or_the_verified_new_and_the_next_one_finishes(
    s3, registered, written, point
):
    registry, checkpoint = registered
    backup = written["mine"]["backup"]
    cli = ["--registry", str(registry), "restore", "page_visits", "--replace"]
    before = tree_digest(checkpoint)
    killed = run_cli(*cli, env={**s3.env(), "STATEOPS_KILL_AT": KILL_POINTS[point]})
    assert killed.returncode == -9, killed.stderr
    # The target is at every moment the old checkpoint or the verified new one.
    if point == "recording":
        assert _holds(checkpoint, backup)
    else:
        assert tree_digest(checkpoint) == before
    litter = [n for n in _siblings(checkpoint) if ".restoring-" in n]
    assert litter if point == "downloading" else not litter

    resumed = run_cli(*cli, env=s3.env())
    assert resumed.returncode == 0, resumed.stderr
    result = json.loads(resumed.stdout)
    assert result["already_restored"] is (point == "recording")
    assert _holds(checkpoint, backup)
    assert [n for n in _siblings(checkpoint) if ".restoring-" in n] == []
    assert sorted(Path(p).name for p in result["removed_staging"]) == litter
    # The old checkpoint was never lost: it is one of the folders moved aside.
    aside = [checkpoint.parent / n for n in _siblings(checkpoint) if ".replaced-" in n]
    assert before in [tree_digest(p) for p in aside]
    restores = [r for r in read_audit(checkpoint) if r["operation"] == "restore"]
    assert restores[-1]["run_id"] == backup["backup_id"]
    assert restores[-1].get("found_complete", False) is (point == "recording")


def test_execute_decides_again_on_what_the_target_holds_now(s3, registered, written, tmp_path):
    """The DAG plans in one task and restores in the next: a target filled in between is
    refused by the restore itself, not overwritten."""
    registry, _ = registered
    target = tmp_path / "new-folder"
    plan = plan_restore("page_visits", s3.client(), to=target, registry=load_registry(registry))
    assert plan["target_contents"] == "none" and plan["owner"] is None
    shutil.copytree(written["other"]["checkpoint"], target)
    before = tree_digest(target)
    with pytest.raises(StateOpsError, match=r"holds query .*, but backup"):
        run_restore(plan, s3.client(), registry=load_registry(registry), **QUIET)
    assert tree_digest(target) == before
