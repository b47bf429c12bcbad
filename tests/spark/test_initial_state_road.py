"""The initialState road keeps what user_sessions computes, and its proof sees when it does not.

One Spark-written old checkpoint whose last batch (a cutover: one batch, then stop) moved the
watermark without using it, so the old query restarted would filter late rows at one
watermark and fire timers at a later one. The reference is that: a copy of the old checkpoint
restarted on the same events. The new source's first two batches hold events older than the
old watermark (the old query drops them), one within it for an open session (it keeps it),
and an idle session's timer falls between the two watermarks; one open session took a late
event before the cutover, so its events are not in time order. The road is run by the
bootstrap job (as the migration's ``bootstrap`` task runs it); then with each defect of issue
16 put back, in process, and the proof must fail.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path
from types import SimpleNamespace

import pytest

from stateops.control.target import query_target
from stateops.core.checkpoint import load_checkpoint
from stateops.core.errors import StateOpsError
from stateops.core.files import copy_restart_set
from stateops.core.registry import load_registry
from stateops.core.verify import verify_checkpoint
from stateops.ops.migration import plan_migration
from stateops.ops.start import run_start
from stateops.spark.export import export_state, state_checksum
from tests.conftest import run_cli, tree_digest, write_registry
from tests.spark.harness import job_in_session, land, quiesce, read_sink

pytestmark = [pytest.mark.spark, pytest.mark.whole]

NAME = "user_sessions"
DATA = 4  # output columns: user_id, session_start, session_end, num_events, data, closed_by


def _append(path: Path, *events: tuple[str, str, int], mtime: float | None = None) -> None:
    """Events (user, data, event time in ms) added to a landing file, its mtime kept."""
    mtime = path.stat().st_mtime if path.exists() else mtime
    with open(path, "a") as out:
        for user, data, ms in events:
            at = datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3]
            out.write(
                json.dumps(
                    {"user_id": user, "data": data, "is_last": False, "event_time": f"{at}Z"}
                )
                + "\n"
            )
    os.utime(path, (mtime, mtime))


def _events(folder: Path) -> list[dict]:
    """A landing folder's events, in the order the query reads them (files by mtime)."""
    rows = []
    for f in sorted(folder.iterdir(), key=lambda f: f.stat().st_mtime):
        rows += [json.loads(line) for line in f.read_text().splitlines()]
    for row in rows:
        row["ms"] = int(datetime.fromisoformat(row["event_time"]).timestamp() * 1000)
    return rows


def _registry(root: Path, **spec):
    return load_registry(write_registry(root, user_sessions=spec))


@pytest.fixture(scope="module")
def road(spark, tmp_path_factory) -> SimpleNamespace:
    root = tmp_path_factory.mktemp("road")
    old = _registry(root / "old")
    landing = Path(old.query(NAME).source.path)
    land(root / "old" / "landing", round_=0, files=2)
    events = _events(landing)
    delay, timeout = 5 * 60_000, 1800 * 1000
    watermark = max(e["ms"] for e in events) - delay  # after the old source's last file
    # A session idle for so long that its timer is due just after that watermark.
    last_file = max(landing.iterdir(), key=lambda f: f.stat().st_mtime)
    _append(last_file, ("u00099", "idle", watermark + 5_000 - timeout))
    run_start(query_target(old, NAME))
    quiesce(spark)
    # An open session whose last event is recent and that stays open through the new
    # source: it takes a late event (within the watermark) in the cutover batch, after its
    # later events, and the late events of the new source's first two batches.
    land(root / "round1", round_=1, files=2)
    new_events = root / "round1" / NAME
    first, second = sorted(new_events.iterdir())
    later = _events(new_events)
    last = {e["user_id"]: e for e in events}
    late_user = next(
        u
        for u, e in sorted(last.items())
        if not e["is_last"]
        and e["ms"] > watermark + 10_000
        and not any(n["is_last"] for n in later if n["user_id"] == u)
        and any(n["user_id"] == u and n["data"].startswith("e1-1-") for n in later)
    )
    # The cutover batch: that late event, and one that moves the watermark by 15 s, which only
    # the next batch would use (the run stops after this batch).
    _append(
        landing / "events-cutover.json",
        (late_user, "late-old", watermark + 5_000),
        ("u00098", "moves", watermark + delay + 15_000),
        mtime=last_file.stat().st_mtime + 5,
    )
    cut = run_start(query_target(old, NAME), cutover=datetime.now(UTC))
    quiesce(spark)
    assert cut["status"] == "succeeded" and cut["batches_run"] == 1, cut
    cp = load_checkpoint(old.query(NAME).checkpoint)
    batch = cp.last_committed_batch
    ran, handed_on = cp.offsets[batch].watermark_ms, cp.commits[batch]["nextBatchWatermarkMs"]
    assert (ran, handed_on) == (watermark, watermark + 15_000), (ran, handed_on)

    # The new source: its first two files with events the old query drops as late (older
    # than its watermark), one it keeps for the open session, one it keeps only because the
    # late rows of batch N + 1 are filtered at the watermark batch N ran with; the idle
    # session comes back after its timer (N + 1's) is due.
    first_max = max(e["ms"] for e in later if e["data"].startswith("e1-0-"))
    _append(
        first,
        (late_user, "late-0", watermark - 3_600_000),
        (late_user, "late-new", watermark + 10_000),
        ("u00003", "in-gap", watermark + 5_000),
    )
    _append(second, (late_user, "late-1", watermark - 1_800_000), ("u00099", "back", first_max))
    new_landing = root / "new" / "landing" / NAME
    new_landing.mkdir(parents=True)
    for f in (first, second):
        shutil.copy2(f, new_landing / f.name)

    # The reference: the same query, stopped at the cutover and restarted on one source.
    ref_ckpt = root / "ref" / "checkpoint"
    copy_restart_set(cp, batch, ref_ckpt)
    for f in (first, second):
        shutil.copy2(f, landing / f.name)
    sink = {"format": "parquet", "path": str(root / "ref" / "output")}
    ref = _registry(
        root / "ref",
        checkpoint=str(ref_ckpt),
        sink=sink,
        source={**old.query(NAME).source.model_dump(by_alias=True)},
    )
    ran_ref = run_start(query_target(ref, NAME))
    quiesce(spark)
    assert ran_ref["status"] == "succeeded" and ran_ref["batches_run"] >= 2, ran_ref

    export = root / "export"
    export_state(spark, str(cp.root), export)
    quiesce(spark)
    return SimpleNamespace(
        root=root,
        old=old,
        cp=cp,
        batch=batch,
        ref=ref,
        export=export,
        late_user=late_user,
        digest=tree_digest(cp.root),
    )


