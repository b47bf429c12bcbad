from __future__ import annotations

import importlib
import json
import sys
import zipfile
from pathlib import Path

import pytest
import yaml

from stateops.core.errors import RegistryError
from stateops.core.registry import PROVIDER_CLASSES, load_registry, schema_columns
from tests.conftest import ROOT, run_cli, write_registry

pytestmark = pytest.mark.unit


def _registry_with(tmp_path, mutate) -> str:
    raw = yaml.safe_load((ROOT / "registry.yaml").read_text())
    mutate(raw)
    path = tmp_path / "registry.yaml"
    path.write_text(yaml.safe_dump(raw))
    return str(path)


def _refused_in_one_line(tmp_path, mutate, expected: str) -> None:
    """What ``mutate`` breaks is refused in one line that says ``expected``: a top-level field
    when the registry loads; an entry when its query is asked for, the others loading (one
    typo stops one query)."""
    path = _registry_with(tmp_path, mutate)
    try:
        registry = load_registry(path)
    except RegistryError as err:
        message = str(err)
    else:
        ((name, message),) = registry.invalid.items()
        with pytest.raises(RegistryError) as err:
            registry.query(name)
        assert str(err.value) == message
        assert len(registry.queries) == len(yaml.safe_load(Path(path).read_text())["queries"]) - 1
    assert expected in message
    assert "\n" not in message


def test_project_registry_loads_the_reference_pipelines(tmp_path, monkeypatch):
    monkeypatch.setenv("STATEOPS_DATA_DIR", str(tmp_path))
    registry = load_registry(ROOT / "registry.yaml")
    assert set(registry.queries) == {
        "user_sessions",
        "page_visits",
        "page_counts",
        "idle_sessions",
        "kafka_visits",
    }
    assert registry.query("kafka_visits").source.subscribed == ["page-visits"]
    assert registry.query("page_counts").state_store.provider == "hdfs"
    assert registry.query("idle_sessions").transform.options["idle_seconds"] == 1800
    q = registry.query("user_sessions")
    assert q.checkpoint == str(tmp_path / "checkpoints" / "user_sessions")
    assert q.source.path == str(tmp_path / "landing" / "user_sessions")
    assert q.processor.time_mode == "EventTime"
    conf = q.spark_conf_for_query()
    assert conf["spark.sql.streaming.stateStore.providerClass"] == PROVIDER_CLASSES["rocksdb"]
    assert conf["spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled"] == "true"
    assert conf["spark.sql.streaming.stateStore.minDeltasForSnapshot"] == "4"


def test_test_registry_overrides_reach_spark_conf(tmp_path):
    registry = load_registry(write_registry(tmp_path))
    conf = registry.query("page_visits").spark_conf_for_query()
    assert conf["spark.sql.shuffle.partitions"] == "2"
    assert conf["spark.sql.streaming.stateStore.minDeltasForSnapshot"] == "2"
    assert conf["spark.sql.streaming.stateStore.maintenanceInterval"] == "200ms"


def test_the_checkpoint_format_is_set_for_every_query_and_v2_is_for_rocksdb(tmp_path):
    """Every query sets its format (default 1): in a shared session one query's v2 must not
    carry over to the next query's new checkpoint."""
    key = "spark.sql.streaming.stateStore.checkpointFormatVersion"
    registry = load_registry(
        write_registry(tmp_path, page_visits={"state_store": {"checkpoint_format": 2}})
    )
    assert registry.query("page_visits").spark_conf_for_query()[key] == "2"
    assert {
        q.spark_conf_for_query()[key] for n, q in registry.queries.items() if n != "page_visits"
    } == {"1"}
    _refused_in_one_line(
        tmp_path,
        lambda r: r["queries"]["page_counts"]["state_store"].update(checkpoint_format=2),
        "checkpoint_format 2 is for the rocksdb provider only",
    )


