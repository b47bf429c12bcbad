"""Data-level integrity with Great Expectations on Spark-written state."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import yaml

from stateops.core.checkpoint import load_checkpoint
from stateops.core.registry import load_registry
from stateops.spark.expectations import format_validation, leaking_keys, validate_state
from stateops.spark.streaming import apply_query_conf, start_query
from stateops.status import query_status
from tests.conftest import ROOT, write_registry
from tests.spark.harness import USER_CODE, land

pytestmark = pytest.mark.spark


def _run_user_sessions(spark, root: Path, processor_class: str):
    processor = yaml.safe_load((ROOT / "registry.yaml").read_text())["queries"]["user_sessions"][
        "processor"
    ]
    options = {"session_timeout_seconds": 600}  # sessions time out within the sample data
    registry = write_registry(
        root,
        user_sessions={"processor": {**processor, "class": processor_class, "options": options}},
    )
    query = load_registry(registry).query("user_sessions")
    land(root / "landing", round_=0, files=3)
    apply_query_conf(spark, query)
    streaming = start_query(spark, query, available_now=True)
    try:
        streaming.awaitTermination(240)
        assert streaming.exception() is None
    finally:
        streaming.stop()
    return query


def _expired_by_hand(spark, query) -> int:
    cp = load_checkpoint(query.checkpoint)
    watermark_ms = cp.offsets[cp.last_committed_batch].watermark_ms
    latest: dict[str, int] = {}
    events = spark.read.format("statestore").option("stateVarName", "events")
    for row in events.load(query.checkpoint).collect():
        ms = int(row.list_element.event_time.timestamp() * 1000)
        latest[row.key.user_id] = max(latest.get(row.key.user_id, 0), ms)
    return sum(1 for ms in latest.values() if ms + 600_000 <= watermark_ms)


def test_the_expired_state_expectation_names_how_many_keys_leak(spark, tmp_path):
    query = _run_user_sessions(spark, tmp_path, "tests.spark.leaky:ForgetfulUserSessions")
    leaking = _expired_by_hand(spark, query)
    assert leaking > 0, "the sample data should time some sessions out"
    result = validate_state(spark, query)
    assert not result["ok"]
    assert leaking_keys(result) == leaking
    events = next(v for v in result["variables"] if v["variable"] == "events")
    failed = [e for e in events["expectations"] if not e["success"]]
    assert [(e["column"], e["unexpected_count"]) for e in failed] == [("expired", leaking)]
    assert Path(result["data_docs"]).is_file()
    on_disk = json.loads(Path(result["results_file"]).read_text())
    assert on_disk["ok"] is False and on_disk["batch_id"] == result["batch_id"]


@pytest.mark.whole
def test_the_reference_processor_leaves_no_expired_state(spark, tmp_path):
    query = _run_user_sessions(
        spark, tmp_path, "stateops.pipelines.user_sessions:UserSessionsProcessor"
    )
    assert _expired_by_hand(spark, query) == 0
    result = validate_state(spark, query)
    assert result["ok"] and leaking_keys(result) == 0
    kinds = {
        v["variable"]: [e["expectation"] for e in v["expectations"]] for v in result["variables"]
    }
    assert kinds == {
        "timers": ["expect_column_values_to_not_be_null", "expect_column_values_to_be_between"],
        "events": [
            "expect_column_values_to_not_be_null",
            "expect_column_values_to_be_between",
            "expect_column_values_to_be_in_set",
        ],
    }


def _run(spark, query, *, available_now=True):
    apply_query_conf(spark, query)
    streaming = start_query(spark, query, available_now=available_now)
    try:
        if available_now:
            streaming.awaitTermination(240)
        else:  # processing-time trigger: wait for batch 0 to commit
            for _ in range(240):
                if Path(query.checkpoint, "commits", "0").exists():
                    break
                streaming.awaitTermination(0.5)
        assert streaming.exception() is None
    finally:
        streaming.stop()


@pytest.mark.whole
def test_row_counts_may_change_only_by_the_configured_factor(spark, tmp_path):
    registry = write_registry(tmp_path, page_visits={"expectations": {"row_change_factor": 1.2}})
    query = load_registry(registry).query("page_visits")
    land(tmp_path / "landing", round_=0, files=1)
    _run(spark, query)
    first = validate_state(spark, query)
    assert first["ok"]
    rows = {v["variable"]: v["rows"] for v in first["variables"]}
    land(tmp_path / "landing", round_=1, files=3)  # three times the visits
    _run(spark, query)
    second = validate_state(spark, query)
    assert not second["ok"]
    pages = next(v for v in second["variables"] if v["variable"] == "pages")
    failed = [e for e in pages["expectations"] if not e["success"]]
    assert [e["expectation"] for e in failed] == ["expect_table_row_count_to_be_between"]
    low, high = failed[0]["bounds"]
    assert (low, high) == (int(rows["pages"] / 1.2), -(-rows["pages"] * 12 // 10))
    assert failed[0]["observed"] == pages["rows"] > high
    assert f"{pages['rows']} rows, the last validation allows {low}..{high}" in format_validation(
        second
    )


@pytest.mark.whole
def test_ttl_state_is_checked_against_the_batch_time(spark, tmp_path):
    spec = yaml.safe_load((ROOT / "registry.yaml").read_text())["queries"]["page_visits"]
    processor = {
        **spec["processor"],
        "class": "tests.spark.leaky:VisitsWithTtl",
        "time_mode": "ProcessingTime",
    }
    registry = write_registry(
        tmp_path, page_visits={"processor": processor, "trigger": {"processing_time": "1 second"}}
    )
    query = load_registry(registry).query("page_visits")
    land(tmp_path / "landing", round_=0, files=1)
    _run(spark, query, available_now=False)
    result = validate_state(spark, query)
    assert result["ok"], format_validation(result)
    ttl_checks = [
        (v["variable"], e["column"])
        for v in result["variables"]
        for e in v["expectations"]
        if e["column"] and e["column"].endswith("ttlExpirationMs")
    ]
    assert sorted(ttl_checks) == [
        ("count", "value_ttlExpirationMs"),
        ("pages", "list_element_ttlExpirationMs"),
    ]


@pytest.mark.whole
@pytest.mark.parametrize("name", ["deduped_counts", "chained_windows"])
def test_two_operators_stores_each_keep_their_own_row_count_history(spark, tmp_path, name):
    """Both operators' stores are named ``default``: each store's row count is held to its own
    at the last validation, not to the other operator's."""
    registry = write_registry(tmp_path)
    raw = yaml.safe_load(registry.read_text())
    raw["code_paths"] = [str(USER_CODE)]
    raw["queries"][name] = {
        **raw["queries"]["page_counts"],
        "transform": {"function": f"shapes:{name}", "output_mode": "append"},
        "sink": {"format": "parquet", "path": f"output/{name}"},
        "checkpoint": f"checkpoints/{name}",
    }
    registry.write_text(yaml.safe_dump(raw, sort_keys=False))
    query = load_registry(registry).query(name)
    land(tmp_path / "landing", round_=0, files=2)
    _run(spark, query)
    first = validate_state(spark, query)
    assert first["ok"], format_validation(first)
    rows = {(v["operator_id"], v["variable"]): v["rows"] for v in first["variables"]}
    assert set(rows) == {(0, "default"), (1, "default")} and len(set(rows.values())) == 2, rows

    land(tmp_path / "landing", round_=1, files=1)
    _run(spark, query)
    second = validate_state(spark, query)
    assert second["ok"], format_validation(second)
    factor = query.expectations.row_change_factor
    for v in second["variables"]:
        (bounds,) = [e["bounds"] for e in v["expectations"] if e["bounds"]]
        previous = rows[(v["operator_id"], v["variable"])]
        assert bounds == [math.floor(previous / factor), math.ceil(previous * factor)], v
    assert "ok     operator 1 default: expect_table_row_count_to_be_between" in format_validation(
        second
    )
    # status names them apart too, each operator with its own store's rows
    status = query_status(load_registry(registry), name)
    now = {(v["operator_id"], v["variable"]): v["rows"] for v in second["variables"]}
    assert {k: x["rows"] for k, x in status["last_validation"]["variables"].items()} == {
        f"operator {op} {store}": rows for (op, store), rows in now.items()
    }
    assert [op["state_rows"] for op in status["operators"]] == [
        now[(0, "default")],
        now[(1, "default")],
    ]
