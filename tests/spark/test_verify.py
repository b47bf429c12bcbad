"""`stateops verify` on checkpoints Spark wrote here, then damaged by the test."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from stateops.core.checkpoint import load_checkpoint
from stateops.core.formats import crc_sidecar
from tests.conftest import run_cli, tree_digest
from tests.spark.harness import ALL_CASES, aggregation_case, land

pytestmark = pytest.mark.spark

PAGE_VISITS = next(c for c in ALL_CASES if c.name == "page_visits-rocksdb")


@pytest.fixture(scope="module")
def written(spark, tmp_path_factory) -> dict[str, Path]:
    """Sound checkpoints: HDFS deltas, RocksDB zips + SSTs, and transformWithState."""
    root = tmp_path_factory.mktemp("verify")
    land(root / "landing", round_=0, files=5)
    out = {}
    for case in (aggregation_case("hdfs"), aggregation_case("rocksdb"), PAGE_VISITS):
        out[case.name] = root / case.name
        case.run(spark, root, out[case.name], root / f"out-{case.name}")
    return out


def _verify(path: Path) -> tuple[int, dict]:
    proc = run_cli("verify", str(path), "--json")
    assert proc.returncode in (0, 1), proc.stderr
    return proc.returncode, json.loads(proc.stdout)


def _damaged(written: dict[str, Path], name: str, tmp_path: Path) -> Path:
    copy = tmp_path / name
    shutil.copytree(written[name], copy)
    return copy


@pytest.mark.parametrize("name", ["aggregation-hdfs", "aggregation-rocksdb", "page_visits-rocksdb"])
def test_sound_checkpoints_have_no_findings(written, name):
    rc, result = _verify(written[name])
    assert (rc, result["ok"], result["findings"]) == (0, True, [])
    table = run_cli("verify", str(written[name])).stdout
    assert table.startswith("OK: ")


def _errors(result: dict) -> list[tuple[str, str]]:
    return [(f["path"], f["problem"]) for f in result["findings"] if f["severity"] == "error"]


def _needed(path: Path, suffix: str | tuple[str, ...]) -> str:
    cp = load_checkpoint(path)
    return next(f for f in cp.restart_files(cp.last_committed_batch) if f.endswith(suffix))


def test_a_deleted_sst_that_a_needed_zip_refers_to(written, tmp_path):
    ckpt = _damaged(written, "aggregation-rocksdb", tmp_path)
    sst = _needed(ckpt, ".sst")
    (ckpt / sst).unlink()
    before = tree_digest(ckpt)
    rc, result = _verify(ckpt)
    assert rc == 1 and not result["ok"]
    assert (
        sst,
        f"missing: a restart after batch {result['last_committed_batch']} needs it",
    ) in _errors(result)
    assert tree_digest(ckpt) == before


def test_a_truncated_delta(written, tmp_path):
    ckpt = _damaged(written, "aggregation-hdfs", tmp_path)
    delta = _needed(ckpt, ".delta")
    data = (ckpt / delta).read_bytes()
    (ckpt / delta).write_bytes(data[: len(data) // 2])
    rc, result = _verify(ckpt)
    assert rc == 1
    # A delta under 512 bytes is one checksum chunk: a cut shows as a mismatch in it.
    assert [p for p, problem in _errors(result) if "checksum mismatch" in problem] == [delta]


def test_a_flipped_byte_is_a_crc_mismatch(written, tmp_path):
    ckpt = _damaged(written, "page_visits-rocksdb", tmp_path)
    changelog = _needed(ckpt, (".changelog", ".sst"))
    data = bytearray((ckpt / changelog).read_bytes())
    data[len(data) // 2] ^= 0x01
    (ckpt / changelog).write_bytes(bytes(data))
    rc, result = _verify(ckpt)
    assert rc == 1
    errors = _errors(result)
    assert len(errors) == 1 and errors[0][0] == changelog
    assert errors[0][1].startswith("checksum mismatch in bytes ")


def test_missing_metadata(written, tmp_path):
    ckpt = _damaged(written, "aggregation-hdfs", tmp_path)
    (ckpt / "metadata").unlink()
    rc, result = _verify(ckpt)
    assert rc == 1
    assert len(_errors(result)) == 1 and "metadata: missing" in _errors(result)[0][1]


def test_a_gap_in_commits(written, tmp_path):
    ckpt = _damaged(written, "aggregation-rocksdb", tmp_path)
    (ckpt / "commits" / "2").unlink()
    (ckpt / "commits" / ".2.crc").unlink()
    rc, result = _verify(ckpt)
    assert rc == 1
    assert _errors(result) == [("commits/2", "missing: a gap in the commits log")]


def test_a_state_version_left_by_a_crashed_batch(written, tmp_path):
    ckpt = _damaged(written, "aggregation-hdfs", tmp_path)
    cp = load_checkpoint(ckpt)
    store = cp.operators[0].stores[0]
    last_version = max(store.deltas)
    stray = f"{store.rel_dir}/{last_version + 2}.delta"
    shutil.copy(ckpt / store.deltas[last_version], ckpt / stray)
    rc, result = _verify(ckpt)
    assert rc == 1
    assert [
        p for p, problem in _errors(result) if "beyond the last committed batch" in problem
    ] == [stray]


def test_a_write_interrupted_by_a_stop_is_a_warning_not_a_fault(written, tmp_path):
    """A stop or a crash in the middle of Spark's atomic write leaves its temporary file (and
    a sidecar it never finished): Spark ignores both, so the checkpoint is sound."""
    ckpt = _damaged(written, "aggregation-hdfs", tmp_path)
    cp = load_checkpoint(ckpt)
    temp = f"offsets/.{cp.last_committed_batch + 1}.0c4d9a43-6f0e-4b8e-9d6c-3c2f1b7a5e10.tmp"
    (ckpt / temp).write_bytes((ckpt / "offsets" / str(cp.last_committed_batch)).read_bytes()[:9])
    (ckpt / crc_sidecar(temp)).write_bytes(b"")
    rc, result = _verify(ckpt)
    assert (rc, result["ok"]) == (0, True), result
    assert [(f["severity"], f["path"]) for f in result["findings"]] == [("warning", temp)]


def test_not_a_checkpoint_is_bad_input(tmp_path):
    proc = run_cli("verify", str(tmp_path / "absent"))
    assert proc.returncode == 2 and proc.stderr.startswith("error: ")
