"""What an operation acts on (:mod:`stateops.control.target`): the checkpoint, its registry and
owning query resolved once, and the lock and backup location they hand out."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from stateops.control.audit import audit_dir
from stateops.control.lock import (
    QueryLock,
    force_release,
    hold_query,
    read_lock,
    release_hold,
)
from stateops.control.target import SPARK_MIN_DELTAS, Target, query_target, resolve_target
from stateops.core.errors import NotACheckpointError, RegistryError, StateOpsError
from stateops.core.registry import load_registry
from tests.conftest import ROOT, TEST_STATE_STORE, write_registry

pytestmark = pytest.mark.unit


def _checkpoint(folder: Path) -> Path:
    folder.mkdir(parents=True)
    (folder / "metadata").write_text('{"id":"x"}')  # what makes a folder a checkpoint
    return folder


def test_a_querys_name_and_its_checkpoint_path_resolve_to_the_same_target(tmp_path):
    path = write_registry(tmp_path / "data")
    by_name = resolve_target("page_visits", path)
    assert by_name.name == "page_visits" and by_name.registry.path == path
    by_path = resolve_target(by_name.checkpoint, path)
    assert by_path == Target(by_name.checkpoint, by_name.registry, by_name.query)
    assert query_target(path, "page_visits") == by_name
    assert by_name.min_deltas_for_snapshot == TEST_STATE_STORE["min_deltas_for_snapshot"] != 10


def test_an_unregistered_checkpoint_has_no_query_and_sparks_default_deltas(tmp_path):
    folder = str(_checkpoint(tmp_path / "elsewhere" / "ck"))
    target = resolve_target(folder, write_registry(tmp_path / "data"))
    assert target.query is None and target.name is None and target.registry is not None
    assert target.min_deltas_for_snapshot == SPARK_MIN_DELTAS == 10
    refusal = rf"^{folder}: not a registered query's checkpoint; give QUERY$"
    with pytest.raises(StateOpsError, match=refusal):
        target.require_query("give QUERY")
    no_registry = Target(folder, None, None)
    with pytest.raises(StateOpsError, match="no readable registry; pass --registry or set"):
        no_registry.require_registry()


def test_an_unknown_query_is_refused_in_one_line(tmp_path):
    with pytest.raises(RegistryError, match=r"no query named 'nope' \(registered: "):
        query_target(write_registry(tmp_path / "data"), "nope")


def test_the_backup_location_is_the_given_one_else_the_registrys_else_refused(tmp_path):
    registry = load_registry(write_registry(tmp_path / "data"))
    target = query_target(registry, "page_visits")
    assert target.backup_location() == registry.backups.url_for("page_visits")
    assert target.backup_location().endswith("/page_visits")
    assert target.backup_location("s3://b/elsewhere") == "s3://b/elsewhere"
    unregistered = Target("/data/ck", registry, None)
    assert unregistered.backup_location("s3://b/x") == "s3://b/x"
    refusal = (
        r"^/data/ck: not a registered query's checkpoint, so there is no backup location; "
        r"give --backup-to X$"
    )
    with pytest.raises(StateOpsError, match=refusal):
        unregistered.backup_location(give="--backup-to X")


def test_the_lock_is_the_querys_else_beside_the_checkpoints_audit_log(tmp_path):
    registry = load_registry(write_registry(tmp_path / "data"))
    lock = query_target(registry, "page_visits").lock("cleanup", "cleanup-1")
    assert (lock.path, lock.query) == (registry.lock_path("page_visits"), "page_visits")
    assert (lock.operation, lock.run_id) == ("cleanup", "cleanup-1")
    folder = _checkpoint(tmp_path / "elsewhere" / "ck")
    lock = Target(str(folder), None, None).lock("rollback", "rollback-1")
    assert lock.path == audit_dir(folder) / "lifecycle.lock" and lock.query == str(folder)
    typo = tmp_path / "elsewhere" / "kc"
    with pytest.raises(NotACheckpointError):
        Target(str(typo), None, None).lock("rollback", "rollback-1")
    assert sorted(p.name for p in typo.parent.iterdir()) == ["ck"], "no .audit beside a typo"


def test_the_lease_lasts_as_the_registry_says_else_five_minutes(tmp_path):
    """A shorter lease lets a host take over sooner from a holder that died elsewhere; the
    default is Airflow's task heartbeat timeout (docs/deployment.md: how the timeouts fit)."""
    path = write_registry(tmp_path / "data")
    assert query_target(path, "page_visits").lock("run", None).ttl == 300
    path.write_text(path.read_text() + "lease_seconds: 45\n")
    lock = query_target(path, "page_visits").lock("run", "run-1")
    lock.acquire()
    try:
        info = read_lock(lock.path)
        assert lock.ttl == info.ttl_seconds == 45
        assert info.expires_at - info.acquired_at == pytest.approx(45 + 4.5, abs=1)  # a grace
    finally:
        lock.release()


def _files(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if not p.is_dir())


def test_an_s3_checkpoints_lock_leaves_no_file_once_released(tmp_path, s3, monkeypatch):
    """Issue 40: the lock of an S3 checkpoint lives in the registry's data folder, and every
    operation on it left its ``.lock.guard`` there, which `make demo` then refused."""
    for name, value in s3.env().items():
        monkeypatch.setenv(name, value)
    marker = tmp_path / "ck"
    marker.mkdir()
    (marker / "metadata").write_text('{"id":"x"}')  # what makes a prefix a checkpoint
    url = s3.upload(marker, "backups", "guards/ck")
    registry = load_registry(write_registry(tmp_path / "data"))
    data = registry.data_dir
    before = _files(data)
    with Target(url, registry, None).lock("cleanup", "cleanup-1") as lock:
        assert lock.path.is_relative_to(registry.state_dir / "locks" / "s3" / "backups")
        assert _files(data) != before
    assert _files(data) == before
    path = registry.state_dir / "locks" / "s3" / "backups" / "guards" / "ck.lock"
    hold_query(path, str(url), "migration", "mig-1")
    with QueryLock(path, str(url), "run", "mig-1"):
        pass
    assert release_hold(path, "mig-1") and _files(data) == before
    QueryLock(path, str(url), "cleanup").acquire()  # a holder gone without releasing
    force_release(path)
    assert _files(data) == before == ["registry.yaml"]
    (data / "registry.yaml").unlink()  # the registry's data folder as the demo's own
    demo = subprocess.run(
        [str(ROOT / "scripts" / "demo.sh")],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "STATEOPS_DATA_DIR": str(data), "STATEOPS_REGISTRY": "/nonexistent"},
    )
    assert "did not create" not in demo.stderr and (data / ".demo").exists(), demo.stderr
    assert demo.returncode != 0 and "/nonexistent" in demo.stdout + demo.stderr, "stopped next"
