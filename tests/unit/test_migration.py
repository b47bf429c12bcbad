"""The migration's choice of a new checkpoint folder and its refusals, without Spark."""

from __future__ import annotations

import pytest
import yaml

from stateops.core.errors import StateOpsError
from stateops.core.registry import load_registry
from stateops.ops.migration import default_checkpoint, plan_migration
from tests.conftest import write_registry

pytestmark = pytest.mark.unit


def test_the_default_new_checkpoint_is_the_first_free_version_beside_the_old(tmp_path):
    query = load_registry(write_registry(tmp_path)).query("page_visits")
    old = tmp_path / "checkpoints" / "page_visits"
    assert query.checkpoint == str(old)
    assert default_checkpoint(query) == old.with_name("page_visits.v2")
    (old.with_name("page_visits.v2") / "commits").mkdir(parents=True)  # taken
    old.with_name("page_visits.v3").mkdir()  # empty: free
    assert default_checkpoint(query) == old.with_name("page_visits.v3")
    moved = query.model_copy(update={"checkpoint": str(old.with_name("page_visits.v3"))})
    assert default_checkpoint(moved) == old.with_name("page_visits.v2").with_name(
        "page_visits.v4"
    ), "numbered on from the stem, never .v3.v2"


def test_a_transform_query_is_refused_until_its_state_can_be_carried(tmp_path):
    path = write_registry(tmp_path / "data")
    raw = yaml.safe_load(path.read_text())
    visits = raw["queries"]["page_visits"]
    raw["queries"]["page_counts"] = {
        "source": visits["source"], "sink": {"path": "output/page_counts"},
        "transform": {"function": "stateops.pipelines.page_counts:build"},
        "checkpoint": "checkpoints/page_counts",
    }  # fmt: skip
    path.write_text(yaml.safe_dump(raw))
    with pytest.raises(StateOpsError, match="^query page_counts is a transform: carrying its "):
        plan_migration(load_registry(path), "page_counts", {"path": "landing/elsewhere"})
    assert not (tmp_path / "data" / "checkpoints").exists()
