"""The initialState road's pieces that need no JVM: the old query's watermarks batch by batch,
the image batch's commit, void source offsets, and carried lists in their recorded order
(the road itself, on Spark-written checkpoints: tests/spark/test_initial_state_road.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from stateops.core.checkpoint import load_checkpoint
from stateops.core.errors import StateOpsError
from stateops.core.formats import crc_sidecar, hadoop_crc
from stateops.core.registry import load_registry
from stateops.ops.bootstrap import initial_state_differences
from stateops.ops.carry import finish_image_batch, is_image_batch, write_checkpoint_file
from stateops.ops.transplant import refuse_differences
from stateops.pipelines.carried import CarriedList
from stateops.pipelines.user_sessions import UserSessionsProcessor
from stateops.spark.proof import watermark_steps
from stateops.spark.simulator import simulate_batch
from tests.conftest import write_registry

pytestmark = pytest.mark.unit

T = pd.Timestamp
MIN = 60_000


def test_a_restarted_query_filters_late_rows_at_the_old_batch_and_fires_at_the_handed_on():
    carried = {"batch_watermark_ms": 100 * MIN, "next_batch_watermark_ms": 105 * MIN}
    # Input up to minute 90 (older than both), then 200, then no input, then 300.
    steps = watermark_steps(carried, [90 * MIN, 200 * MIN, None, 300 * MIN], 5 * MIN)
    assert steps == [
        (100 * MIN, 105 * MIN),  # batch N + 1: late rows at N's watermark, timers at N's next
        (105 * MIN, 105 * MIN),  # its input moved nothing: still the carried watermark
        (105 * MIN, 195 * MIN),  # the new input's own watermark takes over
        (195 * MIN, 195 * MIN),
    ]
    assert watermark_steps(carried, [None], None) == [(100 * MIN, 105 * MIN)]


def _checkpoint(root: Path, offsets: dict[int, str], commits: dict[int, int]) -> Path:
    """A small checkpoint log: ``offsets`` batch -> source offset line, ``commits`` batch ->
    nextBatchWatermarkMs."""
    write_checkpoint_file(root, "metadata", json.dumps({"id": "q"}))
    for batch, source in offsets.items():
        meta = {"batchWatermarkMs": batch * MIN, "batchTimestampMs": 0, "conf": {}}
        write_checkpoint_file(root, f"offsets/{batch}", f"v1\n{json.dumps(meta)}\n{source}")
    for batch, watermark in commits.items():
        write_checkpoint_file(
            root, f"commits/{batch}", f"v1\n{json.dumps({'nextBatchWatermarkMs': watermark})}"
        )
    return root


def test_a_void_source_offset_reads_nothing_and_the_next_batch_starts_at_the_first_entry(
    tmp_path,
):
    root = _checkpoint(tmp_path / "cp", {0: "-", 1: '{"logOffset":0}'}, {0: 0, 1: 0})
    entry = {"path": "file:///landing/a.json", "timestamp": 1, "batchId": 0}
    write_checkpoint_file(root, "sources/0/0", f"v1\n{json.dumps(entry)}")
    cp = load_checkpoint(root)
    assert cp.file_log_offset(0, 0) == -1 and cp.input_files(0) == []
    assert cp.input_files(1) == [{"path": "file:///landing/a.json", "timestamp": 1}]
    assert "sources/0/0" not in cp.restart_files(0) and "sources/0/0" in cp.restart_files(1)


def test_the_image_batch_hands_on_the_old_watermark_once_and_only_before_batch_1(tmp_path):
    carried = {"watermark": {"batch_watermark_ms": 100, "next_batch_watermark_ms": 115}}
    root = _checkpoint(tmp_path / "cp", {0: "-"}, {0: 100})
    assert finish_image_batch(root, carried)
    assert load_checkpoint(root).commits[0]["nextBatchWatermarkMs"] == 115
    data = (root / "commits/0").read_bytes()
    assert (root / crc_sidecar("commits/0")).read_bytes() == hadoop_crc(data)
    assert not finish_image_batch(root, carried), "done once"
    planned = _checkpoint(tmp_path / "planned", {0: "-", 1: "-"}, {0: 100})
    assert not finish_image_batch(planned, carried), "batch 1 was planned with the old one"
    assert load_checkpoint(planned).commits[0]["nextBatchWatermarkMs"] == 100


def test_an_upgrades_image_batch_goes_on_from_the_old_querys_source_positions(tmp_path):
    """A code upgrade reads the old query's own sources: once the image batch 0 committed, it
    takes the old last batch's positions and file log, so batch 1 reads only unread files."""
    old = _checkpoint(tmp_path / "old", {0: '{"logOffset":0}', 1: '{"logOffset":1}'}, {0: 0, 1: 0})
    for n in (0, 1):
        entry = {"path": f"file:///landing/{n}.json", "timestamp": 1, "batchId": n}
        write_checkpoint_file(old, f"sources/0/{n}", f"v1\n{json.dumps(entry)}")
    new = _checkpoint(tmp_path / "new", {0: "-"}, {0: 0})
    origin = {
        "checkpoint": str(old),
        "batch": 1,
        "positions": True,
        "watermark": {"batch_watermark_ms": 0, "next_batch_watermark_ms": 0},
    }
    assert finish_image_batch(new, origin)
    cp = load_checkpoint(new)
    assert cp.offsets[0].source_offsets == [{"logOffset": 1}]
    assert cp.seen_files(0) == {"/landing/0.json", "/landing/1.json"}
    assert (new / "sources/0/1").read_bytes() == (old / "sources/0/1").read_bytes()
    assert (new / crc_sidecar("offsets/0")).read_bytes() == hadoop_crc(
        (new / "offsets/0").read_bytes()
    )
    assert not finish_image_batch(new, origin), "done once"
    assert is_image_batch(new, origin), "the image batch, with the old positions carried"
    wider = _checkpoint(tmp_path / "two", {0: "-\n-"}, {0: 0})
    with pytest.raises(StateOpsError, match="batch 0 reads 2 sources"):
        finish_image_batch(wider, origin)


