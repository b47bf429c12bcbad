"""Bootstrap: through spark-submit, its refusals, validation, equality and the transplant; the job's
``main`` in the shared session where the subject is the state it leaves (pending until batch 0,
from a state export, the proof). The old query the carry-overs start from is built once
(:func:`old`); each test takes a copy of its checkpoint."""

from __future__ import annotations

import json
import signal
import subprocess
from collections import Counter
from pathlib import Path

import pytest
import yaml

from stateops.control.audit import read_audit
from stateops.control.markers import carry_over_marker, read_repartition
from stateops.core.checkpoint import load_checkpoint
from stateops.core.registry import load_registry
from stateops.core.verify import verify_checkpoint
from stateops.spark.initial_state import read_initial_state
from stateops.spark.proof import prove_first_batch
from tests.conftest import (
    ROOT,
    job_command,
    run_cli,
    spark_job,
    tree_digest,
    write_registry,
)
from tests.spark.harness import (
    copy_checkpoint,
    job_in_session,
    kill_when,
    land,
    run_in_session,
    summary_of,
)

pytestmark = pytest.mark.spark

INITIAL = [  # previously visited pages; u90001 never appears in the sample events
    {"user_id": "u00001", "page": "home", "visited_at": "2025-12-31T10:00:00Z"},
    {"user_id": "u00001", "page": "cart", "visited_at": "2025-12-31T11:00:00Z"},
    {"user_id": "u00002", "page": "blog", "visited_at": "2025-12-30T09:00:00Z"},
    {"user_id": "u90001", "page": "help", "visited_at": "2025-12-29T08:00:00Z"},
]


