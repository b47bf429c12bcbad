"""The migration's choice of a new checkpoint folder, without Spark."""

from __future__ import annotations

from stateops.core.registry import load_registry
from stateops.ops.migration import default_checkpoint
from tests.conftest import write_registry


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