def _new(road, name: str, **spec):
    """A registry for the query on the new source, into its own checkpoint and sink."""
    return _registry(
        road.root / name,
        source={
            **road.old.query(NAME).source.model_dump(by_alias=True),
            "path": str(road.root / "new" / "landing" / NAME),
        },
        **spec,
    )


def _ordered_state(spark, checkpoint: str) -> tuple[list, list]:
    """Open sessions with their events in list order, and timers, whatever the partition."""
    events = (
        spark.read.format("statestore")
        .options(stateVarName="events", flattenCollectionTypes="false")
        .load(checkpoint)
    )
    timers = spark.read.format("statestore").option("readRegisteredTimers", "true").load(checkpoint)
    result = (
        sorted(
            (r.key.user_id, [(e.data, e.event_time) for e in r.list_value])
            for r in events.collect()
        ),
        sorted((r.key.user_id, r.expiration_timestamp_ms) for r in timers.collect()),
    )
    quiesce(spark)
    return result


def _output(query) -> Counter:
    return Counter(row for rows in read_sink(Path(query.sink.path)).values() for row in rows)


def _bootstrap(spark, road, registry) -> dict:
    """bootstrap_state.py from the road's export, in the shared session: its summary, whether
    the bootstrap succeeded (exit 0) or its proof failed (exit 1)."""
    code, out = job_in_session(
        spark,
        "bootstrap_state.py",
        "--registry",
        str(registry.path),
        "--query",
        NAME,
        "--initial-state",
        str(road.export),
    )
    assert code in (0, 1), out[-3000:]
    return json.loads(out.strip().splitlines()[-1])


def test_the_road_gives_the_state_and_output_of_the_query_restarted_at_the_cutover(spark, road):
    """On 3 partitions where the old state has 2: the road repartitions the state (a
    migration falls back to it when the partition count changed, tests/dag/test_migration.py)."""
    new = _new(road, "new", shuffle_partitions=3)
    summary = _bootstrap(spark, road, new)
    assert summary["bootstrap"] == "complete" and summary["proof"]["ok"], summary["proof"]
    # Proven from batch 0 (the carried state) through the new source's first two batches.
    assert summary["proof"]["batches"][:3] == [0, 1, 2], summary["proof"]
    assert "handleInitialState not called" in summary["proof"]["reference"]

    query = new.query(NAME)
    cp = load_checkpoint(query.checkpoint)
    old_ran = road.cp.offsets[road.batch].watermark_ms
    old_handed_on = road.cp.commits[road.batch]["nextBatchWatermarkMs"]
    assert cp.input_files(0) == [] and cp.offsets[0].source_offsets == [None]
    assert cp.offsets[0].watermark_ms == old_ran, "batch 0 runs with the old batch's watermark"
    assert cp.commits[0]["nextBatchWatermarkMs"] == old_handed_on
    assert cp.offsets[1].watermark_ms == old_handed_on, "batch 1 fires timers as N + 1 would"
    assert verify_checkpoint(query.checkpoint)["ok"]
    assert [op.num_partitions for op in cp.operators] == [3], "the state is repartitioned"
    assert [op.num_partitions for op in road.cp.operators] == [2]
    assert tree_digest(road.cp.root) == road.digest, "the old checkpoint is only read"

    reference = road.ref.query(NAME)
    assert _ordered_state(spark, query.checkpoint) == _ordered_state(spark, reference.checkpoint)
    output = _output(query)
    assert output == _output(reference), "output differs from the query restarted at the cutover"
    data = [row[DATA] for row in output]
    assert ("u00099", "idle", "timeout") in {(r[0], r[DATA], r[5]) for r in output}
    assert any("in-gap" in d for d in data)
    # The open session: its events in the order they came, the late ones dropped.
    carried = dict(_ordered_state(spark, str(road.cp.root))[0])[road.late_user]
    assert carried[-1][0] == "late-old" and carried != sorted(carried, key=lambda e: e[1])
    still_open = dict(_ordered_state(spark, query.checkpoint)[0]).get(road.late_user)
    closed = [
        r[DATA].split("|") for r in output if r[0] == road.late_user and "late-old" in r[DATA]
    ]
    now = [d for d, _ in still_open] if still_open else closed[0]
    assert now[: len(carried) + 1] == [d for d, _ in carried] + ["late-new"], now
    assert "late-0" not in now and "late-1" not in now


