"""Code upgrades on Spark-written checkpoints (stateops.ops.upgrade): the check's verdict for
each change of page_visits' processor agrees with what Spark does when it restarts the new
code on the old checkpoint, `stateops run` refuses a change that needs a rewrite without
touching the checkpoint, and the rewrite carries the state into the new code's checkpoint.

One old checkpoint per encoding (module fixtures); every restart runs on a copy of it."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml

from stateops import cli
from stateops.control.lock import read_hold
from stateops.control.target import query_target
from stateops.core.checkpoint import load_checkpoint
from stateops.core.errors import OperationFailed
from stateops.core.files import relocate_checkpoint
from stateops.core.registry import load_registry
from stateops.ops.backup import backup_first
from stateops.ops.carry import write_checkpoint_file
from stateops.ops.upgrade import (
    REWRITE,
    check_code_change,
    plan_upgrade,
    run_upgrade,
)
from stateops.spark.streaming import apply_query_conf, start_query, use_code_paths
from tests.conftest import run_cli, write_registry
from tests.spark.harness import (
    USER_CODE,
    digest,
    job_runner,
    land,
    quiesce,
    read_sink,
    run_in_session,
)

pytestmark = pytest.mark.spark

NAME = "page_visits"
PER_PAGE = {
    "processor": {
        "class": "upgrades:PageCounts",
        "options": {},
        "time_mode": "None",
        "output_mode": "Update",
    },
    "key_columns": ["user_id", "page"],
    "output_schema": "user_id STRING, page STRING, views LONG",
    "initial_state": {
        "schema": "user_id STRING, page STRING, views LONG",
        "unique_keys": True,
        "mapping": "upgrades:views_per_page",
    },
    "expectations": {},
}


def _processor(cls: str) -> dict:
    return {
        "processor": {
            "class": cls,
            "options": {"max_pages": 1000},
            "time_mode": "None",
            "output_mode": "Update",
        }
    }


# change -> (registry entry of the new code, whether the check says it needs a rewrite)
CHANGES = {
    "unchanged": ({}, False),
    "variable renamed": (_processor("upgrades:RenamedCount"), False),
    "value retyped": (_processor("upgrades:TextCount"), True),
    "field added": (_processor("upgrades:WiderCount"), True),
    "variable split": (_processor("upgrades:SplitCount"), False),
    "key widened": (
        {**_processor("upgrades:PerPageVisits"), "key_columns": ["user_id", "page"]},
        True,
    ),
    # Spark takes it: the old variables are dropped, the new one starts empty.
    "key widened, variables renamed": (PER_PAGE, False),
}


def _registry(root: Path, encoding: str, query: str = NAME, **entry) -> Path:
    path = write_registry(root, **{query: {"approval": "none", **entry}})
    raw = yaml.safe_load(path.read_text())
    raw["queries"][query]["state_store"].update({"provider": "rocksdb", "encoding": encoding})
    raw["code_paths"] = [str(USER_CODE)]
    raw["backups"] = {"url": f"s3://backups/{root.name}", "conn_id": "aws_default"}
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


def _old(spark, root: Path, encoding: str) -> Path:
    """A data folder whose page_visits ran the old code over 2 files of round 0."""
    land(root / "landing", round_=0, files=2)
    path = _registry(root, encoding)
    for name in [NAME, "idle_sessions", "page_counts"] if encoding != "avro" else [NAME]:
        run_in_session(spark, path, name)
    return root


@pytest.fixture(scope="module")
def old_default(spark, tmp_path_factory):
    return _old(spark, tmp_path_factory.mktemp("upgrade-default"), "unsaferow")


@pytest.fixture(scope="module")
def old_avro(spark, tmp_path_factory):
    return _old(spark, tmp_path_factory.mktemp("upgrade-avro"), "avro")


def _copy(old: Path, root: Path, encoding: str, query: str = NAME, **entry) -> Path:
    """A copy of ``old``'s data folder (checkpoints, landing, output) with the new code of
    ``query``."""
    shutil.copytree(old, root, dirs_exist_ok=True, ignore=shutil.ignore_patterns("registry.yaml"))
    for checkpoint in (root / "checkpoints").iterdir():
        if checkpoint.suffix == ".audit":
            continue
        relocate_checkpoint(checkpoint)
        for log in (checkpoint / "sources").rglob("*"):  # the files read, by absolute path
            if log.is_file() and not log.name.endswith(".crc"):
                text = log.read_text().replace(str(old), str(root))
                write_checkpoint_file(checkpoint, str(log.relative_to(checkpoint)), text)
    return _registry(root, encoding, query, **entry)


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


@pytest.mark.parametrize("change", list(CHANGES))
def test_the_check_agrees_with_spark(spark, old_default, tmp_path, change):
    entry, rewrite = CHANGES[change]
    registry = _copy(old_default, tmp_path, "unsaferow", **entry)
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
}


@pytest.mark.parametrize("change", list(OPERATOR_CHANGES))
def test_another_operator_needs_a_rewrite_as_spark_says(spark, old_default, tmp_path, change):
    name, entry = OPERATOR_CHANGES[change]
    source = load_registry(old_default / "registry.yaml").query(NAME).source
    new = {**entry, "source": source.model_dump(by_alias=True), "transform": None}
    registry = _copy(old_default, tmp_path, "unsaferow", query=name, **new)
    query = load_registry(registry).query(name)
    changes = check_code_change(load_checkpoint(query.checkpoint), query)
    assert [c.verdict for c in changes] == [REWRITE], [c.line() for c in changes]
    accepted, error = _spark_accepts(spark, registry, name)
    assert not accepted and "STREAMING_STATEFUL_OPERATOR_NOT_MATCH_IN_STATE_METADATA" in error


def test_avro_lets_spark_add_a_field_and_the_check_says_so(spark, old_avro, tmp_path):
    entry, _ = CHANGES["field added"]
    registry = _copy(old_avro, tmp_path, "avro", **entry)
    query = load_registry(registry).query(NAME)
    changes = check_code_change(load_checkpoint(query.checkpoint), query)
    assert [c.line() for c in changes if c.verdict == REWRITE] == []
    assert any("Avro schema evolution" in c.detail for c in changes)
    accepted, error = _spark_accepts(spark, registry)
    assert accepted, error


def test_stateops_run_refuses_code_that_needs_a_rewrite_and_changes_nothing(
    old_default, tmp_path, capsys
):
    registry = _copy(old_default, tmp_path, "unsaferow", **CHANGES["value retyped"][0])
    checkpoint = load_registry(registry).query(NAME).checkpoint
    before = digest(checkpoint)
    code = cli.main(["--registry", str(registry), "run", NAME])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2
    assert len(err) == 1, err
    assert "state 'count'" in err[0] and "visits string" in err[0], err[0]
    assert f"stateops upgrade {NAME} --dry-run" in err[0]
    assert digest(checkpoint) == before


def test_the_cli_plans_a_rewrite_for_new_code_in_code_paths(old_default, tmp_path):
    """`stateops upgrade --dry-run` in a process of its own: the new processor is the user's
    (the registry's code_paths), which the check imports."""
    registry = _copy(old_default, tmp_path, "unsaferow", **CHANGES["value retyped"][0])
    proc = run_cli("--registry", str(registry), "upgrade", NAME, "--dry-run", check=True)
    plan = json.loads(proc.stdout.strip().splitlines()[-1])
    assert plan["rewrite"], proc.stderr
    assert "state 'count': needs a state rewrite" in proc.stderr


def test_the_rewrite_carries_the_state_into_the_new_code(spark, s3, old_default, tmp_path):
    """page_visits (per user, its pages) upgraded to PageCounts (per user and page): the
    rewrite's state is the mapping of the old state, and the new query's output from then on
    equals the new code run from that state on the input the old query had not read."""
    registry = _copy(old_default, tmp_path / "up", "unsaferow", **PER_PAGE)
    landing = tmp_path / "up" / "landing" / NAME
    old_pages = _state(spark, load_registry(registry).query(NAME).checkpoint, "pages")
    target = query_target(registry, NAME)
    plan = plan_upgrade(target, run_id="upgrade-test")
    # Spark would start it, dropping pages and count: the registry's mapping keeps them.
    dropped = [c["what"] for c in plan["changes"] if "Spark drops its state" in c["detail"]]
    assert plan["rewrite"] and dropped == ["state 'count'", "state 'pages'"], plan["changes"]
    log: list[str] = []
    backup = backup_first(target, s3.client(), "upgrade", log=log.append)
    run_upgrade(target, plan, backup=backup, run_job=job_runner(spark), log=log.append)
    query = load_registry(registry).query(NAME)
    assert query.checkpoint == plan["new"]["checkpoint"], log
    # The rewritten state: views per (user, page) counted from the old pages lists.
    expected: dict[tuple[str, str], int] = {}
    for row in old_pages:
        key = (row["key"]["user_id"], row["list_element"]["page"])
        expected[key] = expected.get(key, 0) + 1
    actual = {
        (r["key"]["user_id"], r["key"]["page"]): r["value"]["views"]
        for r in _state(spark, query.checkpoint, "views")
    }
    assert actual == expected
    # From then on: one more file, read by the new code only (batch 0 took the old positions).
    land(tmp_path / "up" / "landing", round_=1, files=1)
    run_in_session(spark, registry, NAME)
    output = read_sink(Path(query.sink.path))
    new_rows = [
        r
        for b, rows in output.items()
        if b >= plan["old"]["last_committed_batch"] + 1
        for r in rows
    ]
    newest = sorted(landing.iterdir())[-1]
    events = [json.loads(line) for line in newest.read_text().splitlines() if line.strip()]
    reference: dict[tuple[str, str], int] = dict(expected)
    for e in events:
        reference[(e["user_id"], e["page"])] = reference.get((e["user_id"], e["page"]), 0) + 1
    touched = {(e["user_id"], e["page"]) for e in events}
    assert sorted(r for r in new_rows if (r[0], r[1]) in touched) == sorted(
        (u, p, reference[(u, p)]) for u, p in touched
    )


def test_a_failed_upgrade_rolls_back_and_the_old_code_runs_on(
    spark, s3, old_default, tmp_path, monkeypatch
):
    """A failure after the rewrite (its job also runs the new code's first batches) and after
    the proof: the query is back on its checkpoint, byte for byte as it was, the new one moved
    aside, nothing held; then the old code restarts on it and reads the next file."""
    root = tmp_path / "up"
    registry = _copy(old_default, root, "unsaferow", **PER_PAGE)
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
    old_code = _registry(root, "unsaferow")
    land(root / "landing", round_=1, files=1)
    summary = run_in_session(spark, old_code, NAME)
    assert summary["status"] == "succeeded"
    assert load_checkpoint(checkpoint).last_committed_batch == last + 1
