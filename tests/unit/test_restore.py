"""The restore's pure parts: refusals made before S3 is asked, the plan as text, the swap."""

from __future__ import annotations

import pytest

from stateops.core.errors import StateOpsError
from stateops.core.registry import load_registry
from stateops.ops import restore
from stateops.ops.restore import format_restore_plan, plan_restore
from tests.conftest import write_registry

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("source", "backup", "message"),
    [
        ("s3://backups/q", None, "no backup id at the end"),
        ("s3://backups/q/b-000001-x", "latest", "not both"),
        ("page_visits", None, "there is no registry to look a query up in"),
        ("s3://backups/q/latest", None, "say where to restore it: --to PATH"),
    ],
)
def test_what_names_no_backup_or_no_target_is_refused_before_s3(source, backup, message):
    with pytest.raises(StateOpsError, match=message):
        plan_restore(source, None, backup=backup)  # no client: S3 is never asked


def test_a_target_that_is_a_file_or_a_link_is_refused_before_s3(tmp_path):
    (tmp_path / "file").write_text("x")
    (tmp_path / "link").symlink_to(tmp_path / "elsewhere")
    registry = load_registry(write_registry(tmp_path / "data"))
    for target, message in (("file", "not a folder"), ("link", "a symbolic link")):
        with pytest.raises(StateOpsError, match=message):
            plan_restore("page_visits", None, to=tmp_path / target, registry=registry)


def _plan(**changes) -> dict:
    plan = {
        "backup": {
            "backup_id": "b-000003-x",
            "query_id": "q-new",
            "batch_id": 3,
            "created_at": "2026-01-01T00:00:00Z",
            "source": "/c",
            "files": 9,
            "bytes": 2048,
        },
        "location": "s3://backups/page_visits",
        "target": "/data/ckpt",
        "owner": "page_visits",
        "already_restored": False,
        "target_contents": "checkpoint",
        "target_query_id": "q-old",
        "target_batch": 7,
        "replace": True,
        "other_query": False,
        "lock": {"query": "page_visits", "held_by": None},
        "stale_staging": [],
    }
    return plan | changes


def test_the_plan_marks_another_querys_state_in_red_only_when_asked():
    plan = _plan(other_query=True)
    mark = "!! ANOTHER QUERY: the state of query q-new replaces that of query q-old"
    plain, colored = format_restore_plan(plan), format_restore_plan(plan, color=True)
    assert mark in plain and "\x1b[" not in plain
    assert f"\x1b[31m{mark}" in colored
    assert "!! ANOTHER QUERY" not in format_restore_plan(_plan())


def test_the_plan_names_the_locks_holder_and_the_folders_it_will_remove():
    text = format_restore_plan(
        _plan(
            lock={"query": "page_visits", "held_by": "run (run r-1, me@host:42)"},
            stale_staging=["/data/ckpt.restoring-1"],
        )
    )
    assert "page_visits is locked by run (run r-1, me@host:42)" in text
    assert "to remove: /data/ckpt.restoring-1" in text
    assert "holds query q-old at batch 7: moved aside" in text


@pytest.mark.parametrize("atomic", [True, False], ids=["exchange", "two renames"])
def test_the_swap_puts_the_new_at_the_target_and_the_old_aside(tmp_path, monkeypatch, atomic):
    if not atomic:
        monkeypatch.setattr(restore, "_exchange", lambda a, b: False)
    staging, target, aside = tmp_path / "t.restoring-1", tmp_path / "t", tmp_path / "t.replaced-1"
    for folder, content in ((staging, "new"), (target, "old")):
        folder.mkdir()
        (folder / "metadata").write_text(content)
    restore._swap_in(staging, target, aside)
    assert (target / "metadata").read_text() == "new"
    assert (aside / "metadata").read_text() == "old"
    assert not staging.exists()


def test_the_plan_says_dry_run_or_plan_and_how_to_undo():
    dry = format_restore_plan(_plan()).splitlines()
    backup_id, target = _plan()["backup"]["backup_id"], _plan()["target"]
    assert dry[0] == f"DRY RUN: nothing changed: restore of backup {backup_id} into {target}"
    assert dry[-3:] == [
        "  irreversible: nothing: the target's files are moved aside, never deleted",
        "  backup:       none needed: nothing is deleted",
        f"  undo:         remove {target}, then move {target}.replaced-<time> (the restore "
        f"prints it) back to {target}",
    ]
    assert format_restore_plan(_plan(), dry_run=False).startswith("PLAN: restore of backup ")
    fresh = format_restore_plan(_plan(target_contents="none")).splitlines()
    assert fresh[-1] == f"  undo:         remove {target}"
