"""Code upgrades on Spark-written checkpoints (stateops.ops.upgrade): the check's verdict for
each change of page_visits' processor agrees with what Spark does when it restarts the new
code on the old checkpoint, `stateops run` refuses a change that needs a rewrite without
touching the checkpoint, and the rewrite carries the state into the new code's checkpoint.

One old checkpoint per encoding (module fixtures); every restart runs on a copy of it."""

from __future__ import annotations

import json
import shutil
from collections import Counter
from pathlib import Path

import pytest

from stateops import cli
from stateops.alerts import firing, watch_readiness
from stateops.control.lock import read_hold
from stateops.control.target import query_target
from stateops.core.checkpoint import load_checkpoint
from stateops.core.errors import OperationFailed
from stateops.core.registry import load_registry
from stateops.ops.backup import backup_first
from stateops.ops.upgrade import (
    REWRITE,
    check_code_change,
    plan_upgrade,
    run_upgrade,
)
from stateops.spark.streaming import apply_query_conf, start_query, use_code_paths
from stateops.status import query_status
from tests.conftest import run_cli, tree_digest, whole_after
from tests.spark.harness import (
    VIEWS,
    digest,
    job_in_session,
    job_runner,
    land,
    quiesce,
    read_sink,
    run_in_session,
    summary_of,
)
from tests.spark.test_kafka_queries import kafka_source, visits
from tests.spark.upgrading import (
    NAME,
    PER_PAGE,
    run_old_code,
    upgrade_registry,
    with_new_code,
)

pytestmark = pytest.mark.spark

# Checkpoints of other stateful operators than a processor's: applyInPandasWithState, a
# windowed aggregation (registry.yaml's own queries), dropDuplicates (page_pairs).
OTHER_OPERATORS = ("idle_sessions", "page_counts", "page_pairs")


def _new_processor(cls: str, time_mode: str = "None", **options) -> dict:
    """A registry entry's new code: processor ``cls`` (where a transform may have been)."""
    return {
        "transform": None,
        "watermark": None,
        "processor": {
            "class": cls,
            "options": options,
            "time_mode": time_mode,
            "output_mode": "Update",
        },
        "expectations": {},
    }


def _count_as(schema: str, name: str = "count") -> dict:
    """page_visits' new code: its value state ``count`` declared as ``name`` ``schema``."""
    return _new_processor("upgrades:CountAs", max_pages=1000, name=name, schema=schema)


# change -> (registry entry of the new code, whether the check says it needs a rewrite)
CHANGES = {
    "unchanged": ({}, False),
    "variable renamed": (_count_as("visits LONG", name="visit_count"), False),
    "value retyped": (_count_as("visits STRING"), True),
    "field added": (_count_as("visits LONG, last_page STRING"), True),
    "variable split": (_new_processor("upgrades:SplitCount", max_pages=1000), False),
    "key widened": (
        _new_processor("upgrades:PerPageVisits", max_pages=1000)
        | {"key_columns": ["user_id", "page"]},
        True,
    ),
    # Spark takes it: the old variables are dropped, the new one starts empty.
    "key widened, variables renamed": (PER_PAGE, False),
}
# The Avro checkpoint's old code: count (visits INT, last_page STRING); new codes Spark evolves.
AVRO_OLD = "visits INT, last_page STRING"
AVRO_CHANGES = {
    "field added": "visits INT, last_page STRING, first_page STRING",
    "field removed": "visits INT",
    "field widened": "visits LONG, last_page STRING",
}


def _first(name: str, cases: dict) -> list[str]:
    """The names of ``cases``, ``name`` first (the one the gate runs)."""
    return [name, *(case for case in cases if case != name)]


