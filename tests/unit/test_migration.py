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


@pytest.mark.parametrize(
    ("inputs", "carry_over", "says"),
    [
        ({"source": "s"}, "initial_state", "^carry_over initial_state is for processors "
         r"\(handleInitialState\); page_counts is a transform, whose state moves by transplant"),
        ({"sources": {"views": "s", "events": "s"}}, "auto", r"^query page_counts reads named "
         r"sources \(events, views\): moving one of them is not supported yet"),
    ],
)  # fmt: skip
def test_a_transform_moves_its_state_by_transplant_and_one_source_only(
    tmp_path, inputs, carry_over, says
):
    path = write_registry(tmp_path / "data")
    raw = yaml.safe_load(path.read_text())
    visits = raw["queries"]["page_visits"]["source"]
    raw["queries"]["page_counts"] = {
        **{k: visits if v == "s" else {n: visits for n in v} for k, v in inputs.items()},
        "sink": {"path": "output/page_counts"},
        "transform": {"function": "stateops.pipelines.page_counts:build"},
        "checkpoint": "checkpoints/page_counts",
    }  # fmt: skip
    path.write_text(yaml.safe_dump(raw))
    with pytest.raises(StateOpsError, match=says):
        plan_migration(load_registry(path), "page_counts", {"path": "landing/elsewhere"},
                       carry_over=carry_over)  # fmt: skip
    assert not (tmp_path / "data" / "checkpoints").exists()