@pytest.mark.parametrize(
    ("mutate", "expected"),
    [
        (
            lambda r: r["queries"]["page_visits"]["source"].update(format="avro"),
            "queries.page_visits.source.format",
        ),
        (
            lambda r: r["queries"]["page_visits"].update(key_columns=["account_id"]),
            "key column 'account_id' is not in source.schema",
        ),
        (
            lambda r: r["queries"]["page_visits"].update(shuffle_partitions=0),
            "queries.page_visits.shuffle_partitions",
        ),
        (
            lambda r: r["queries"]["page_visits"]["processor"].update({"class": "no_colon_here"}),
            "queries.page_visits.processor.class",
        ),
        (
            lambda r: r["queries"]["page_visits"].update(checkpoint_dir="x"),
            "queries.page_visits.checkpoint_dir: Extra inputs are not permitted",
        ),
        (
            lambda r: r["queries"]["page_visits"]["state_store"].update(provider="memory"),
            "queries.page_visits.state_store.provider",
        ),
        (
            lambda r: r["queries"]["page_visits"]["source"].update(schema="user_id"),
            "queries.page_visits.source.schema",
        ),
        (lambda r: r["queries"]["user_sessions"].pop("watermark"), "EventTime needs a watermark"),
        (
            lambda r: r["queries"]["page_visits"]["state_store"].update(provider="hdfs"),
            "transformWithState processors run only on rocksdb",
        ),
        (lambda r: r.update(extra=1), "unknown top-level field(s): extra"),
        (lambda r: r.update(data_dir=None), "data_dir: expected a folder path"),
        (lambda r: r.update(lease_seconds=5), "lease_seconds: expected seconds from 10 to 86400"),
        (lambda r: r.update(lease_seconds="1m"), "got '1m'"),
        (
            lambda r: r.update(start={"schedule": "every half hour"}),
            "start.schedule: expected a duration (30 minutes, 2 hours) or a cron expression",
        ),
        (
            lambda r: r.update(health={"input_waiting": "soon"}),
            "health.input_waiting: expected a duration (90 minutes, 2 hours, 1 day), got 'soon'",
        ),
        (
            lambda r: r["queries"]["page_visits"].update(health={"retention_margin": 1.5}),
            "queries.page_visits.health.retention_margin: Input should be less than 1",
        ),
        (
            lambda r: r.update(health={"failed_runs": 0}),
            "health.failed_runs: Input should be greater than or equal to 1",
        ),
        (
            lambda r: r.update(alerts={"schedule": "often"}),
            "alerts.schedule: expected a duration (30 minutes, 2 hours) or a cron expression",
        ),
        (
            lambda r: r["queries"]["page_visits"].update(name="other"),
            "queries.page_visits.name: a query's name is its key",
        ),
    ],
)
def test_errors_name_the_bad_field(tmp_path, mutate, expected):
    _refused_in_one_line(tmp_path, mutate, expected)


def test_unknown_query_lists_the_registered_ones(tmp_path):
    registry = load_registry(write_registry(tmp_path))
    with pytest.raises(RegistryError, match="no query named 'nope' .*page_visits, user_sessions"):
        registry.query("nope")