PAGE_VISITS_INITIAL = {
    "schema": "user_id STRING, page STRING, visited_at TIMESTAMP, position INT",
    "position": "position",
    "mapping": "upgrades:pages_as_before",
}
# old query -> new code and the mapping of its state; every one needs a rewrite.
UPGRADES = {
    "applyInPandasWithState to a processor re-arming its timeouts": (
        "idle_sessions",
        _new_processor("upgrades:IdleVisits", "EventTime", idle_seconds=1800)
        | {
            "watermark": {"column": "event_time", "delay": "5 minutes"},
            "key_columns": ["user_id"],
            "output_schema": "user_id STRING, visit_start TIMESTAMP, visit_end TIMESTAMP, "
            "events LONG, open BOOLEAN",
            "initial_state": {
                "schema": "user_id STRING, first_ms LONG, last_ms LONG, events LONG, "
                "timeout_ms LONG",
                "unique_keys": True,
                "mapping": "upgrades:visits_from_group_state",
            },
        },
    ),
    "aggregation to a processor": (
        "page_counts",
        _new_processor("upgrades:WindowCounts", window_minutes=10)
        | {
            "key_columns": ["page"],
            "output_schema": "window_start TIMESTAMP, window_end TIMESTAMP, page STRING, "
            "views LONG",
            "initial_state": {
                "schema": "page STRING, window_start TIMESTAMP, views LONG",
                "mapping": "upgrades:windows_from_aggregation",
            },
        },
    ),
    "dropDuplicates to a processor": (
        "page_pairs",
        _new_processor("upgrades:FirstViews")
        | {
            "output_schema": "user_id STRING, page STRING, event_time TIMESTAMP",
            "initial_state": {
                "schema": "user_id STRING, page STRING",
                "unique_keys": True,
                "mapping": "upgrades:pairs_from_dedup",
            },
        },
    ),
    "value retyped": (NAME, _count_as("visits STRING") | {"initial_state": PAGE_VISITS_INITIAL}),
    "variable split": (
        NAME,
        _new_processor("upgrades:SplitCount", max_pages=1000)
        | {"initial_state": PAGE_VISITS_INITIAL},
    ),
    "key widened": (NAME, PER_PAGE),
}


@pytest.fixture(scope="module")
def old_default(spark, tmp_path_factory):
    root = tmp_path_factory.mktemp("upgrade-default")
    return run_old_code(spark, root, "unsaferow", (NAME, *OTHER_OPERATORS))


@pytest.fixture(scope="module")
def old_avro(spark, tmp_path_factory):
    root = tmp_path_factory.mktemp("upgrade-avro")
    return run_old_code(spark, root, "avro", (NAME,), **_count_as(AVRO_OLD))


def _state(spark, checkpoint: str, variable: str) -> list:
    rows = spark.read.format("statestore").option("stateVarName", variable).load(checkpoint)
    collected = rows.collect()
    quiesce(spark)
    return collected


def _spark_accepts(spark, registry: Path, name: str = NAME) -> tuple[bool, str]:
    """Spark itself restarting the new code on the checkpoint over one more input file (the
    project's preflight bypassed): whether a new batch committed, and Spark's error."""
    reg = load_registry(registry)
    query = reg.query(name)
    land(Path(reg.data_dir) / "landing", round_=1, files=1)
    before = load_checkpoint(query.checkpoint).last_committed_batch
    use_code_paths(reg, spark)
    apply_query_conf(spark, query)
    streaming = start_query(spark, query, available_now=True)
    try:
        streaming.awaitTermination(240)
    except Exception:  # noqa: BLE001 - Spark's own failure is the observation
        pass
    error = streaming.exception()
    if streaming.isActive:
        streaming.stop()
    quiesce(spark)
    after = load_checkpoint(query.checkpoint).last_committed_batch
    return error is None and after is not None and after > before, str(error or "")[:300]


# The gate: a value Spark cannot evolve; the other changes in the whole proof.
@pytest.mark.parametrize("change", whole_after(1, _first("value retyped", CHANGES)))
def test_the_check_agrees_with_spark(spark, old_default, tmp_path, change):
    entry, rewrite = CHANGES[change]
    registry = with_new_code(old_default, tmp_path, "unsaferow", **entry)
    query = load_registry(registry).query(NAME)
    changes = check_code_change(load_checkpoint(query.checkpoint), query)
    needs = [c for c in changes if c.verdict == REWRITE]
    assert bool(needs) == rewrite, [c.line() for c in changes]
    accepted, error = _spark_accepts(spark, registry)
    assert accepted == (not rewrite), f"{change}: Spark accepted={accepted} ({error})"


