"""Cleanup's refusals made before any checkpoint is read (its plan on Spark-written
checkpoints: tests/spark/test_cleanup.py; the deletion engine: test_deletion.py)."""

from __future__ import annotations

import pytest

from stateops.control.lock import QueryLock
from stateops.core.errors import CheckpointError, StateOpsError
from stateops.ops.cleanup import plan_cleanup, run_cleanup

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("retain", [0, -1])
def test_retaining_no_batch_is_refused_before_the_path_is_read(tmp_path, retain):
    with pytest.raises(
        StateOpsError, match=rf"^--retain-batches must be at least 1, got {retain}$"
    ):
        plan_cleanup(tmp_path / "nowhere", retain)


def test_a_folder_that_is_no_checkpoint_is_refused_and_takes_no_lock(tmp_path):
    folder = tmp_path / "not-a-checkpoint"
    folder.mkdir()
    (folder / "notes.txt").write_text("x")
    lock = QueryLock(tmp_path / "locks" / "q.lock", "q", "cleanup")
    with pytest.raises(CheckpointError):
        run_cleanup(folder, 2, lock)
    assert sorted(p.name for p in folder.iterdir()) == ["notes.txt"]
    assert not lock.path.exists()
