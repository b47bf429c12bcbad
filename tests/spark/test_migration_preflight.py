"""A migration's preflight refuses bad form input with one clear line and changes nothing."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from stateops.control.lock import read_hold
from stateops.control.target import query_target
from stateops.core.errors import StateOpsError
from stateops.core.registry import load_registry
from stateops.ops.migration import format_migration_plan, plan_migration, prepare_migration
from tests.conftest import spark_submit_run_query, tree_digest, write_registry
from tests.spark.harness import land, run_in_session

pytestmark = pytest.mark.spark


@pytest.fixture(scope="module")
def data(spark, tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("preflight")
    path = write_registry(root)
    land(root / "landing", round_=0, files=1)
    run_in_session(spark, path, "page_visits")
    (root / "landing_v2").mkdir()
    (root / "landing_v3_empty").mkdir()
    _parquet(root / "landing_v2")
    (root / "landing_json").mkdir()  # the events of round 0 again, landed as JSON lines
    for n, path in enumerate(sorted((root / "landing" / "page_visits").glob("*.json"))):
        (root / "landing_json" / f"part-{n}.json").write_bytes(path.read_bytes())
    return root


def _source(**changes) -> dict:
    return {"format": "parquet", "path": "landing_v2", **changes}


def _parquet(folder: Path, **types: pa.DataType) -> None:
    columns = {
        "user_id": pa.string(),
        "page": pa.string(),
        "event_time": pa.timestamp("us", "UTC"),
        **types,
    }
    schema = pa.schema(list(columns.items()))
    pq.write_table(pa.Table.from_pylist([], schema=schema), folder / "part-0.parquet")


BAD = [
    (
        "nope",
        _source(),
        "",
        r"no query named 'nope' \(registered: idle_sessions, page_counts, page_visits, "
        r"user_sessions\)",
    ),
    (
        "page_visits",
        _source(path="landing_v3"),
        "",
        r"^new_source_path: new source path .*/landing_v3 does not exist or is not a folder: "
        r"create it",
    ),
    (
        "page_visits",
        _source(path="landing_v3_empty"),
        "",
        r"^new_source_path: new source folder .*/landing_v3_empty has no input yet: land its "
        r"first files",
    ),
    (
        "page_visits",
        _source(format="kafka"),
        "",
        r"^new_source_path: a kafka source reads a topic, not a folder: give new_source_topic",
    ),
    (
        "page_visits",
        _source(format="avro"),
        "",
        r"^new_source_format: 'avro' is not a format; one of 'json', 'parquet', 'csv', "
        r"'kafka', 'delta'$",
    ),
    (
        "page_visits",
        _source(schema="user_id STRING, event_time TIMESTAMP"),
        "",
        r"^new_source_schema: new source schema has no column 'page', which page_visits reads",
    ),
    (
        "page_visits",
        _source(schema="user_id STRING, page STRING, event_time STRING"),
        "",
        r"^new_source_schema: new source column 'event_time' is STRING, but page_visits reads "
        r"it as TIMESTAMP",
    ),
    (
        "page_visits",
        _source(path="landing/page_visits", format="json"),
        "",
        r"^new_source_path: the new source is page_visits's current source: nothing to migrate",
    ),
    (
        "page_visits",
        _source(path="landing_json"),
        "",  # issue 40: the dry run passed it
        r"^new_source_format: .*/landing_json/part-0.json is a json file, but the new source's "
        r"format is parquet: give the format of its files \(--new-source-format json\)",
    ),
    (
        "page_visits",
        _source(),
        "landing",
        r"^new_checkpoint: new checkpoint .*/landing is not empty",
    ),
    (
        "page_visits",
        _source(),
        "checkpoints/page_visits/offsets",
        r"^new_checkpoint: new checkpoint .* overlaps the current checkpoint",
    ),
]


@pytest.mark.parametrize(("query", "source", "checkpoint", "message"), BAD)
def test_bad_input_is_refused_in_preflight_and_changes_nothing(
    data, query, source, checkpoint, message
):
    before = tree_digest(data)
    with pytest.raises(StateOpsError, match=message) as err:
        plan_migration(
            query_target(data / "registry.yaml", query), source, checkpoint, "manual__bad"
        )
    assert "\n" not in str(err.value)
    assert tree_digest(data) == before


def test_parquet_files_whose_columns_do_not_match_the_schema_are_refused(data, tmp_path):
    target = query_target(data / "registry.yaml", "page_visits")
    folder = tmp_path / "v2"
    folder.mkdir()
    _parquet(folder, event_time=pa.string())
    with pytest.raises(
        StateOpsError,
        match=r"part-0.parquet: column 'event_time' is STRING, "
        r"not TIMESTAMP",
    ):
        plan_migration(target, _source(path=str(folder)), "", "manual__bad")
    _parquet(folder, event_time=pa.timestamp("us", "UTC"))
    plan = plan_migration(target, _source(path=str(folder)), "", "manual__ok")
    assert plan["new"]["checkpoint"] == str(data / "checkpoints" / "page_visits.v2")
    assert plan["old"]["last_committed_batch"] == 0 and plan["new_source_files"] == 1


def test_a_query_held_by_another_operation_is_refused_and_a_held_query_admits_only_the_run(data):
    target = query_target(data / "registry.yaml", "page_visits")
    lock = load_registry(data / "registry.yaml").lock_path("page_visits")
    with target.lock("cleanup", "cleanup-1"):
        with pytest.raises(StateOpsError, match=r"locked by cleanup \(run cleanup-1, "):
            plan_migration(target, _source(), "", "manual__1")
    plan = plan_migration(target, _source(), "", "manual__1")
    prepare_migration(target, plan)
    try:
        assert read_hold(lock).run_id == "manual__1"
        with pytest.raises(StateOpsError, match=r"held by migration \(run manual__1\)"):
            plan_migration(target, _source(), "", "manual__2")
        proc = spark_submit_run_query(data / "registry.yaml", "page_visits")
        assert proc.returncode == 2
        assert "held by migration (run manual__1)" in proc.stdout + proc.stderr
    finally:
        from stateops.control.lock import release_hold

        assert release_hold(lock, "manual__1")


def _changed(tmp_path: Path, data: Path, **changes) -> Path:
    """The registry of ``data`` with page_visits' entry changed."""
    path = write_registry(tmp_path, page_visits=changes)
    raw = yaml.safe_load(path.read_text())
    path.write_text(yaml.safe_dump({**raw, "data_dir": str(data)}, sort_keys=False))
    return path