# Another stateful operator's checkpoint (registry.yaml's own queries), new code a processor.
OPERATOR_CHANGES = {
    "applyInPandasWithState": ("idle_sessions", {**PER_PAGE, "watermark": None}),
    "aggregation": ("page_counts", PER_PAGE),
    "dropDuplicates": ("page_pairs", PER_PAGE),
}


@pytest.mark.whole
@pytest.mark.parametrize("change", list(OPERATOR_CHANGES))
def test_another_operator_needs_a_rewrite_as_spark_says(spark, old_default, tmp_path, change):
    name, entry = OPERATOR_CHANGES[change]
    new = {**entry, "source": VIEWS, "transform": None}
    registry = with_new_code(old_default, tmp_path, "unsaferow", query=name, **new)
    query = load_registry(registry).query(name)
    changes = check_code_change(load_checkpoint(query.checkpoint), query)
    assert [c.verdict for c in changes] == [REWRITE], [c.line() for c in changes]
    accepted, error = _spark_accepts(spark, registry, name)
    assert not accepted and "STREAMING_STATEFUL_OPERATOR_NOT_MATCH_IN_STATE_METADATA" in error


@pytest.mark.whole
@pytest.mark.parametrize("change", list(AVRO_CHANGES))
def test_avro_lets_spark_evolve_a_value_and_the_check_says_so(spark, old_avro, tmp_path, change):
    registry = with_new_code(old_avro, tmp_path, "avro", **_count_as(AVRO_CHANGES[change]))
    query = load_registry(registry).query(NAME)
    changes = check_code_change(load_checkpoint(query.checkpoint), query)
    assert [c.line() for c in changes if c.verdict == REWRITE] == []
    assert [c.what for c in changes if "Avro schema evolution" in c.detail] == ["state 'count'"]
    accepted, error = _spark_accepts(spark, registry)
    assert accepted, error


@pytest.mark.parametrize(
    ("entry", "said"),
    [
        # Spark refuses it.
        (CHANGES["value retyped"][0], "state 'count': needs a state rewrite ((visits long)"),
        # Spark would start it, dropping the state the registry's mapping keeps.
        pytest.param(
            PER_PAGE,
            "state 'count': Spark evolves it (removed: Spark drops its state",
            marks=pytest.mark.whole,
        ),
    ],
    ids=["refused by Spark", "state dropped that the mapping keeps"],
)
def test_stateops_run_refuses_code_that_needs_a_rewrite_and_changes_nothing(
    old_default, tmp_path, capsys, entry, said
):
    registry = with_new_code(old_default, tmp_path, "unsaferow", **entry)
    checkpoint = load_registry(registry).query(NAME).checkpoint
    before = digest(checkpoint)
    code = cli.main(["--registry", str(registry), "run", NAME])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2
    assert len(err) == 1, err
    assert said in err[0], err[0]
    assert f"stateops upgrade {NAME} --dry-run" in err[0]
    assert digest(checkpoint) == before


def test_the_cli_plans_a_rewrite_for_new_code_in_code_paths(old_default, tmp_path):
    """`stateops upgrade --dry-run` in a process of its own: the new processor is the user's
    (the registry's code_paths), which the check imports."""
    registry = with_new_code(old_default, tmp_path, "unsaferow", **CHANGES["value retyped"][0])
    proc = run_cli("--registry", str(registry), "upgrade", NAME, "--dry-run", check=True)
    plan = json.loads(proc.stdout.strip().splitlines()[-1])
    assert plan["rewrite"], proc.stderr
    assert "state 'count': needs a state rewrite" in proc.stderr