def _write_json(path: Path, rows: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _bootstrap(registry: Path, initial: Path, *extra: str):
    proc = spark_job(
        "bootstrap_state.py",
        "--registry",
        str(registry),
        "--query",
        "page_visits",
        "--initial-state",
        str(initial),
        *extra,
    )
    return proc, proc.stdout + proc.stderr  # spark-submit passes the driver's stderr on stdout


def _bootstrap_in_session(spark, registry: Path, initial: Path) -> dict:
    """The bootstrap job's ``main`` in the shared session, for the tests whose subject is the
    state it leaves; its road through spark-submit (exit codes, one-line refusals) is the
    subject of the tests that call :func:`_bootstrap`."""
    return summary_of(
        *job_in_session(
            spark, "bootstrap_state.py", "--registry", str(registry), "--query", "page_visits",
            "--initial-state", str(initial),
        )
    )  # fmt: skip


def _summary(proc) -> dict:
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _counts(spark, checkpoint: str) -> dict[str, int]:
    df = spark.read.format("statestore").option("stateVarName", "count").load(checkpoint)
    return {r.key.user_id: r.value.visits for r in df.collect()}


def _landed(root: Path) -> Counter:
    return Counter(
        json.loads(line)["user_id"]
        for p in (root / "landing" / "page_visits").glob("*.json")
        for line in p.read_text().splitlines()
    )


@pytest.fixture(scope="module")
def old(spark, tmp_path_factory) -> Path:
    """The folder of an old page_visits query on 2 state partitions, run over round 0 (2
    files): its registry's data_dir, landing beside it. Read only: tests copy its checkpoint
    (:func:`old_checkpoint`)."""
    root = tmp_path_factory.mktemp("bootstrap-old")
    land(root / "landing", round_=0, files=2)
    run_in_session(spark, write_registry(root), "page_visits")
    return root


def old_checkpoint(old: Path, tmp_path: Path) -> str:
    """A copy of :func:`old`'s checkpoint of the test's own."""
    source = Path(load_registry(old / "registry.yaml").query("page_visits").checkpoint)
    return str(copy_checkpoint(source, tmp_path / "old-checkpoint"))


def test_bootstrap_equals_initial_state_plus_batch_0(spark, tmp_path):
    registry = write_registry(tmp_path)
    land(tmp_path / "landing", round_=0, files=1)
    initial = _write_json(tmp_path / "initial" / "pages.json", INITIAL)
    summary = _summary(_bootstrap(registry, initial, "--run-id", "boot-1")[0])
    assert summary["operation"] == "bootstrap" and summary["bootstrap"] == "complete"
    assert summary["last_committed_batch"] == 0 and summary["prepared"]["rows"] == len(INITIAL)
    # The job proved the state it left: initial state + batch 0, read back from the checkpoint.
    proof = summary["proof"]
    assert proof["ok"] and proof["sample"] == "all keys"
    assert set(proof["variables"]) == {"pages", "count"}
    reg = load_registry(registry)
    assert not carry_over_marker(reg.query("page_visits").checkpoint).exists()
    expected = Counter(r["user_id"] for r in INITIAL) + _landed(tmp_path)
    assert _counts(spark, reg.query("page_visits").checkpoint) == dict(expected)
    pages = spark.read.format("statestore").option("stateVarName", "pages")
    u1 = [
        r.list_element.page
        for r in pages.load(reg.query("page_visits").checkpoint).collect()
        if r.key.user_id == "u00001"
    ]
    assert u1[:2] == ["home", "cart"], "the initial pages come first, in visit order"
    audit = run_cli("--registry", str(registry), "audit", "page_visits", "--json", check=True)
    record = json.loads(audit.stdout.splitlines()[-1])
    assert (record["operation"], record["bootstrap"], record["run_id"]) == (
        "bootstrap",
        "complete",
        "boot-1",
    )

    # A second bootstrap would be ignored by Spark: refused, the checkpoint byte-identical.
    ckpt = Path(reg.query("page_visits").checkpoint)
    before = tree_digest(ckpt)
    proc, out = _bootstrap(registry, initial)
    assert proc.returncode == 2
    assert "has committed batch 0: Spark would ignore the initial state" in out
    assert "Traceback" not in out and tree_digest(ckpt) == before


@pytest.mark.whole
def test_a_start_on_an_empty_source_keeps_the_bootstrap_pending(spark, tmp_path):
    registry = write_registry(tmp_path)
    (tmp_path / "landing" / "page_visits").mkdir(parents=True)
    initial = _write_json(tmp_path / "initial" / "pages.json", INITIAL)
    summary = _bootstrap_in_session(spark, registry, initial)
    assert summary["bootstrap"] == "pending" and summary["last_committed_batch"] is None
    reg = load_registry(registry)
    assert carry_over_marker(reg.query("page_visits").checkpoint).exists()
    # The scheduled start passes the initial state again, and batch 0 commits it.
    land(tmp_path / "landing", round_=0, files=1)
    start = run_in_session(spark, registry, "page_visits")
    assert start["bootstrap"] == "complete" and start["last_committed_batch"] == 0
    assert not carry_over_marker(reg.query("page_visits").checkpoint).exists()
    expected = Counter(r["user_id"] for r in INITIAL) + _landed(tmp_path)
    assert _counts(spark, reg.query("page_visits").checkpoint) == dict(expected)


def test_null_and_repeated_keys_are_refused_by_name(tmp_path):
    spec = yaml.safe_load((ROOT / "registry.yaml").read_text())["queries"]["page_visits"]
    registry = write_registry(
        tmp_path, page_visits={"initial_state": {**spec["initial_state"], "unique_keys": True}}
    )
    land(tmp_path / "landing", round_=0, files=1)
    bad = _write_json(
        tmp_path / "bad" / "pages.json",
        INITIAL + [{"user_id": None, "page": "home", "visited_at": "2025-12-31T10:00:00Z"}],
    )
    proc, out = _bootstrap(registry, bad)
    assert proc.returncode == 2 and "Traceback" not in out
    error = next(line for line in out.splitlines() if line.startswith("error: "))
    assert "1 rows have a null key (user_id)" in error
    assert "1 keys appear more than once: u00001 (2 rows)" in error
    reg = load_registry(registry)
    assert not Path(reg.query("page_visits").checkpoint).exists()
    assert not carry_over_marker(reg.query("page_visits").checkpoint).exists()


@pytest.mark.whole
def test_bootstrap_from_a_state_export(spark, tmp_path, old):
    old_ckpt = old_checkpoint(old, tmp_path)
    export = tmp_path / "export"
    code, out = job_in_session(
        spark, "export_state.py", "--checkpoint", old_ckpt, "--out", str(export)
    )
    assert code == 0, out
    new = write_registry(tmp_path / "new")
    land(tmp_path / "new" / "landing", round_=1, files=1)
    summary = _bootstrap_in_session(spark, new, export)
    assert summary["bootstrap"] == "complete"
    expected = Counter(_counts(spark, old_ckpt)) + _landed(tmp_path / "new")
    assert _counts(spark, load_registry(new).query("page_visits").checkpoint) == dict(expected)


def test_dry_run_and_queries_without_initial_state(tmp_path):
    registry = write_registry(tmp_path)
    initial = _write_json(tmp_path / "initial" / "pages.json", INITIAL)
    proc = run_cli(
        "--registry",
        str(registry),
        "bootstrap",
        "page_visits",
        "--initial-state",
        str(initial),
        "--dry-run",
        check=True,
    )
    assert "DRY RUN: nothing changed: bootstrap of " in proc.stdout and "(json)" in proc.stdout
    assert not (tmp_path / "checkpoints").exists()
    registry = write_registry(tmp_path / "other", user_sessions={"initial_state": None})
    proc = run_cli(
        "--registry",
        str(registry),
        "bootstrap",
        "user_sessions",
        "--initial-state",
        str(initial),
        "--dry-run",
    )
    assert proc.returncode == 2 and "no initial_state in the registry" in proc.stderr


@pytest.mark.whole
def test_the_proof_finds_state_that_is_not_initial_state_plus_batch_0(spark, tmp_path):
    registry = write_registry(tmp_path)
    land(tmp_path / "landing", round_=0, files=1)
    initial = _write_json(tmp_path / "initial" / "pages.json", INITIAL)
    assert _bootstrap_in_session(spark, registry, initial)["proof"]["ok"]
    query = load_registry(registry).query("page_visits")
    ckpt = Path(query.checkpoint)
    before = tree_digest(ckpt)
    right = read_initial_state(spark, query, str(initial), "json")
    assert prove_first_batch(spark, query, right)["ok"]
    sampled = prove_first_batch(spark, query, right, max_keys=3)
    assert sampled["ok"] and sampled["sample"].startswith("1 in ")

    # Claim a different initial state: the proof names the variables and their row counts.
    wrong = right.filter("user_id != 'u90001'")
    result = prove_first_batch(spark, query, wrong)
    assert not result["ok"]
    by_name = {v["variable"]: v for v in result["variables"]}
    assert by_name["count"]["actual_rows"] == by_name["count"]["expected_rows"] + 1
    assert by_name["pages"]["actual_rows"] == by_name["pages"]["expected_rows"] + 1
    # Same keys, different contents: counts agree, checksums do not.
    shifted = right.selectExpr("user_id", "'elsewhere' AS page", "visited_at")
    result = prove_first_batch(spark, query, shifted)
    pages = next(v for v in result["variables"] if v["variable"] == "pages")
    assert not pages["ok"] and pages["actual_rows"] == pages["expected_rows"]
    assert tree_digest(ckpt) == before, "a proof only reads"


@pytest.mark.whole
def test_the_proof_covers_list_state_and_timers_without_initial_state(spark, tmp_path):
    registry = write_registry(tmp_path)
    land(tmp_path / "landing", round_=0, files=1)
    run_in_session(spark, registry, "user_sessions")
    query = load_registry(registry).query("user_sessions")
    result = prove_first_batch(spark, query, None)
    assert result["ok"], result
    rows = {v["variable"]: v["actual_rows"] for v in result["variables"]}
    assert rows["events"] > 0 and rows["timers"] > 0


@pytest.mark.whole
def test_values_of_the_wrong_type_and_a_processor_misfit_are_refused(tmp_path):
    registry = write_registry(tmp_path)
    land(tmp_path / "landing", round_=0, files=1)
    bad = _write_json(
        tmp_path / "bad" / "pages.json",
        INITIAL + [{"user_id": "u00003", "page": "home", "visited_at": "yesterday"}],
    )
    proc, out = _bootstrap(registry, bad)
    assert proc.returncode == 2 and "Traceback" not in out
    assert (
        "error: initial state refused: column visited_at: 1 values are not TIMESTAMP "
        "(e.g. 'yesterday')" in out
    )
    ckpt = Path(load_registry(registry).query("page_visits").checkpoint)
    assert not ckpt.exists()

    # A processor that stores what its declared state schema does not allow: found in memory,
    # before Spark starts the query.
    spec = yaml.safe_load((ROOT / "registry.yaml").read_text())["queries"]["page_visits"]
    misfit = {**spec["processor"], "class": "tests.spark.leaky:CountAsText"}
    registry = write_registry(tmp_path / "misfit", page_visits={"processor": misfit})
    land(tmp_path / "misfit" / "landing", round_=0, files=1)
    good = _write_json(tmp_path / "initial" / "pages.json", INITIAL)
    proc, out = _bootstrap(registry, good)
    assert proc.returncode == 2 and "Traceback" not in out
    assert "error: initial state refused: it does not fit the processor's state 'count'" in out
    assert not Path(load_registry(registry).query("page_visits").checkpoint).exists()


@pytest.mark.whole
@pytest.mark.parametrize("partitions", [2, 3])
def test_bootstrap_from_a_checkpoint_transplants_it_and_repartitions_where_the_count_changed(
    spark, tmp_path, partitions, old
):
    """Its state files are transplanted; where the query wants 3 partitions and the old state
    has 2, the start has Spark repartition the new checkpoint (batch N + 1) before its first
    batch (N + 2), which is proven against the old state. The counts are the old query's plus
    the new input either way, and the old checkpoint is left as it was. (Where the transplant
    does not apply, the state goes by export: tests/spark/test_initial_state_road.py.)"""
    old_ckpt = old_checkpoint(old, tmp_path)
    before = tree_digest(Path(old_ckpt))
    new = write_registry(tmp_path / "new", page_visits={"shuffle_partitions": partitions})
    land(tmp_path / "new" / "landing", round_=1, files=1)
    proc, output = _bootstrap(new, Path(old_ckpt))
    summary = _summary(proc)
    assert summary["carry_over"] == "transplant", output[-3000:]
    assert summary["bootstrap"] == "complete" and summary["proof"]["ok"], summary["proof"]
    last = load_checkpoint(old_ckpt).last_committed_batch
    cp = load_checkpoint(load_registry(new).query("page_visits").checkpoint)
    if partitions == 2:
        assert summary["repartitioned"] is None and cp.repartition_batches() == {}
        assert summary["proof"]["batches"] == [last + 1]
    else:
        assert summary["repartitioned"]["partitions"] == [2, 3], summary["repartitioned"]
        assert cp.repartition_batches() == {last + 1: (2, 3)}
        assert cp.input_files(last + 1) == [], "the repartition batch reads no input"
        assert summary["proof"]["batches"] == [last + 2], summary["proof"]
        assert f"then Spark's repartition writes batch {last + 1}" in output
    assert cp.partitions(cp.last_committed_batch) == partitions
    assert verify_checkpoint(cp.root)["ok"]
    assert tree_digest(Path(old_ckpt)) == before
    expected = _landed(old) + _landed(tmp_path / "new")
    assert _counts(spark, load_registry(new).query("page_visits").checkpoint) == expected


@pytest.mark.whole  # a fault story
def test_a_start_killed_while_spark_repartitions_the_transplant_repartitions_again(
    spark, tmp_path, old
):
    """kill -9 of the bootstrap job in the middle of Spark's repartition of the transplanted
    state (its offsets written, not its commit): the next start undoes that write, repartitions
    again, runs the first batch and proves it, to the counts of a run never killed."""
    old_ckpt = old_checkpoint(old, tmp_path)
    last = load_checkpoint(old_ckpt).last_committed_batch
    new = write_registry(tmp_path / "new", page_visits={"shuffle_partitions": 3})
    land(tmp_path / "new" / "landing", round_=1, files=1)
    checkpoint = Path(load_registry(new).query("page_visits").checkpoint)
    args = job_command(
        "bootstrap_state.py",
        "--registry",
        str(new),
        "--query",
        "page_visits",
        "--initial-state",
        old_ckpt,
    )
    proc = subprocess.Popen(  # a process group, killed whole, in the session's CPU share
        args, process_group=0, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    kill_when(proc, checkpoint / "offsets" / str(last + 1))
    assert proc.returncode == -signal.SIGKILL
    cp = load_checkpoint(checkpoint)
    assert (cp.last_committed_batch, cp.uncommitted_batches) == (last, [last + 1])
    assert read_repartition(checkpoint) is not None, "killed in the middle of Spark's write"

    summary = run_in_session(spark, new, "page_visits")
    assert summary["status"] == "succeeded" and summary["proof"]["ok"], summary
    assert summary["repartitioned"]["partitions"] == [2, 3]
    assert summary["proof"]["batches"] == [last + 2]
    cp = load_checkpoint(checkpoint)
    assert cp.repartition_batches() == {last + 1: (2, 3)} and read_repartition(checkpoint) is None
    assert verify_checkpoint(checkpoint)["ok"]
    undone = [r for r in read_audit(checkpoint) if r.get("result") == "undone"]
    assert len(undone) == 1, "the killed start's repartition was undone, then done again"
    expected = _landed(old) + _landed(tmp_path / "new")
    assert _counts(spark, str(checkpoint)) == expected
