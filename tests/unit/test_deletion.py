"""The deletion engine's pure parts: the order within a category, the plan's digest, and the
plan as a person reads it (no checkpoint needed)."""

from __future__ import annotations

import copy

import pytest

from stateops.ops.deletion import _in_order, format_plan, plan_digest

pytestmark = pytest.mark.unit


def _rollback_plan() -> dict:
    return {
        "operation": "rollback",
        "checkpoint": "/data/ck",
        "last_committed_batch": 7,
        "to_batch": 5,
        "backup_to": "s3://b/page_visits",
        "sink": None,
        "delete": {"files": 3, "bytes": 3072},
        "keep": {"files": 10, "bytes": 10240, "needed_by_restarts": 6},
        "by_category": {"after-rollback-point": {"files": 3, "bytes": 3072}},
        "files": {"after-rollback-point": ["commits/7", "offsets/6", "commits/6"]},
    }


def test_old_log_entries_go_oldest_first_and_a_rollback_newest_commit_first():
    assert _in_order("old-log", ["offsets/10", "offsets/9", "commits/2"]) == [
        "commits/2", "offsets/9", "offsets/10",
    ]  # fmt: skip
    # Commits before offsets before state, each newest first: the last committed batch only
    # ever moves down while a rollback deletes.
    assert _in_order(
        "after-rollback-point", ["offsets/6", "state/0/0/8.delta", "commits/6", "commits/7"]
    ) == ["commits/7", "commits/6", "offsets/6", "state/0/0/8.delta"]
    assert _in_order("snapshot-group", ["b", "a"]) == ["a", "b"], "by name, not by listing order"


def test_equal_plans_have_equal_digests_and_another_file_changes_it():
    plan = _rollback_plan()
    assert plan_digest(plan) == plan_digest(copy.deepcopy(plan))
    moved_on = copy.deepcopy(plan)
    moved_on["files"]["after-rollback-point"].append("commits/8")
    assert plan_digest(moved_on) != plan_digest(plan)


def test_the_plan_reads_as_what_goes_and_what_stays():
    dry = format_plan(_rollback_plan(), dry_run=True)
    assert dry.splitlines()[0] == "DRY RUN: nothing changed: rollback of /data/ck"
    assert "batch 5 becomes the last committed batch (now 7)" in dry
    assert "delete 3 files, 3.0 KB: after the rollback point" in dry
    assert "would delete 3 files, 3.0 KB; keeps 10 files, 10.0 KB" in dry
    # It ends in what cannot be undone, where the backup goes and the command that undoes it.
    assert dry.splitlines()[-3:] == [
        "  irreversible: nothing: the backup holds the checkpoint as it is now",
        "  backup:       to s3://b/page_visits, before anything changes",
        "  undo:         stateops restore s3://b/page_visits/BACKUP_ID --to /data/ck --replace "
        "(the backup this run prints)",
    ]
    real = format_plan(_rollback_plan(), dry_run=False)
    assert real.splitlines()[0] == "PLAN: rollback of /data/ck" and "deletes 3 files" in real
    no_backup = format_plan({**_rollback_plan(), "backup_to": None}, dry_run=True)
    assert "WARNING: no backup is taken first" in no_backup
    assert no_backup.splitlines()[-3:] == [
        "  irreversible: deleting 3 files, 3.0 KB (no backup)",
        "  backup:       none",
        "  undo:         none",
    ]