def test_the_dry_run_refuses_a_rewrite_into_ttl_state_as_the_upgrade_would(old_default, tmp_path):
    """Issue 54: the dry run passed new code with a TTL, which the rewrite's proof then refused
    after stopping, backing up and exporting the query."""
    ttl = _new_processor("tests.spark.leaky:VisitsWithTtl", "ProcessingTime", max_pages=1000)
    registry = with_new_code(old_default, tmp_path, "unsaferow", **ttl)
    before = tree_digest(tmp_path)
    proc = run_cli("--registry", str(registry), "upgrade", NAME, "--dry-run")
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.splitlines()[-1] == (
        f"error: query {NAME}: state 'count', 'pages' has a TTL, and the rewrite's proof "
        "cannot simulate expiry by processing time: a rewrite into state with a TTL is not "
        "supported; nothing was changed"
    )
    assert tree_digest(tmp_path) == before


def _views_per_page(spark, old_checkpoint: str, new_checkpoint: str) -> None:
    """page_visits' pages per user, counted by page by hand: PageViewsProcessor's state."""
    expected: dict[tuple[str, str], int] = {}
    for row in _state(spark, old_checkpoint, "pages"):
        key = (row["key"]["user_id"], row["list_element"]["page"])
        expected[key] = expected.get(key, 0) + 1
    actual = {
        (r["key"]["user_id"], r["key"]["page"]): r["value"]["views"]
        for r in _state(spark, new_checkpoint, "views")
    }
    assert actual == expected


@pytest.mark.whole  # the gate: the stream_code_upgrade DAG's failure (tests/dag)
def test_a_failed_upgrade_rolls_back_and_the_old_code_runs_on(
    spark, s3, old_default, tmp_path, monkeypatch
):
    """A failure after the rewrite (its job also runs the new code's first batches) and after
    the proof: the query is back on its checkpoint, byte for byte as it was, the new one moved
    aside, nothing held; then the old code restarts on it and reads the next file."""
    root = tmp_path / "up"
    registry = with_new_code(old_default, root, "unsaferow", **PER_PAGE)
    checkpoint = load_registry(registry).query(NAME).checkpoint
    before = digest(checkpoint)
    target = query_target(registry, NAME)
    for step in ("rewrite", "prove"):
        monkeypatch.setenv("STATEOPS_FAIL_AFTER", step)
        plan = plan_upgrade(target, run_id=f"upgrade-{step}")
        backup = backup_first(target, s3.client(), "upgrade", log=lambda line: None)
        with pytest.raises(OperationFailed, match=f"failed at {step}"):
            run_upgrade(target, plan, backup=backup, run_job=job_runner(spark), log=print)
        query = load_registry(registry).query(NAME)
        assert query.checkpoint == checkpoint, step
        assert digest(checkpoint) == before, step
        assert not Path(plan["new"]["checkpoint"]).exists(), step
        assert read_hold(load_registry(registry).lock_path(NAME)) is None, step
    monkeypatch.delenv("STATEOPS_FAIL_AFTER")
    last = load_checkpoint(checkpoint).last_committed_batch
    old_code = upgrade_registry(root, "unsaferow")
    land(root / "landing", round_=1, files=1)
    summary = run_in_session(spark, old_code, NAME)
    assert summary["status"] == "succeeded"
    assert load_checkpoint(checkpoint).last_committed_batch == last + 1


def _rows_from(sink: Path, first_batch: int) -> list[tuple]:
    return sorted(
        row for batch, rows in read_sink(sink).items() if batch >= first_batch for row in rows
    )


