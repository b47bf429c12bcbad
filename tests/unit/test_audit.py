from __future__ import annotations

import pytest

from stateops.control.audit import append_audit, audit_dir, read_audit

pytestmark = pytest.mark.unit


def test_records_append_beside_the_checkpoint(tmp_path):
    ckpt = tmp_path / "checkpoints" / "q"
    ckpt.mkdir(parents=True)
    append_audit(ckpt, "run", run_id="r1", result="succeeded", batch_before=None, batch_after=3)
    append_audit(
        ckpt, "cleanup", run_id="r2", result="failed", batch_before=3, batch_after=3, why="x"
    )
    assert audit_dir(ckpt) == tmp_path / "checkpoints" / "q.audit"
    assert not any(p.name.startswith("audit") for p in ckpt.iterdir())
    records = read_audit(ckpt)
    assert [(r["operation"], r["run_id"], r["batch_after"]) for r in records] == [
        ("run", "r1", 3),
        ("cleanup", "r2", 3),
    ]
    assert records[1]["why"] == "x" and records[1]["result"] == "failed"


def test_a_torn_last_line_is_skipped(tmp_path):
    ckpt = tmp_path / "q"
    append_audit(ckpt, "run", run_id="r1", result="succeeded")
    with open(audit_dir(ckpt) / "audit.jsonl", "a") as f:
        f.write('{"operation": "ru')
    assert [r["run_id"] for r in read_audit(ckpt)] == ["r1"]