def test_missing_and_malformed_files(tmp_path):
    with pytest.raises(RegistryError, match="cannot read registry"):
        load_registry(tmp_path / "absent.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("queries: [unclosed")
    with pytest.raises(RegistryError, match="not valid YAML"):
        load_registry(bad)


def test_schema_columns_handles_nested_types():
    assert schema_columns("a STRING, b STRUCT<x: INT, y: ARRAY<STRING>>, c DECIMAL(10,2)") == [
        "a",
        "b",
        "c",
    ]
    with pytest.raises(ValueError):
        schema_columns("a STRING, b STRUCT<x: INT")


TRANSFORM = {"function": "stateops.pipelines.page_counts:build", "output_mode": "update"}


def _counts(r, **changes):
    """A transform query beside the processors (page_visits' source and sink, its own names)."""
    spec = {
        "source": r["queries"]["page_visits"]["source"],
        "transform": TRANSFORM,
        "sink": {"path": "output/page_counts"},
        "checkpoint": "checkpoints/page_counts",
        "state_store": {"provider": "hdfs"},
    }
    r["queries"]["page_counts"] = {**spec, **changes}


def test_a_transform_query_reads_its_sources_by_name_on_either_store(tmp_path):
    registry = load_registry(_registry_with(tmp_path, _counts))
    query = registry.query("page_counts")
    assert query.processor is None and query.key_columns == []
    assert query.output_mode == "update" and list(query.inputs) == ["source"]
    assert (
        query.spark_conf_for_query()["spark.sql.streaming.stateStore.providerClass"]
        == PROVIDER_CLASSES["hdfs"]
    )
    source = registry.query("page_visits").source
    joined = load_registry(
        _registry_with(
            tmp_path,
            lambda r: _counts(
                r,
                source=None,
                sources={
                    "views": source.model_dump(by_alias=True),
                    "clicks": {**source.model_dump(by_alias=True), "path": "landing/clicks"},
                },
            ),
        )
    )
    assert {n: s.path for n, s in joined.query("page_counts").inputs.items()} == {
        "views": source.path,
        "clicks": str(tmp_path / "data" / "landing" / "clicks"),
    }
    assert registry.query("page_visits").output_mode == "update", "the processor's, lower case"
    # What a migration can move: processors with initial_state, transforms (a source by name).
    assert query.movable and registry.query("page_visits").movable
    assert joined.query("page_counts").movable
    assert (query.input_name(""), joined.query("page_counts").input_name("clicks")) == (
        "source",
        "clicks",
    )


@pytest.mark.parametrize(
    ("mutate", "expected"),
    [
        (
            lambda r: _counts(r, processor=r["queries"]["page_visits"]["processor"]),
            "queries.page_counts: give either processor (a transformWithStateInPandas class) or "
            "transform",
        ),
        (lambda r: _counts(r, transform=None), "give either processor"),
        (
            lambda r: _counts(r, sources={"a": r["queries"]["page_visits"]["source"]}),
            "queries.page_counts: give either source (one input) or sources (inputs by name)",
        ),
        (
            lambda r: _counts(r, watermark={"column": "event_time", "delay": "1 minute"}),
            "watermark is for processor queries: a transform applies its own watermarks",
        ),
        (
            lambda r: _counts(r, transform={**TRANSFORM, "output_mode": "replace"}),
            "queries.page_counts.transform.output_mode",
        ),
        (
            lambda r: _counts(r, transform={"function": "no_colon"}),
            "queries.page_counts.transform.function",
        ),
        (
            lambda r: r["queries"]["page_visits"].update(
                source=None, sources={"a": r["queries"]["page_visits"]["source"]}
            ),
            "a processor reads one source: give source, not sources",
        ),
        (
            lambda r: r["queries"]["page_visits"].update(key_columns=[]),
            "key_columns: a processor groups by at least one key column",
        ),
        (
            lambda r: _counts(r, expectations={"expiry": {"time_column": "t"}}),
            "queries.page_counts.expectations.expiry: give time_column and timeout_option, or "
            "timeout_column",
        ),
        (
            lambda r: _counts(
                r,
                expectations={
                    "expiry": {"timeout_column": "c", "time_column": "t", "timeout_option": "o"}
                },
            ),
            "give time_column and timeout_option, or timeout_column",
        ),
        (
            lambda r: _counts(
                r, expectations={"expiry": {"time_column": "t", "timeout_option": "o"}}
            ),
            "expectations.expiry.timeout_option 'o' is not an integer option of the transform",
        ),
        (lambda r: r.update(code_paths=["nope"]), "code_paths: 'nope' is not a folder"),
        (lambda r: r.update(code_paths="jobs"), "code_paths: expected a list of folders"),
    ],
)
def test_a_query_is_one_shape_and_its_code_where_the_registry_says(tmp_path, mutate, expected):
    _refused_in_one_line(tmp_path, mutate, expected)


def test_code_paths_are_relative_to_the_registry_file_and_survive_a_derived_registry(tmp_path):
    from stateops.core.registry import derived_registry

    (tmp_path / "jobs").mkdir()
    registry = load_registry(_registry_with(tmp_path, lambda r: r.update(code_paths=["jobs"])))
    assert registry.code_paths == [tmp_path / "jobs"]
    derived = derived_registry(registry, "page_visits", {}, tmp_path / "elsewhere" / "r.yaml")
    assert load_registry(derived).code_paths == [tmp_path / "jobs"]


def _own_processor(r: dict, ref: str) -> None:
    r["code_paths"] = ["jobs"]
    r["queries"]["page_visits"]["processor"]["class"] = ref


def test_a_query_imports_its_code_from_its_registry_s_code_paths_wherever_it_is_loaded(
    tmp_path, monkeypatch
):
    """No caller puts code_paths on sys.path first: loading the code does (the migration's
    schema check and proof import the processor as the run does)."""
    from stateops.spark.streaming import load_processor

    jobs = tmp_path / "jobs"
    jobs.mkdir()
    (jobs / "mine_a.py").write_text(
        "from stateops.pipelines.page_visits import PageVisitsProcessor\n\n\n"
        "class Mine(PageVisitsProcessor):\n    pass\n"
    )
    (jobs / "mine_b.py").write_text("import not_installed_anywhere\n")
    monkeypatch.setattr(sys, "path", list(sys.path))  # restored after the test
    for module in ("mine_a", "mine_b"):
        monkeypatch.delitem(sys.modules, module, raising=False)
    path = _registry_with(tmp_path, lambda r: _own_processor(r, "mine_a:Mine"))
    query = load_registry(path).query("page_visits")
    copied = query.model_copy(update={"checkpoint": str(tmp_path / "elsewhere")})
    assert type(load_processor(copied)).__name__ == "Mine"

    # A module that is there but imports what is not: not a code_paths problem.
    path = _registry_with(tmp_path, lambda r: _own_processor(r, "mine_b:Mine"))
    with pytest.raises(RegistryError) as err:
        load_processor(load_registry(path).query("page_visits"))
    assert "mine_b:Mine fails to load: No module named 'not_installed_anywhere'; install" in str(
        err.value
    )
    # A misspelt class in a module that imports: the name, not code_paths.
    path = _registry_with(tmp_path, lambda r: _own_processor(r, "mine_a:Mne"))
    with pytest.raises(RegistryError) as err:
        load_processor(load_registry(path).query("page_visits"))
    assert f"{jobs / 'mine_a.py'} has no 'Mne' (it defines: Mine); check the name" in str(err.value)


def test_code_shipped_to_executors_is_named_by_what_it_holds(tmp_path):
    """Spark refuses a second file of one name with other bytes: a session that ships code
    again after it changed ships it under another name; the same code, the same name."""
    from stateops.spark.streaming import _zipped

    code = tmp_path / "code"
    (code / "__pycache__").mkdir(parents=True)
    (code / "ns").mkdir()  # a namespace package: no __init__.py
    (code / "ns" / "deep.py").write_text("Y = 1\n")
    (code / "mine.py").write_text("X = 1\n")
    (code / "__pycache__" / "mine.cpython-311.pyc").write_bytes(b"compiled")
    first = _zipped(code, tmp_path, "code0-code")
    (code / "__pycache__" / "other.cpython-311.pyc").write_bytes(b"a cache changes nothing")
    assert _zipped(code, tmp_path, "code0-code") == first
    (code / "mine.py").write_text("X = 2\n")
    changed = _zipped(code, tmp_path, "code0-code")
    assert changed != first and changed.name.startswith("code0-code-")
    with zipfile.ZipFile(changed) as archive:
        assert archive.namelist() == ["mine.py", "ns/", "ns/deep.py"]
        assert archive.read("mine.py") == b"X = 2\n"
    sys.path.insert(0, str(changed))  # imported from the zip as the executors import it
    try:
        assert importlib.import_module("ns.deep").Y == 1
    finally:
        sys.path.remove(str(changed))
        sys.modules.pop("ns.deep", None)
        sys.modules.pop("ns", None)


def test_one_invalid_entry_stops_its_query_only(tmp_path):
    """A typo in one entry: every other query loads and runs; the entry's query is refused in
    the one line that names it, and `stateops queries` lists it with that line (exit 2)."""
    path = _registry_with(
        tmp_path, lambda r: r["queries"]["page_counts"].update(shuffle_partitions="four")
    )
    registry = load_registry(path)
    assert "page_counts" not in registry.queries and "page_visits" in registry.queries
    assert set(registry.invalid) == {"page_counts"}
    proc = run_cli("--registry", path, "queries", "--json")
    assert proc.returncode == 2
    (error,) = proc.stderr.splitlines()
    assert error.startswith("error: ") and "queries.page_counts.shuffle_partitions" in error
    listed = {q["name"]: q["error"] for q in json.loads(proc.stdout)["queries"]}
    assert listed["page_visits"] is None and listed["page_counts"] == error.removeprefix("error: ")