# The gate: the key widened (the demo's upgrade); the other rewrites in the whole proof.
@pytest.mark.parametrize("change", whole_after(1, _first("key widened", UPGRADES)))
def test_the_rewrite_proves_the_new_state_and_the_new_code_goes_on_from_it(
    spark, s3, old_default, tmp_path, change
):
    """The rewrite's proof: the new state, variable by variable, equals the new processor's
    handleInitialState over the mapping of the old state. From then on the new code's
    output equals the new code run from the same initial state on the input it reads next
    (a query bootstrapped from the same export that reads only that input)."""
    name, entry = UPGRADES[change]
    root = tmp_path / "up"
    registry = with_new_code(old_default, root, "unsaferow", query=name, **entry)
    target = query_target(registry, name)
    plan = plan_upgrade(target, run_id="upgrade-1")
    assert plan["rewrite"], plan["changes"]
    backup = backup_first(target, s3.client(), "upgrade", log=lambda line: None)
    lineage = run_upgrade(target, plan, backup=backup, run_job=job_runner(spark), log=print)
    query = load_registry(registry).query(name)
    assert query.checkpoint == plan["new"]["checkpoint"]
    if change == "key widened":  # one mapping also checked by hand, besides the proof
        _views_per_page(spark, plan["old"]["checkpoint"], query.checkpoint)
    proof = json.loads(Path(lineage["proof"]).read_text())
    assert proof["ok"] and proof["variables"], proof
    rows = [(v["expected_rows"], v["actual_rows"]) for v in proof["variables"]]
    assert all(e == a for e, a in rows) and any(a > 0 for _, a in rows), proof
    # The next input, read by the upgraded query, and by a reference from the same state.
    landing = Path(query.source.path)
    before = set(landing.iterdir())
    land(root / "landing", round_=1, files=1)
    new_files = sorted(set(landing.iterdir()) - before)
    run_in_session(spark, registry, name)
    ref_input = tmp_path / "ref" / "input"
    ref_input.mkdir(parents=True)
    for f in new_files:
        shutil.copy2(f, ref_input / f.name)
    source = query.source.model_dump(by_alias=True) | {"path": str(ref_input)}
    reference = upgrade_registry(tmp_path / "ref", "unsaferow", query=name, **entry, source=source)
    summary_of(
        *job_in_session(
            spark,
            "bootstrap_state.py",
            "--registry",
            str(reference),
            "--query",
            name,
            "--initial-state",
            plan["export"],
            "--format",
            "export",
            "--accept-differences=yes",
        )
    )
    upgraded = _rows_from(Path(query.sink.path), lineage["to"]["sink_batch_offset"])
    expected = _rows_from(Path(load_registry(reference).query(name).sink.path), 0)
    assert upgraded and upgraded == expected


def test_an_upgraded_kafka_query_goes_on_from_the_old_offsets(spark, s3, kafka, tmp_path):
    """page_visits on a topic read from its beginning (``startingOffsets: earliest``), widened
    to views per user and page: the new checkpoint's image batch holds the old last batch's
    offsets, so the new code reads only the records produced after the upgrade, and its views
    count every record once, the old ones through the mapped state."""
    topic = kafka.create_topic("visits-upgrade", partitions=2)
    old, new = visits(25), visits(10, start=25)
    kafka.produce(topic, old)
    source = {"source": kafka_source(topic)}
    run_in_session(spark, upgrade_registry(tmp_path, "unsaferow", **source), NAME)
    old_checkpoint = load_checkpoint(tmp_path / "checkpoints" / NAME)
    read = old_checkpoint.offsets[old_checkpoint.last_committed_batch].source_offsets[0]
    assert read == {topic: {str(p): o for p, o in kafka.offsets(topic).items()}}

    registry = upgrade_registry(tmp_path, "unsaferow", **PER_PAGE, **source)
    target = query_target(registry, NAME)
    plan = plan_upgrade(target, run_id="upgrade-kafka")
    backup = backup_first(target, s3.client(), "upgrade", log=lambda line: None)
    lineage = run_upgrade(target, plan, backup=backup, run_job=job_runner(spark), log=print)
    query = load_registry(registry).query(NAME)
    assert query.checkpoint == plan["new"]["checkpoint"]
    assert load_checkpoint(query.checkpoint).offsets[0].source_offsets[0] == read

    kafka.produce(topic, new)
    summary = run_in_session(spark, registry, NAME)
    assert summary["input_rows"] == len(new), summary
    output = read_sink(Path(query.sink.path))
    views = {}  # each (user, page)'s last count
    for batch in sorted(b for b in output if b >= lineage["to"]["sink_batch_offset"]):
        views |= {(user, page): n for user, page, n in output[batch]}
    counted = Counter((value["user_id"], value["page"]) for _, value, _ in old + new)
    assert views == {key: counted[key] for key in views}
    assert set(views) == {(value["user_id"], value["page"]) for _, value, _ in new}


