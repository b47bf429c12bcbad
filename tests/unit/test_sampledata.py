from __future__ import annotations

import json

import pytest

from stateops.dev.sampledata import generate_events

pytestmark = pytest.mark.unit


def _landing(root):
    return {name: root / name for name in ("user_sessions", "page_visits")}


def test_same_seed_same_bytes_and_rounds_move_time_forward(tmp_path):
    a = generate_events(_landing(tmp_path / "a"), events_per_file=50, files=3, seed=1)
    b = generate_events(_landing(tmp_path / "b"), events_per_file=50, files=3, seed=1)
    assert [p.read_bytes() for p in a["user_sessions"]] == [
        p.read_bytes() for p in b["user_sessions"]
    ]
    later = generate_events(_landing(tmp_path / "a"), events_per_file=50, files=3, seed=1, round_=1)
    first = [json.loads(line) for p in a["page_visits"] for line in p.read_text().splitlines()]
    second = [json.loads(line) for p in later["page_visits"] for line in p.read_text().splitlines()]
    assert len(first) == 150 and len(second) == 150
    assert max(r["event_time"] for r in first) < min(r["event_time"] for r in second)
    assert {"user_id", "data", "is_last", "event_time"} == set(
        json.loads(a["user_sessions"][0].read_text().splitlines()[0])
    )


def test_only_the_named_landing_folders_are_written(tmp_path):
    written = generate_events({"page_visits": tmp_path / "pv"}, events_per_file=5, files=2)
    assert list(written) == ["page_visits"] and len(list((tmp_path / "pv").iterdir())) == 2
    assert not (tmp_path / "user_sessions").exists()
    with pytest.raises(ValueError, match="no sample data for \\['orders'\\]"):
        generate_events({"orders": tmp_path / "o"})