def test_a_changed_partition_count_plans_the_transplant_then_sparks_repartition(data, tmp_path):
    """The old state files have 2 partitions, the query now wants 3: the transplant applies,
    and Spark's repartition gives the new checkpoint 3 partitions before its first batch (run:
    tests/spark/test_migration_run.py)."""
    target = query_target(_changed(tmp_path, data, shuffle_partitions=3), "page_visits")
    before = tree_digest(data)
    for road in ("auto", "transplant"):
        plan = plan_migration(target, _source(), "", "manual__tp", carry_over=road)
        assert plan["carry_over"]["road"] == "transplant", plan["carry_over"]
        assert plan["carry_over"]["repartition"] == [2, 3]
        assert plan["carry_over"]["transplant_refusals"] == []
    text = format_migration_plan(plan, dry_run=True)
    assert (
        "carry-over: transplant, then Spark's repartition of the state, 2 -> 3 partitions" in text
    )
    same = plan_migration(
        query_target(_changed(tmp_path / "same", data), "page_visits"),
        _source(),
        "",
        "manual__same",
    )
    assert same["carry_over"]["repartition"] is None, "no repartition without a change"
    assert tree_digest(data) == before


def test_where_the_transplant_does_not_apply_auto_falls_back_and_transplant_is_refused(
    data, tmp_path
):
    """Another state encoding (Spark cannot repartition it into one): auto takes the
    initialState road and says why; carry_over transplant is refused at preflight, saying
    why; nothing changes."""
    target = query_target(
        _changed(
            tmp_path,
            data,
            shuffle_partitions=3,
            spark_conf={"spark.sql.streaming.stateStore.encodingFormat": "avro"},
        ),
        "page_visits",
    )
    before = tree_digest(data)
    plan = plan_migration(target, _source(), "", "manual__auto")
    assert (
        plan["carry_over"]["road"] == "initial_state" and plan["carry_over"]["repartition"] is None
    )
    why = "streaming.stateStore.encodingFormat is unsaferow in the old checkpoint, avro"
    assert any(why in r for r in plan["carry_over"]["transplant_refusals"]), plan["carry_over"]
    assert f"initial_state (transplant does not apply: {why}" in format_migration_plan(
        plan, dry_run=True
    )
    with pytest.raises(StateOpsError, match=f"the transplant does not apply: {why}"):
        plan_migration(target, _source(), "", "manual__tp", carry_over="transplant")
    assert tree_digest(data) == before