def test_a_batch_0_is_an_image_only_while_it_holds_void_or_the_old_batchs_positions(tmp_path):
    """The proof reads batch 0's input unless it is the image batch: a batch 0 Spark planned
    on the sources (a road that wrote no image) read files the reference must take too."""
    old = _checkpoint(tmp_path / "old", {3: '{"logOffset":3}'}, {3: 0})
    origin = {"checkpoint": str(old), "batch": 3, "positions": False}
    void = _checkpoint(tmp_path / "void", {0: "-"}, {0: 0})
    planned = _checkpoint(tmp_path / "planned", {0: '{"logOffset":0}'}, {0: 0})
    carried = _checkpoint(tmp_path / "carried", {0: '{"logOffset":3}'}, {0: 0})
    assert is_image_batch(void, origin)
    assert not is_image_batch(planned, origin)
    assert not is_image_batch(carried, origin), "no positions to carry: Spark planned it"
    assert is_image_batch(carried, origin | {"positions": True})
    assert not is_image_batch(planned, origin | {"positions": True})


def test_carried_rows_come_in_their_recorded_order_whatever_the_chunks():
    carried = CarriedList(fallback_order=["event_time", "data"])
    rows = pd.DataFrame(
        {
            "data": ["c", "a", "late", "b"],
            "event_time": [
                T("2026-01-01 00:03"),
                T("2026-01-01 00:01"),
                T("2026-01-01 00:00"),
                T("2026-01-01 00:02"),
            ],
            "position": [2, 0, 3, 1],
        }
    )
    # Spark hands a key's rows over shuffled, in chunks, one call after the other.
    assert carried.rows(("u",), rows.iloc[:2], ["data"]) == [("a",), ("c",)]
    assert carried.rows(("u",), rows.iloc[2:], ["data"]) == [("a",), ("b",), ("c",), ("late",)]
    assert carried.rows(("v",), rows.iloc[:1], ["data"]) == [("c",)], "a new key starts over"
    # Without positions (an initial state written by hand): the fallback order.
    fresh = CarriedList(fallback_order=["event_time", "data"])
    by_hand = rows.drop(columns="position")
    assert fresh.rows(("u",), by_hand, ["data"]) == [("late",), ("a",), ("b",), ("c",)]


def test_the_simulator_keeps_list_positions_in_and_out():
    old = [
        {"key": ("u",), "list_element": (d, T(t).to_pydatetime()), "list_position": p}
        for d, t, p in [
            ("late", "2026-01-01 00:00", 2),
            ("a", "2026-01-01 00:05", 0),
            ("b", "2026-01-01 00:06", 1),
        ]
    ]
    state = simulate_batch(
        UserSessionsProcessor(),
        time_mode="EventTime",
        key_columns=["user_id"],
        input_rows=None,
        prior_state={"events": old},
    )
    assert [(r["list_element"][0], r["list_position"]) for r in state.rows("events")] == [
        ("a", 0),
        ("b", 1),
        ("late", 2),
    ]


def test_an_export_made_before_positions_and_watermarks_is_refused_unless_accepted(tmp_path):
    export = tmp_path / "export"
    export.mkdir()
    entry = {"variable": "events", "kind": "list", "path": "op0/events", "rows": 1}
    (export / "manifest.json").write_text(
        json.dumps({"checkpoint": str(tmp_path / "gone"), "batch_id": 3, "entries": [entry]})
    )
    query = load_registry(write_registry(tmp_path / "data")).query("user_sessions")
    differences = initial_state_differences(export, query)
    assert differences == [
        f"{export} records no watermark: late input and timers after the carry-over would "
        "not follow the old query's; export it again",
        f"{export} records no order for list state 'events': its elements would be carried "
        "in another order; export it again",
    ]
    with pytest.raises(
        StateOpsError,
        match=r"^carrying user_sessions's state by the "
        r"initialState road would change what it computes: .*records no "
        r"watermark.*; to go on anyway, say so$",
    ):
        refuse_differences("user_sessions", differences, False, "say so")
    refuse_differences("user_sessions", differences, True, "say so")
    refuse_differences("user_sessions", [], False, "say so")