# page_visits' new code with a bug: views per user and page, raising on its first input.
FAILS_ON_INPUT = {
    **PER_PAGE,
    "processor": {**PER_PAGE["processor"], "class": "upgrades:FailsOnInput"},
}


@pytest.mark.whole
def test_an_upgrade_whose_new_code_fails_is_switched_back_and_nothing_is_lost(
    spark, s3, old_default, tmp_path
):
    """The upgrade switches to new code that raises in its second batch (its first is the old
    state carried over). Its run fails; stream_health's check (the readiness window after an
    upgrade, 1 hour by default) switches the query back to its old checkpoint, keeps the new
    one aside, moves the new code's output aside, and FAILs naming why (its alert). With the
    old code put back, the query reads the input the new code failed on: its state and output
    equal the old query's run on the same input, never upgraded."""
    root = tmp_path / "up"
    registry = with_new_code(old_default, root, "unsaferow", **FAILS_ON_INPUT)
    target = query_target(registry, NAME)
    old_checkpoint = target.checkpoint
    plan = plan_upgrade(target, run_id="upgrade-fails")
    backup = backup_first(target, s3.client(), "upgrade", log=lambda line: None)
    run_upgrade(target, plan, backup=backup, run_job=job_runner(spark), log=print)
    new_checkpoint = plan["new"]["checkpoint"]
    ready = query_status(load_registry(registry), NAME)["readiness"]
    assert ready["state"] == "watching" and ready["run_id"] == "upgrade-fails", ready
    assert load_checkpoint(new_checkpoint).last_committed_batch == 0  # the state carried over

    land(root / "landing", round_=1, files=1)
    code, out = job_in_session(spark, "run_query.py", "--registry", str(registry), "--query", NAME)
    assert code != 0 and "FailsOnInput" in out, out[-3000:]
    said: list[str] = []
    status = watch_readiness(load_registry(registry), NAME, log=said.append)
    reason = (
        "upgrade switched back after its readiness window: its run on the new checkpoint failed"
    )
    assert said[0].startswith(f"{NAME}: {reason}"), said
    assert status["checkpoint"] == old_checkpoint
    assert not Path(new_checkpoint).exists()
    assert Path(f"{new_checkpoint}.failed-upgrade-fails", "commits", "0").exists()
    switched_back = firing(status["health"])["switched_back"]
    assert switched_back["level"] == "FAIL", switched_back
    assert switched_back["message"].startswith(reason), switched_back
    assert "put the old code back in its registry entry" in switched_back["message"]
    assert status["readiness"] is None  # the switch now undone is not watched

    upgrade_registry(root, "unsaferow")  # the old code, put back by a person
    assert run_in_session(spark, registry, NAME)["status"] == "succeeded"
    reference = with_new_code(old_default, tmp_path / "ref", "unsaferow")
    land(tmp_path / "ref" / "landing", round_=1, files=1)
    run_in_session(spark, reference, NAME)
    ours, theirs = load_registry(registry).query(NAME), load_registry(reference).query(NAME)
    assert read_sink(Path(ours.sink.path)) == read_sink(Path(theirs.sink.path))
    for variable in ("count", "pages"):
        rows = [sorted(map(str, _state(spark, q.checkpoint, variable))) for q in (ours, theirs)]
        assert rows[0] == rows[1] and rows[0], variable
    assert "switched_back" not in firing(query_status(load_registry(registry), NAME)["health"])
