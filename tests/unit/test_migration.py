"""The migration's choice of a new checkpoint folder and its refusals, without Spark."""

from __future__ import annotations

import pytest
import yaml

from stateops.core.errors import StateOpsError
from stateops.core.registry import load_registry
from stateops.ops.migration import default_checkpoint, plan_migration
from tests.conftest import run_cli, write_registry

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
    ("inputs", "carry_over", "moving", "says"),
    [
        ({"source": "s"}, "initial_state", "", "^carry_over initial_state is for processors "
         r"\(handleInitialState\); page_counts is a transform, whose state moves by transplant"),
        ({"sources": {"views": "s", "events": "s"}}, "auto", "",
         r"^source: query page_counts reads 2 sources \(events, views\): name the one that moves$"),
        ({"sources": {"views": "s", "events": "s"}}, "auto", "clicks",
         r"^source: query page_counts has no source 'clicks': its sources are events, views$"),
        ({"source": "s"}, "auto", "views", r"^source: query page_counts has no source 'views': "
         r"it "
         r"reads one source: leave the source name empty$"),
    ],
)  # fmt: skip
def test_a_transform_moves_its_state_by_transplant_one_named_source_at_a_time(
    tmp_path, inputs, carry_over, moving, says
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
                       carry_over=carry_over, source_name=moving)  # fmt: skip
    assert not (tmp_path / "data" / "checkpoints").exists()


@pytest.mark.parametrize(
    ("new_path", "cutover", "says"),
    [
        ("landing/page_visits/v2", "drain", r"^new_source_path: new source folder "
         r".*landing/page_visits/v2 "
         r"overlaps the folder of page_counts's source views \(.*landing/page_visits\): land "
         "the new source's input in a folder of its own$"),
        ("landing/events_v2", "2026-01-01T00:00:00Z", r"^cutover: a cutover time reads one "
         r"source up "
         "to it; page_counts reads 2: choose cutover drain$"),
    ],
)  # fmt: skip
def test_moving_one_source_of_a_join_keeps_the_others_apart(tmp_path, new_path, cutover, says):
    """The transplant tells the sources apart by their folders, and a cutover time cuts one."""
    path = write_registry(tmp_path / "data")
    raw = yaml.safe_load(path.read_text())
    visits = raw["queries"]["page_visits"]["source"]
    raw["queries"]["page_counts"] = {
        "sources": {"views": visits, "events": {**visits, "path": "landing/user_sessions"}},
        "sink": {"path": "output/page_counts"},
        "transform": {"function": "stateops.pipelines.page_counts:build"},
        "checkpoint": "checkpoints/page_counts",
    }
    path.write_text(yaml.safe_dump(raw))
    (tmp_path / "data" / new_path).mkdir(parents=True)
    with pytest.raises(StateOpsError, match=says):
        plan_migration(load_registry(path), "page_counts", {"path": new_path, "format": "json"},
                       cutover=cutover,
                       source_name="events")  # fmt: skip
    assert not (tmp_path / "data" / "checkpoints").exists()


def test_stateops_migrate_names_the_source_that_moves(tmp_path):
    path = write_registry(tmp_path / "data")
    proc = run_cli("--registry", str(path), "migrate", "page_visits", "--source", "clicks",
                   "--new-source-path", "landing/v2", "--dry-run")  # fmt: skip
    assert proc.returncode == 2 and proc.stderr.strip() == (
        "error: source: query page_visits has no source 'clicks': it reads one source: leave the "
        "source name empty"
    ), proc.stderr


def test_a_query_whose_checkpoint_is_in_s3_is_refused_before_anything_is_read(tmp_path):
    path = write_registry(tmp_path, page_visits={"checkpoint": "s3a://checkpoints/page_visits"})
    with pytest.raises(StateOpsError, match=(
        r"^query page_visits: its checkpoint is in S3 \(s3a://checkpoints/page_visits"
        r"\), and the migration runs on local checkpoints only for now; restore a backup into "
        r"a local folder and migrate that \(docs/checkpoints-on-s3.md\)$"
    )):  # fmt: skip
        plan_migration(load_registry(path), "page_visits", {"path": "landing/elsewhere"})
