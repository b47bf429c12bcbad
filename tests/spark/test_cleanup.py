"""Cleanup and rollback on checkpoints Spark writes here: both providers, the reference
pipelines, an aggregation and a stream-stream join, with small minDeltasForSnapshot.

A cleaned checkpoint continues exactly as a never-cleaned control copy does; a restart after
each retained batch (rolled back on a copy) reprocesses to the same state and output.
"""

from __future__ import annotations

import re
import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest

from stateops.control.lock import new_run_id
from stateops.control.target import Target
from stateops.core.checkpoint import load_checkpoint
from stateops.core.verify import verify_checkpoint
from stateops.ops.cleanup import run_cleanup
from stateops.ops.rollback import run_rollback
from tests.spark.harness import (
    ALL_CASES,
    FAILS_ONCE,
    Case,
    copy_checkpoint,
    gate_cases,
    land,
    last_committed,
    read_sink,
    read_state,
    v2_case,
)

pytestmark = pytest.mark.spark

RETAIN = 2
quiet = lambda _: None  # noqa: E731


def at(path: Path) -> Target:
    """An unregistered checkpoint: its lock beside its audit log."""
    return Target(str(path), None, None)


@dataclass
class Cleaned:
    case: Case
    root: Path
    plan: dict
    round0_state: list[list[str]]
    cleaned_state: list[list[str]]
    cleaned_out: dict[int, list[tuple]]
    control_state: list[list[str]]
    control_out: dict[int, list[tuple]]
    rolled_back: dict[int, tuple[list[list[str]], dict[int, list[tuple]]]]


V2 = v2_case()  # format v2, with the files of an attempt no commit names


# The gate: an aggregation on RocksDB; the HDFS-backed store, the other shapes and format 2's
# attempts in the whole proof.
@pytest.fixture(
    scope="module",
    params=gate_cases([*ALL_CASES, V2], {"aggregation-rocksdb"}),
)
def cleaned(request, spark, tmp_path_factory) -> Cleaned:
    case: Case = request.param
    root = tmp_path_factory.mktemp(f"cleanup-{case.name}")
    original, control = root / "ck-original", root / "ck-control"
    land(root / "landing", round_=0, files=8)
    case.run(spark, root, original, root / "out-original")
    round0_state = read_state(spark, original, case.state_reads)
    copy_checkpoint(original, control)
    shutil.copytree(root / "out-original", root / "out-control")

    plan = run_cleanup(at(original), RETAIN, run_id=new_run_id("cleanup"), log=quiet)
    assert verify_checkpoint(original)["ok"]

    # A restart after each retained batch: a copy of the cleaned checkpoint rolled back to it.
    first, last = plan["retained"]
    for batch in range(first, last + 1):
        copy = copy_checkpoint(original, root / f"ck-at-{batch}")
        run_rollback(at(copy), batch, run_id=new_run_id("rollback"), log=quiet)
        assert last_committed(copy) == batch

    land(root / "landing", round_=1, files=3)
    case.run(spark, root, original, root / "out-original")
    cleaned_state = read_state(spark, original, case.state_reads)
    case.run(spark, root, control, root / "out-control")
    # Each copy reprocesses from its batch on the same input, to the same state and output.
    # (Batch ids may differ: a no-data batch that only moved the watermark is not replanned.)
    rolled_back = {}
    for batch in range(first, last + 1):
        copy = root / f"ck-at-{batch}"
        case.run(spark, root, copy, root / f"out-at-{batch}")
        rolled_back[batch] = (
            read_state(spark, copy, case.state_reads),
            read_sink(root / f"out-at-{batch}"),
        )
    return Cleaned(
        case=case,
        root=root,
        plan=plan,
        round0_state=round0_state,
        cleaned_state=cleaned_state,
        cleaned_out=read_sink(root / "out-original"),
        control_state=read_state(spark, control, case.state_reads),
        control_out=read_sink(root / "out-control"),
        rolled_back=rolled_back,
    )


def test_cleanup_deletes_old_snapshot_groups_and_logs(cleaned: Cleaned):
    by_category = cleaned.plan["by_category"]
    assert by_category["snapshot-group"]["files"] > 0, by_category
    assert by_category["old-log"]["files"] > 0, by_category
    if cleaned.case is V2:  # the retried batch's other attempt: 2 stores, changelog (and zip)
        orphans = cleaned.plan["files"]["orphan-attempt"]
        where = {
            re.fullmatch(r"state/0/(\d)/(\d+)_[0-9a-f-]+\.(zip|changelog)", rel).group(1, 2)
            for rel in orphans
        }
        assert where == {("0", str(FAILS_ONCE + 1)), ("1", str(FAILS_ONCE + 1))}, orphans
        assert not any((cleaned.root / "ck-original" / rel).exists() for rel in orphans)
    deleted = [g for g in cleaned.plan["groups"] if g["action"] == "delete"]
    kept = [g for g in cleaned.plan["groups"] if g["action"] == "keep"]
    assert deleted and kept
    # Every retained restart still loads: its base group is kept.
    first, _ = cleaned.plan["retained"]
    assert all(g["versions"][1] < first + 1 for g in deleted)


def test_a_cleaned_checkpoint_continues_like_a_never_cleaned_copy(cleaned: Cleaned):
    assert cleaned.cleaned_state == cleaned.control_state
    assert cleaned.cleaned_out == cleaned.control_out
    assert cleaned.cleaned_state != cleaned.round0_state  # round 1 did change the state


def _rows_after(out: dict[int, list[tuple]], batch: int) -> list[tuple]:
    return sorted((row for b, rows in out.items() if b > batch for row in rows), key=repr)


def test_a_restart_after_each_retained_batch_reprocesses_identically(cleaned: Cleaned):
    first, last = cleaned.plan["retained"]
    assert sorted(cleaned.rolled_back) == list(range(first, last + 1))
    for batch, (state, out) in cleaned.rolled_back.items():
        assert state == cleaned.control_state, f"after a rollback to {batch}"
        assert _rows_after(out, batch) == _rows_after(cleaned.control_out, batch), batch


def test_a_second_cleanup_finds_nothing_to_do(cleaned: Cleaned, tmp_path):
    copy = copy_checkpoint(cleaned.root / "ck-original", tmp_path / "ck")
    run_cleanup(at(copy), RETAIN, run_id=new_run_id("cleanup"), log=quiet)
    again = run_cleanup(at(copy), RETAIN, run_id=new_run_id("cleanup"), dry_run=True, log=quiet)
    assert again["delete"]["files"] == 0, again["by_category"]
    assert load_checkpoint(copy).last_committed_batch == last_committed(
        cleaned.root / "ck-original"
    )
