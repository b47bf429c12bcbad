from __future__ import annotations

import fcntl
import os
import signal
import subprocess
import sys
import tempfile

import pytest

from stateops.core.staging import Staging, stale_staging

pytestmark = pytest.mark.unit

STAMP = "20260101T000000000000Z"

# A run that enters its staging folder and is then killed (SIGKILL: no cleanup of its own).
KILLED_RUN = """
import os, signal, sys
from stateops.core.staging import Staging
Staging(sys.argv[1], "restoring").__enter__()
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_the_folder_of_a_killed_run_is_removed_by_the_next_run(tmp_path):
    target = tmp_path / "ckpt"
    killed = subprocess.run([sys.executable, "-c", KILLED_RUN, str(target)])
    assert killed.returncode == -signal.SIGKILL
    [left] = [p for p in tmp_path.iterdir() if p.name.startswith("ckpt.restoring-")]
    (left / "half-downloaded").write_text("x")
    assert stale_staging(target, "restoring") == [left]

    with Staging(target, "restoring") as staging:
        assert staging.removed == [str(left)] and not left.exists()
        assert staging.path.is_dir() and staging.path.name.startswith("ckpt.restoring-")
        # Its own folder, locked while it lives, is not stale to anyone.
        assert stale_staging(target, "restoring") == []


def test_a_killed_run_into_s3_leaves_its_folder_where_the_next_run_finds_it(tmp_path, monkeypatch):
    """An S3 target is built in a local folder, then published: named after the target's key
    under the temp folder, a killed run's folder is removed by the next run as locally."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    target = "s3://checkpoints/queries/ckpt"
    killed = subprocess.run(
        [sys.executable, "-c", KILLED_RUN, target], env={**os.environ, "TMPDIR": str(tmp_path)}
    )
    assert killed.returncode == -signal.SIGKILL
    place = tmp_path / "stateops-staging" / "checkpoints" / "queries"
    [left] = [p for p in place.iterdir() if p.name.startswith("ckpt.restoring-")]
    assert stale_staging(target, "restoring") == [left]

    with Staging(target, "restoring") as staging:
        assert staging.removed == [str(left)] and not left.exists()
        assert staging.path.parent == place
    assert not staging.path.exists(), "an S3 target's folder goes at the end, published or not"


def test_the_folder_of_a_live_run_and_anything_not_so_named_are_left_alone(tmp_path):
    target = tmp_path / "ckpt"
    live = tmp_path / f"ckpt.restoring-{STAMP}"
    live.mkdir()
    fd = os.open(live, os.O_RDONLY | os.O_DIRECTORY)
    fcntl.flock(fd, fcntl.LOCK_EX)  # another run, still going
    others = [
        tmp_path / "ckpt.restoring-not-a-stamp",
        tmp_path / f"other.restoring-{STAMP}",  # another target's
        tmp_path / f"ckpt.replaced-{STAMP}",  # an old checkpoint moved aside: never touched
        tmp_path / "ckpt",
    ]
    for folder in others:
        folder.mkdir()
    (tmp_path / f"ckpt.restoring-{STAMP[:-8]}Z").write_text("a file, not a folder")
    (tmp_path / f"ckpt.restoring-{STAMP[:-1]}1Z").symlink_to(tmp_path / "ckpt")
    try:
        with Staging(target, "restoring") as staging:
            assert staging.removed == []
    finally:
        os.close(fd)
    assert live.is_dir() and all(folder.is_dir() for folder in others)
    assert (tmp_path / "ckpt").is_dir()


def test_an_error_removes_the_folder_and_success_leaves_it_to_the_caller(tmp_path):
    target = tmp_path / "sub" / "ckpt"
    with pytest.raises(RuntimeError), Staging(target, "restoring") as failed:
        (failed.path / "f").write_text("x")
        raise RuntimeError("download failed")
    assert not failed.path.exists()
    with Staging(target, "restoring") as staging:
        (staging.path / "f").write_text("x")
    os.rename(staging.path, target)
    assert (target / "f").read_text() == "x"
    assert sorted(p.name for p in target.parent.iterdir()) == ["ckpt"]
