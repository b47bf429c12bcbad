"""The bootstrap's plan where it needs no Spark: what it refuses before a job starts, and
which carried-over state a start still has to prove (the roads on Spark-written checkpoints:
tests/spark/test_bootstrap.py; the export's differences: test_carry.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from stateops.control.audit import audit_dir
from stateops.control.markers import carry_over_marker, read_carry_over, write_carry_over
from stateops.control.target import query_target
from stateops.core.errors import RegistryError, StateOpsError
from stateops.core.registry import load_registry
from stateops.ops.bootstrap import plan_bootstrap
from stateops.ops.pending import pending_carry_over
from tests.conftest import write_registry

pytestmark = pytest.mark.unit


@pytest.fixture
def registry(tmp_path):
    return load_registry(write_registry(tmp_path / "data"))


def test_a_query_whose_processor_takes_no_initial_state_is_refused(tmp_path):
    registry = load_registry(write_registry(tmp_path / "data", page_visits={"initial_state": None}))
    with pytest.raises(RegistryError, match="query page_visits: no initial_state in the registry"):
        plan_bootstrap(query_target(registry, "page_visits"), str(tmp_path), None)


def test_a_missing_source_or_an_unknown_format_is_named(registry, tmp_path):
    with pytest.raises(StateOpsError, match="gone: no such initial state"):
        plan_bootstrap(query_target(registry, "user_sessions"), str(tmp_path / "gone"), None)
    with pytest.raises(StateOpsError, match=r"unknown initial state format 'xml' \("):
        plan_bootstrap(query_target(registry, "user_sessions"), str(tmp_path), "xml")


def test_an_export_without_its_manifest_or_its_variable_is_refused(registry, tmp_path):
    export = tmp_path / "export"
    export.mkdir()
    with pytest.raises(StateOpsError, match="no manifest.json, so not a state export"):
        plan_bootstrap(query_target(registry, "user_sessions"), str(export), "export")
    entry = {"variable": "other", "kind": "list", "path": "op0/other"}
    (export / "manifest.json").write_text(json.dumps({"entries": [entry]}))
    with pytest.raises(
        StateOpsError,
        match="the export has no state variable 'events' "
        r"\(it has other\); export the query whose state this is",
    ):
        plan_bootstrap(
            query_target(registry, "user_sessions"), str(export), None
        )  # found by its manifest


def test_a_carry_over_waits_for_its_own_batch_beside_its_own_checkpoint(registry):
    query = registry.query("user_sessions")
    record = {"road": "transplant", "checkpoint": query.checkpoint, "batch": 4}
    write_carry_over(query.checkpoint, record)
    assert carry_over_marker(query.checkpoint) == audit_dir(query.checkpoint) / "carry_over.json"
    assert pending_carry_over(query, 4) == record
    assert pending_carry_over(query, 5) is None, "batch 5 committed: settled"
    assert read_carry_over(query.checkpoint) is None
    moved = query.model_copy(update={"checkpoint": str(Path(query.checkpoint).parent / "new")})
    write_carry_over(query.checkpoint, record)
    assert pending_carry_over(moved, 4) is None, "the query moved: its new checkpoint awaits none"
    assert read_carry_over(query.checkpoint) == record, "the marker stays with its checkpoint"


def test_a_transplant_that_repartitions_waits_through_the_repartition_batch(registry):
    """Batch 5 is Spark's repartition (no input): the carried state's first batch is 6."""
    query = registry.query("user_sessions")
    record = {
        "road": "transplant",
        "checkpoint": query.checkpoint,
        "batch": 4,
        "first": 6,
        "partitions": 3,
    }
    write_carry_over(query.checkpoint, record)
    assert pending_carry_over(query, 4) == record, "to repartition, then batch 6"
    assert pending_carry_over(query, 5) == record, "repartitioned, batch 6 to run"
    assert pending_carry_over(query, 6) is None, "batch 6 committed: settled"
    assert read_carry_over(query.checkpoint) is None