def test_a_processor_without_initial_state_moves_by_transplant_only(data):
    """No ``initial_state.from_export`` (as a code upgrade with ``initial_state.mapping``
    leaves an entry): the transplant still moves its state; the initialState road alone is
    refused, in one line, changing nothing."""
    raw = yaml.safe_load((data / "registry.yaml").read_text())
    raw["queries"]["page_visits"]["initial_state"] = None
    path = data / "no-initial-state.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    target = query_target(path, "page_visits")
    before = tree_digest(data)
    with pytest.raises(
        StateOpsError, match=r"^carry_over: query page_visits: no initial_state.from_export"
    ):
        plan_migration(target, _source(), "", "manual__x", carry_over="initial_state")
    plan = plan_migration(target, _source(), "", "manual__auto")
    assert plan["carry_over"]["road"] == "transplant", plan["carry_over"]
    assert tree_digest(data) == before
    path.unlink()


def test_a_cutover_time_drains_exactly_the_files_before_it(spark, tmp_path):
    from datetime import UTC, datetime

    from stateops.core.checkpoint import load_checkpoint

    path = write_registry(tmp_path)
    land(tmp_path / "landing", round_=0, files=3)
    query = load_registry(path).query("user_sessions")
    files = sorted(Path(query.source.path).iterdir(), key=lambda p: p.stat().st_mtime)

    def at(file: Path) -> str:
        return datetime.fromtimestamp(file.stat().st_mtime, UTC).isoformat()

    run_in_session(spark, path, "user_sessions", "--cutover", at(files[2]))
    cp = load_checkpoint(query.checkpoint)
    assert cp.last_committed_batch == 0, "one batch, and no no-data batch after it"
    assert sorted(f["path"].rpartition("/")[2] for f in cp.input_files(0)) == [
        f.name for f in files[:2]
    ]
    assert cp.seen_files() == {str(f) for f in files[:2]}, "the file after the cutover is unread"

    before = tree_digest(Path(query.checkpoint))
    again = run_in_session(spark, path, "user_sessions", "--cutover", at(files[2]))
    assert again["batches_run"] == 0
    assert tree_digest(Path(query.checkpoint)) == before, "nothing before the cutover is left"

    for cutover, message in [
        (at(files[1]), "already read 1 input files modified at or after"),
        ("2999-01-01T00:00:00Z", "is in the future"),
    ]:
        refused = spark_submit_run_query(path, "user_sessions", "--cutover", cutover)
        assert refused.returncode == 2 and message in refused.stdout + refused.stderr
        assert tree_digest(Path(query.checkpoint)) == before


def test_a_new_source_without_a_format_takes_the_format_of_its_files(data):
    """The dry run names the format it found; the old checkpoint is read as for any plan."""
    target = query_target(data / "registry.yaml", "page_visits")
    before = tree_digest(data)
    for folder, found in (("landing_json", "json"), ("landing_v2", "parquet")):
        plan = plan_migration(target, {"path": folder}, "", "manual__auto")
        assert plan["new"]["source"]["format"] == found
        assert f"-> {found} {data / folder} (" in format_migration_plan(plan, dry_run=True)
    assert tree_digest(data) == before
