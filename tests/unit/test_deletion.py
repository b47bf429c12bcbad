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
        "commits/2",
        "offsets/9",
        "offsets/10",
    ]
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
    # An S3 checkpoint cannot be replaced in one step: the undo restores beside it.
    on_s3 = format_plan({**_rollback_plan(), "checkpoint": "s3://ck/page_visits"}, dry_run=True)
    assert on_s3.splitlines()[-1] == (
        "  undo:         stateops restore s3://b/page_visits/BACKUP_ID --to "
        "s3://ck/page_visits-restored, then point the query's checkpoint there (the backup this "
        "run prints)"
    )
    real = format_plan(_rollback_plan(), dry_run=False)
    assert real.splitlines()[0] == "PLAN: rollback of /data/ck" and "deletes 3 files" in real
    no_backup = format_plan({**_rollback_plan(), "backup_to": None}, dry_run=True)
    assert "WARNING: no backup is taken first" in no_backup
    assert no_backup.splitlines()[-3:] == [
        "  irreversible: deleting 3 files, 3.0 KB (no backup)",
        "  backup:       none",
        "  undo:         none",
    ]


def test_a_cleanup_plan_names_the_querys_latest_backup_and_the_restore_that_undoes_it():
    """Issue 40: a registered query's cleanup said 'backup: none' and an undo with
    BUCKET/PREFIX placeholders although its backups.url held a fresh backup."""
    from stateops.core.errors import StateOpsError
    from stateops.ops.cleanup import latest_backup

    url = "s3://stateops-backups/page_visits"
    plan = {
        "operation": "cleanup",
        "checkpoint": "/data/ck",
        "last_committed_batch": 12,
        "retain_batches": 2,
        "retained": [11, 12],
        "groups": [],
        "delete": {"files": 2, "bytes": 2048},
        "keep": {"files": 10, "bytes": 10240, "needed_by_restarts": 6},
        "by_category": {"old-log": {"files": 2, "bytes": 2048}},
        "files": {"old-log": ["offsets/1", "commits/1"]},
    }
    latest = {
        "backup_id": "b-000012-20261126T090000Z",
        "batch_id": 12,
        "created_at": "2026-11-26T09:00:00+00:00",
    }
    tails = {
        None: [
            "  backup:       none (take one first to keep older restarts: stateops backup "
            "/data/ck)",
            "  undo:         none; deleted files come back only from an earlier backup "
            "(stateops restore s3://BUCKET/PREFIX/BACKUP_ID --to /data/ck --replace)",
        ],
        "latest": [
            "  backup:       none taken by the cleanup; the latest is "
            f"b-000012-20261126T090000Z (batch 12, 2026-11-26T09:00:00+00:00) under {url}",
            "  undo:         none; deleted files come back only from an earlier backup "
            f"(stateops restore {url}/b-000012-20261126T090000Z --to /data/ck --replace)",
        ],
        "none yet": [
            f"  backup:       none yet under {url} (take one first to keep older restarts: "
            "stateops backup /data/ck)",
            f"  undo:         none: there is no backup under {url} to bring deleted files "
            "back from",
        ],
        "unlisted": [
            f"  backup:       none taken by the cleanup; the backups under {url} could not "
            "be listed (S3 list: the endpoint does not answer)",
            "  undo:         none; deleted files come back only from an earlier backup "
            f"(stateops backups list {url}, then stateops restore {url}/BACKUP_ID --to "
            "/data/ck --replace)",
        ],
    }
    backups = {
        None: None,
        "latest": {"url": url, "latest": latest, "error": None},
        "none yet": {"url": url, "latest": None, "error": None},
        "unlisted": {"url": url, "latest": None, "error": "S3 list: the endpoint does not answer"},
    }
    for case, tail in tails.items():
        text = format_plan({**plan, "backups": backups[case]}, dry_run=True)
        assert text.splitlines()[-2:] == tail, (case, text)
        assert "BUCKET/PREFIX" not in text or case is None

    def down():
        raise StateOpsError("S3 list: the endpoint does not answer")

    assert latest_backup(url, down) == backups["unlisted"], "said in the plan, not raised"
