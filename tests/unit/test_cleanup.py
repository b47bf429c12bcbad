"""Cleanup's refusals made before any checkpoint is read (its plan on Spark-written
checkpoints: tests/spark/test_cleanup.py; the deletion engine: test_deletion.py)."""

from __future__ import annotations

import pytest

from stateops.control.target import Target, query_target
from stateops.core.errors import CheckpointError, StateOpsError
from stateops.ops.cleanup import plan_cleanup, run_cleanup
from stateops.ops.deletion import format_plan
from tests.conftest import write_registry

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("retain", [0, -1])
def test_retaining_no_batch_is_refused_before_the_path_is_read(tmp_path, retain):
    with pytest.raises(
        StateOpsError, match=rf"^--retain-batches must be at least 1, got {retain}$"
    ):
        plan_cleanup(Target(str(tmp_path / "nowhere"), None, None), retain)


def test_a_folder_that_is_no_checkpoint_is_refused_and_takes_no_lock(tmp_path):
    folder = tmp_path / "not-a-checkpoint"
    folder.mkdir()
    (folder / "notes.txt").write_text("x")
    registry = write_registry(tmp_path / "data", page_visits={"checkpoint": str(folder)})
    target = query_target(registry, "page_visits")
    lock = target.lock("cleanup", "cleanup-1")
    with pytest.raises(CheckpointError):
        run_cleanup(target, 2, run_id="cleanup-1")
    assert sorted(p.name for p in folder.iterdir()) == ["notes.txt"]
    assert not lock.path.exists()


def test_the_plan_counts_snapshot_groups_as_inspect_does_one_group_across_partitions():
    # Two partitions, each with its snapshots at versions 4 and 8 (group ids 2 and 4 with
    # minDeltasForSnapshot 2), and partition 1's second snapshot one version later (9, still
    # group 4): inspect shows groups 2 and 4, of 2 stores each.
    groups = [
        {
            "operator": 0,
            "partition": p,
            "store": "default",
            "base": base,
            "group_id": base // 2,
            "versions": [base, base + 3],
            "files": 4,
            "bytes": 1024,
            "action": "delete" if base < 8 else "keep",
        }
        for p, bases in ((0, (4, 8)), (1, (4, 9)))
        for base in bases
    ]
    plan = {
        "operation": "cleanup",
        "checkpoint": "/data/ck",
        "retained": [7, 9],
        "retain_batches": 3,
        "groups": groups,
        "by_category": {},
        "delete": {"files": 8, "bytes": 2048},
        "keep": {"files": 8, "bytes": 2048, "needed_by_restarts": 8},
    }
    lines = format_plan(plan, dry_run=True).splitlines()
    assert (
        "  operator 0 store default: delete 1 snapshot groups across 2 partitions "
        "(versions 4..7, 8 files, 2.0 KB): no retained batch needs them" in lines
    ), lines
    assert (
        "  operator 0 store default: keep 1 snapshot groups across 2 partitions "
        "(versions 8..12, 8 files, 2.0 KB): a retained restart loads them" in lines
    ), lines
