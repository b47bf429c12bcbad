"""Rollback of the registered reference pipelines (runs in the shared session, their sinks), its
refusals, and cleanup/rollback killed with SIGKILL at many points then finished by a rerun."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml

from stateops.control.target import Target
from stateops.core.checkpoint import load_checkpoint
from stateops.core.errors import StateOpsError
from stateops.core.files import copy_restart_set, relocate_checkpoint
from stateops.core.registry import load_registry
from stateops.ops.pending import refuse_pending_rollback
from tests.conftest import (
    ROOT,
    run_cli,
    tree_digest,
    whole_after,
    write_registry,
)
from tests.spark.harness import (
    V2_STATE_STORE,
    land,
    read_sink,
    read_state,
    run_in_session,
    state_and_output,
    v2_case,
)

pytestmark = pytest.mark.spark

READS = {
    "user_sessions": [{"stateVarName": "events"}, {"readRegisteredTimers": "true"}],
    "page_visits": [{"stateVarName": "pages"}, {"stateVarName": "count"}],
}


def _rows(sink: Path, after: int = -1) -> list[tuple]:
    out = read_sink(sink)
    return sorted((r for b, rows in out.items() if b > after for r in rows), key=repr)


def _processor(timeout: int) -> dict:
    raw = yaml.safe_load((ROOT / "registry.yaml").read_text())
    processor = raw["queries"]["user_sessions"]["processor"]
    return {**processor, "options": {"session_timeout_seconds": timeout}}


def test_rollback_then_reprocess_with_unchanged_logic_equals_an_uninterrupted_run(
    spark, s3, tmp_path
):
    registry = write_registry(tmp_path)
    query = load_registry(registry).query("page_visits")
    ckpt, sink = Path(query.checkpoint), Path(query.sink.path)
    land(tmp_path / "landing", round_=0, files=6)
    run_in_session(spark, registry, "page_visits")
    uninterrupted = (read_state(spark, ckpt, READS["page_visits"]), _rows(sink))
    n = load_checkpoint(ckpt).last_committed_batch - 3

    url = "s3://backups/rollback"
    proc = run_cli(
        "--registry",
        str(registry),
        "rollback",
        "page_visits",
        "--to-batch",
        str(n),
        "--backup-to",
        url,
        env=s3.env(),
    )
    assert proc.returncode == 0, proc.stderr
    assert load_checkpoint(ckpt).last_committed_batch == n
    assert f"batch {n} is the last committed batch" in proc.stdout
    # The backup came first, of the batch before the rollback; later output moved aside.
    listed = run_cli("backups", "list", url, env=s3.env(), check=True).stdout
    assert f"batch {n + 3:>6}" in listed
    moved = list((sink / "_rolled_back").glob("*/batch_id=*"))
    assert sorted(int(p.name.split("=")[1]) for p in moved) == [n + 1, n + 2, n + 3]

    run_in_session(spark, registry, "page_visits")
    assert (read_state(spark, ckpt, READS["page_visits"]), _rows(sink)) == uninterrupted

    # A cleanup plan by the query's name takes the registry's cleanup.retain_batches.
    before = tree_digest(ckpt)
    plan = json.loads(
        run_cli(
            "cleanup", "page_visits", "--dry-run", "--json", "--registry", str(registry), check=True
        ).stdout
    )
    assert plan["retain_batches"] == load_registry(registry).cleanup.retain_batches == 10
    assert tree_digest(ckpt) == before


@pytest.mark.whole
def test_rollback_with_changed_logic_keeps_nothing_of_the_invalidated_run(spark, tmp_path):
    registry = write_registry(tmp_path)  # sessions time out after 30 minutes
    query = load_registry(registry).query("user_sessions")
    ckpt, sink = Path(query.checkpoint), Path(query.sink.path)
    land(tmp_path / "landing", round_=0, files=8)
    run_in_session(spark, registry, "user_sessions")
    old_logic_state = read_state(spark, ckpt, READS["user_sessions"])
    n = load_checkpoint(ckpt).last_committed_batch - 5
    # What the new logic gives from batch n on: a fresh copy of batch n's restart set.
    reference = tmp_path / "reference"
    copy_restart_set(load_checkpoint(ckpt), n, reference / "ck")
    ref_registry = write_registry(
        reference,
        user_sessions={
            "processor": _processor(300),
            "checkpoint": str(reference / "ck"),
            "source": {
                **yaml.safe_load(registry.read_text())["queries"]["user_sessions"]["source"],
                "path": str(tmp_path / "landing/user_sessions"),
            },
        },
    )

    plan = json.loads(
        run_cli(
            "--registry",
            str(registry),
            "rollback",
            "user_sessions",
            "--to-batch",
            str(n),
            "--no-backup",
            "--dry-run",
            "--json",
            check=True,
        ).stdout
    )
    stale = [rel for rel in plan["files"]["after-rollback-point"] if rel.endswith(".zip")]
    assert stale, "the invalidated run left no snapshot group: the stale case is not exercised"
    proc = run_cli(
        "--registry",
        str(registry),
        "rollback",
        "user_sessions",
        "--to-batch",
        str(n),
        "--no-backup",
    )
    assert proc.returncode == 0, proc.stderr
    assert "WARNING: no backup is taken first" in proc.stdout

    write_registry(tmp_path, user_sessions={"processor": _processor(300)})  # the new logic
    for round_ in (None, 1):  # reprocess, then later input that loads the newest snapshot
        if round_:
            land(tmp_path / "landing", round_=round_, files=2)
        run_in_session(spark, registry, "user_sessions")
        run_in_session(spark, ref_registry, "user_sessions")
        state = read_state(spark, ckpt, READS["user_sessions"])
        assert state == read_state(spark, reference / "ck", READS["user_sessions"])
        ref_sink = Path(load_registry(ref_registry).query("user_sessions").sink.path)
        assert _rows(sink, after=n) == _rows(ref_sink)
    assert state != old_logic_state


@pytest.fixture(
    scope="module",
    params=whole_after(1, [1, 2], ids=["format-v1", "format-v2"]),  # v2: the whole proof
)
def template(request, spark, tmp_path_factory) -> Path:
    """A page_visits checkpoint after 8 batches, and its sink, to copy from: in checkpoint
    format v1, or v2 with the files of an attempt no commit names (harness.v2_case)."""
    root = tmp_path_factory.mktemp(f"rollback-template-v{request.param}")
    land(root / "landing", round_=0, files=8)
    if request.param == 1:
        run_in_session(spark, write_registry(root), "page_visits")
    else:
        v2_case().run(spark, root, root / "checkpoints/page_visits", root / "output/page_visits")
    return root


def _state_store(template: Path) -> dict:
    return {"state_store": V2_STATE_STORE} if "-v2" in template.name else {}


def _fresh(template: Path, work: Path) -> tuple[Path, Path]:
    """The template's checkpoint and sink at ``work`` (always the same place: TWS metadata
    holds absolute paths, so identical runs give identical bytes)."""
    shutil.rmtree(work, ignore_errors=True)
    shutil.rmtree(work.with_name(work.name + ".audit"), ignore_errors=True)
    shutil.copytree(template / "checkpoints/page_visits", work)
    relocate_checkpoint(work)
    sink = work.with_name("sink")
    shutil.rmtree(sink, ignore_errors=True)
    shutil.copytree(template / "output/page_visits", sink)
    return work, sink


def _state(work: Path) -> dict[str, str]:
    return {
        **tree_digest(work),
        **{
            f"sink/{k}": v
            for k, v in tree_digest(work.with_name("sink")).items()
            if "_rolled_back" not in k
        },
    }


@pytest.mark.parametrize("command", ["cleanup", "rollback"])
def test_refusals_change_nothing(template, tmp_path, command):
    """Older than the oldest retained batch, beyond the last one, a held lock, a gap."""
    extra = ["--no-backup"] if command == "rollback" else []
    work, _ = _fresh(template, tmp_path / "ck")
    run_cli("cleanup", str(work), "--retain-batches", "3", check=True)  # keeps 5..7
    if command == "rollback":
        cases = [
            (["--to-batch", "99"], "batch 99 is not a committed batch"),
            (["--to-batch", "0"], "older than the oldest retained batch (5)"),
            (["--to-batch", "-1"], "batch -1: batch ids start at 0"),
        ]
    else:  # fewer batches than asked for are left: they are all retained, nothing goes
        proc = run_cli("cleanup", str(work), "--retain-batches", "5", check=True)
        assert "(only 3 committed batches are left)" in proc.stdout
        cases = []
    for argv, needle in cases:
        before = _state(work)
        proc = run_cli(command, str(work), *argv, *extra)
        assert proc.returncode == 2 and needle in proc.stderr, proc.stderr
        assert proc.stderr.count("\n") == 1 and _state(work) == before

    good = ["--to-batch", "6"] if command == "rollback" else ["--retain-batches", "2"]
    lock = Target(str(work), None, None).lock("backfill", "backfill-1")  # another holds it
    with lock:
        before = _state(work)
        proc = run_cli(command, str(work), *good, *extra)
        assert proc.returncode == 2 and "locked by backfill" in proc.stderr, proc.stderr
        assert _state(work) == before
    (work / "commits/6").unlink()  # a gap
    before = _state(work)
    proc = run_cli(command, str(work), *good, *extra)
    assert proc.returncode == 2 and "commits/ has a gap (batch 6 is missing)" in proc.stderr
    assert _state(work) == before


@pytest.mark.whole
@pytest.mark.parametrize("command", ["cleanup", "rollback"])
def test_killed_at_any_point_a_second_run_finishes_the_job(
    template, restarted, tmp_path, spark, command
):
    work = tmp_path / "ck"
    argv = (
        ["cleanup", str(work), "--retain-batches", "2"]
        if command == "cleanup"
        else [
            "rollback",
            str(work),
            "--to-batch",
            "3",
            "--no-backup",
            "--sink",
            str(tmp_path / "sink"),
        ]
    )
    _fresh(template, work)
    plan = json.loads(run_cli(*argv, "--dry-run", "--json", check=True).stdout)
    deletes = plan["delete"]["files"]
    steps = deletes + (len(plan["sink"]["folders"]) if plan.get("sink") else 0)
    assert steps >= 20, plan["by_category"]
    run_cli(*argv, check=True)
    expected = _state(work)

    points = sorted({1 + i * (steps - 1) // 11 for i in range(12)})
    assert len(points) >= 10
    for point in points:
        _fresh(template, work)
        # Killed (stateops.core.faults) before deletion ``point``, or before moving sink folder
        # ``point - deletes`` aside.
        at = f"delete:{point}" if point <= deletes else f"move:{point - deletes}"
        killed = run_cli(*argv, env={"STATEOPS_KILL_AT": at})
        assert killed.returncode == -9, (point, killed.stderr)
        if command == "rollback":  # the query may not start on a half rolled back checkpoint
            with pytest.raises(StateOpsError, match="was interrupted; finish it first"):
                refuse_pending_rollback(work)
        again = run_cli(*argv)
        assert again.returncode == 0, (point, again.stderr)
        assert _state(work) == expected, f"killed at {at}"

    # The finished checkpoint restarts on new input (a rolled-back one reprocesses the batches
    # after its target first) to the state and output of the untouched template restarted on
    # the same input.
    registry = _registry(template, work, tmp_path / "run")
    before = load_checkpoint(work).last_committed_batch
    run_in_session(spark, registry, "page_visits")
    assert load_checkpoint(work).last_committed_batch > before
    assert state_and_output(spark, registry, "page_visits") == restarted


def _registry(template: Path, work: Path, root: Path) -> Path:
    """A registry whose page_visits runs on ``work`` and its sink beside it, reading the
    template's landing folder."""
    return write_registry(
        root,
        page_visits={
            "checkpoint": str(work),
            "sink": {"format": "parquet", "path": str(work.with_name("sink"))},
            "source": {
                "format": "json",
                "path": str(template / "landing/page_visits"),
                "schema": "user_id STRING, page STRING, event_time TIMESTAMP",
                "options": {"maxFilesPerTrigger": 1},
            },
            **_state_store(template),
        },
    )


@pytest.fixture(scope="module")
def restarted(template, spark) -> tuple:
    """harness.state_and_output of the template's checkpoint restarted untouched on one more
    landed file, the control of each finished checkpoint's restart; once per template."""
    land(template / "landing", round_=1, files=1)
    work, _ = _fresh(template, template / "control" / "ck")
    registry = _registry(template, work, template / "control")
    run_in_session(spark, registry, "page_visits")
    return state_and_output(spark, registry, "page_visits")
