"""Backfill's pure parts: the derived registry, input times, and the output diff."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from stateops.core.errors import RegistryError, StateOpsError
from stateops.core.registry import load_registry
from stateops.kinds.files import diff_output
from stateops.ops.backfill import logic_changes, parse_time, registry_with_overrides
from tests.conftest import write_registry

pytestmark = pytest.mark.unit


def test_the_plan_names_each_field_an_override_changes_and_nothing_else(tmp_path):
    registry = load_registry(write_registry(tmp_path / "data"))
    # row_change_factor is 10.0 already: overridden, not changed.
    overrides = {
        "processor": {"options": {"session_timeout_seconds": 600}},
        "expectations": {"row_change_factor": 10.0},
    }
    path = registry_with_overrides(registry, "user_sessions", overrides, tmp_path / "r.yaml")
    before, after = registry.query("user_sessions"), load_registry(path).query("user_sessions")
    assert logic_changes(before, after) == [
        "processor.options.session_timeout_seconds: 1800 -> 600"
    ]
    assert logic_changes(before, before) == []


def test_overrides_merge_into_one_query_and_keep_its_data_where_it_is(tmp_path):
    registry = load_registry(write_registry(tmp_path / "data"))
    path = registry_with_overrides(
        registry,
        "user_sessions",
        {"processor": {"options": {"session_timeout_seconds": 600}}},
        tmp_path / "derived" / "registry.yaml",
    )
    derived = load_registry(path)
    assert list(derived.queries) == ["user_sessions"]
    before, after = registry.query("user_sessions"), derived.query("user_sessions")
    assert after.processor.options == {"session_timeout_seconds": 600}
    assert after.processor.class_ == before.processor.class_  # merged, not replaced
    for same in ("checkpoint", "source", "sink", "key_columns", "state_store"):
        assert getattr(after, same) == getattr(before, same), same
    assert derived.lock_path("user_sessions") == registry.lock_path("user_sessions")
    assert derived.run_summary_path("user_sessions") == registry.run_summary_path("user_sessions")


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"checkpoint": "elsewhere"}, "checkpoint cannot be changed by a backfill"),
        ({"processor": {"output_mode": "Sideways"}}, "overrides: "),
        ({"spark_conf": "not a mapping"}, "overrides: "),
    ],
)
def test_bad_overrides_are_refused_and_leave_no_file(tmp_path, overrides, message):
    registry = load_registry(write_registry(tmp_path / "data"))
    dest = tmp_path / "derived" / "registry.yaml"
    with pytest.raises(RegistryError, match=message):
        registry_with_overrides(registry, "user_sessions", overrides, dest)
    assert not dest.exists()


def test_an_unknown_query_is_refused(tmp_path):
    registry = load_registry(write_registry(tmp_path / "data"))
    with pytest.raises(StateOpsError, match="nope"):
        registry_with_overrides(registry, "nope", {}, tmp_path / "r.yaml")


def test_times_without_a_zone_are_utc_and_nonsense_is_refused():
    assert parse_time("2026-11-21T03:00:00") == datetime(2026, 11, 21, 3, tzinfo=UTC)
    assert parse_time("2026-11-21T04:00:00+01:00") == datetime(2026, 11, 21, 3, tzinfo=UTC)
    with pytest.raises(StateOpsError, match="2026-11-21T03:00:00Z"):
        parse_time("yesterday")


def _batch(folder: Path, batch: int, rows: list[dict]) -> None:
    out = folder / f"batch_id={batch}"
    out.mkdir(parents=True)
    pq.write_table(pa.Table.from_pylist(rows), out / "part-00000.parquet")


def test_the_output_diff_counts_unchanged_added_removed_and_changed_keys(tmp_path):
    sink, old = tmp_path / "sink", tmp_path / "sink" / "_rolled_back" / "r-1"
    _batch(sink, 0, [{"user": "kept-before", "n": 1}])  # not reprocessed: not compared
    _batch(old, 1, [{"user": "a", "n": 1}, {"user": "b", "n": 2}])
    _batch(old, 2, [{"user": "c", "n": 3}, {"user": "a", "n": 1}])
    # The rerun planned its batches differently: compared as one multiset.
    _batch(sink, 1, [{"user": "a", "n": 1}, {"user": "b", "n": 5}, {"user": "d", "n": 4}])
    diff = diff_output(sink, old, 0, ["user"])
    assert diff["batches_before"] == [1, 2] and diff["batches_after"] == [1]
    assert (diff["rows_before"], diff["rows_after"]) == (4, 3)
    assert diff["unchanged"] == 1  # a=1 once; its second copy is gone
    assert diff["changed_keys"] == 1  # b: 2 -> 5
    assert diff["added"] == 1  # d
    assert diff["removed"] == 2  # c, and the second a=1
    assert diff["examples"] == ["{'user': 'b'}: ['n=2, user=b'] -> ['n=5, user=b']"]


def test_without_key_columns_a_row_is_its_own_key(tmp_path):
    sink, old = tmp_path / "sink", tmp_path / "sink" / "_rolled_back" / "r-1"
    _batch(old, 1, [{"user": "a", "n": 1}, {"user": "b", "n": 2}])
    _batch(sink, 1, [{"user": "a", "n": 1}, {"user": "b", "n": 5}])
    diff = diff_output(sink, old, 0, [])
    assert (diff["unchanged"], diff["added"], diff["removed"]) == (1, 1, 1)
    assert diff["changed_keys"] == 0 and diff["examples"] == []