def test_the_proof_fails_when_the_carried_events_are_re_sorted(spark, road):
    """Defect (b) put back: handleInitialState re-sorts the events by (event_time, data)."""
    new = _new(
        road,
        "resorted",
        processor={
            **road.old.query(NAME).processor.model_dump(by_alias=True),
            "class": "tests.spark.leaky:ResortingUserSessions",
        },
    )
    summary = _bootstrap(spark, road, new)
    assert summary["status"] == "failed" and not summary["proof"]["ok"], summary
    assert re.search(
        r"batch 0 events: (\d+) rows, expected \1 \(contents differ\)", summary["error"]
    ), summary["error"]
    # An order-blind checksum (the proof's before) finds nothing: the same rows, other order.
    flat = {"stateVarName": "events", "batchId": "0"}
    new_rows = spark.read.format("statestore").options(**flat).load(new.query(NAME).checkpoint)
    flat["batchId"] = str(road.batch)
    old_rows = spark.read.format("statestore").options(**flat).load(str(road.cp.root))
    assert state_checksum(new_rows) == state_checksum(old_rows)
    quiesce(spark)


def test_the_proof_fails_when_the_watermark_is_not_carried(spark, road, monkeypatch):
    """Defect (a) put back: batch 0 reads the new source at watermark 0, as before issue 16."""
    import stateops.ops.carry

    monkeypatch.setattr(stateops.ops.carry, "write_image_batch", lambda *args: False)
    monkeypatch.setattr(stateops.ops.carry, "finish_image_batch", lambda *args: False)
    new = _new(road, "uncarried")
    summary = _bootstrap(spark, road, new)
    assert summary["status"] == "failed" and not summary["proof"]["ok"], summary
    error = summary["error"]
    assert "batch 0 ran with watermark 0, the old query's would be" in error, error
    proof = json.loads(Path(summary["proof"]["proof_file"]).read_text())
    extra = {
        v["batch"]: v["actual_rows"] - v["expected_rows"]
        for v in proof["variables"]
        if v["variable"] == "events" and not v["ok"]
    }
    assert extra.get(0, 0) > 0, proof["variables"]  # late-0 let in (and more)
    assert extra.get(1, 0) > extra[0], proof["variables"]  # and late-1 as well


def test_a_processor_whose_state_changed_is_refused_unless_accepted(road):
    expiring = {
        **road.old.query(NAME).processor.model_dump(by_alias=True),
        "class": "tests.spark.leaky:ExpiringUserSessions",
    }
    registry = _registry(road.root / "changed", processor=expiring, checkpoint=str(road.cp.root))
    new_source = {"format": "json", "path": str(road.root / "new" / "landing" / NAME)}
    before = tree_digest(road.cp.root)
    with pytest.raises(
        StateOpsError,
        match=r"would change what it computes: state 'events' is "
        r"ListState \(ttl False\) in the old checkpoint, ListState \(ttl True\).*"
        "trigger again with accept_differences on",
    ):
        plan_migration(query_target(registry, NAME), new_source, "v2", carry_over="initial_state")
    plan = plan_migration(
        query_target(registry, NAME),
        new_source,
        "v2",
        carry_over="initial_state",
        accept_differences=True,
    )
    assert plan["carry_over"]["accepted"] and plan["carry_over"]["differences"]
    assert tree_digest(road.cp.root) == before

    new = _new(road, "changed-new", processor=expiring)
    args = ["--registry", str(new.path), "bootstrap", NAME, "--initial-state", str(road.export)]
    refused = run_cli(*args, "--dry-run")
    assert refused.returncode == 2 and "Traceback" not in refused.stderr
    assert (
        "carrying user_sessions's state by the initialState road would change what it "
        "computes: state 'events'"
    ) in refused.stderr
    assert "run it again with --accept-differences" in refused.stderr
    accepted = run_cli(*args, "--dry-run", "--accept-differences", check=True)
    assert "ACCEPTED, it changes what the query computes: state 'events'" in accepted.stdout
