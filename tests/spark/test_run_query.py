"""stateops/jobs/run_query.py through spark-submit: summaries, pipeline semantics, lock, stop."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from stateops.control.lock import QueryLock, read_lock
from stateops.core.checkpoint import load_checkpoint
from stateops.core.registry import load_registry
from stateops.spark.jobs import job_path
from tests.conftest import (
    ROOT,
    log_trouble,
    run_cli,
    run_query_command,
    spark_submit_run_query,
    tree_digest,
    write_registry,
)
from tests.spark.harness import land, read_sink

pytestmark = pytest.mark.spark

EVENTS_PER_FILE = 40  # harness.land()


def slow_first_driver_worker(folder: Path) -> str:
    """A Python for Spark whose first start of the driver-side worker of a transformWithState
    query takes 12 s: past Spark's fixed 10 s to connect back, as on a machine too busy to
    start it in time."""
    python = folder / "python"
    python.write_text(
        "#!/bin/sh\n"
        'case "$*" in *transform_with_state_driver_worker*)\n'
        f'  mkdir "{folder / "delayed"}" 2>/dev/null && sleep 12;;\n'
        "esac\n"
        f'exec "{os.environ.get("PYSPARK_PYTHON", sys.executable)}" "$@"\n'
    )
    python.chmod(0o755)
    return str(python)


@pytest.fixture(scope="module")
def ran(tmp_path_factory):
    """Both reference pipelines run once with available-now on three landed files; page_visits'
    first start of its driver-side Python worker too slow for Spark (the run restarts it)."""
    root = tmp_path_factory.mktemp("run_query")
    processor = yaml.safe_load((ROOT / "registry.yaml").read_text())["queries"]["user_sessions"][
        "processor"
    ]
    # A 10-minute timeout: sessions close both ways (is_last and the timer) in three files.
    # State store maintenance every 50 ms: a run's end meets it running (the log's test).
    registry = write_registry(
        root,
        user_sessions={
            "processor": {**processor, "options": {"session_timeout_seconds": 600}},
            "spark_conf": {"spark.sql.streaming.stateStore.maintenanceInterval": "50ms"},
        },
    )
    land(root / "landing", round_=0, files=3)
    results, stderr = {}, {}
    slow = slow_first_driver_worker(root)
    for name in ("user_sessions", "page_visits"):
        with pytest.MonkeyPatch.context() as mp:
            if name == "page_visits":
                mp.setenv("PYSPARK_PYTHON", slow)
            proc = spark_submit_run_query(
                registry, name, "--mode", "available-now", "--run-id", f"t-{name}"
            )
        assert proc.returncode == 0, proc.stderr[-3000:]
        results[name] = json.loads(proc.stdout.strip().splitlines()[-1])
        stderr[name] = proc.stdout + proc.stderr
    return root, load_registry(registry), results, stderr


@pytest.mark.parametrize("name", ["user_sessions", "page_visits"])
def test_summary_counts_batches_rows_and_state(ran, name):
    root, registry, results, _ = ran
    summary = results[name]
    assert summary["status"] == "succeeded" and summary["run_id"] == f"t-{name}"
    assert summary["input_rows"] == 3 * EVENTS_PER_FILE
    assert summary["last_committed_batch_before"] is None
    committed = load_checkpoint(registry.query(name).checkpoint).last_committed_batch
    assert summary["last_committed_batch"] == committed == summary["last_batch_id"]
    assert summary["first_batch_id"] == 0 and summary["batches_run"] >= 3
    assert summary["state_operators"][0]["state_rows"] > 0
    on_disk = json.loads(registry.run_summary_path(name).read_text())
    assert on_disk == summary
    audit = run_cli("--registry", str(registry.path), "audit", name, "--json", check=True)
    record = json.loads(audit.stdout.splitlines()[-1])
    assert (record["operation"], record["run_id"], record["batch_after"]) == (
        "run",
        f"t-{name}",
        committed,
    )
    assert read_lock(registry.lock_path(name)) is None, "the lock must be released"


def _landed(root: Path, name: str) -> list[dict]:
    return [
        json.loads(line)
        for p in sorted((root / "landing" / name).glob("*.json"))
        for line in p.read_text().splitlines()
    ]


def test_a_python_worker_too_slow_for_spark_once_restarts_the_query_and_loses_nothing(ran):
    """Spark's fixed 10 s for a Python worker it starts itself failed batches on a busy
    machine: the run restarts the query once, and its summary and state (the tests around
    this one) are those of a run without the failure."""
    root, _, results, stderr = ran
    assert (root / "delayed").exists(), "the driver worker was never started slowly"
    assert (
        "page_visits: Python worker failed to connect back. (Spark gives a Python worker it "
        "starts itself a fixed 10 s to connect back; a busy machine can miss it): restarting "
        "the query once"
    ) in stderr["page_visits"], stderr["page_visits"][-3000:]
    assert results["page_visits"]["status"] == "succeeded"
    assert "restarting the query" not in stderr["user_sessions"]


def test_a_successful_run_ends_without_errors_in_its_log(ran):
    """The state stores' maintenance (every 50 ms here) used to race with the end of the
    driver: "SparkEnv not active, cannot do maintenance on StateStores", RocksDB's MANIFEST
    errors, on runs that succeeded."""
    _, _, results, stderr = ran
    assert results["user_sessions"]["status"] == "succeeded"
    assert log_trouble(stderr["user_sessions"]) == [], stderr["user_sessions"][-3000:]


def test_user_sessions_keep_no_expired_session_and_lose_no_event(ran, spark):
    root, registry, _, _ = ran
    query = registry.query("user_sessions")
    cp = load_checkpoint(query.checkpoint)
    watermark_ms = cp.commits[cp.last_committed_batch]["nextBatchWatermarkMs"]
    timeout_ms = query.processor.options["session_timeout_seconds"] * 1000
    open_events = (
        spark.read.format("statestore").option("stateVarName", "events").load(query.checkpoint)
    )
    per_user = {}
    for row in open_events.collect():
        ms = int(row.list_element.event_time.timestamp() * 1000)
        per_user[row.key.user_id] = max(per_user.get(row.key.user_id, 0), ms)
    assert per_user, "some sessions should still be open"
    expired = [u for u, last in per_user.items() if last + timeout_ms <= watermark_ms]
    assert expired == [], f"expired sessions left in state: {expired}"
    out = [row for rows in read_sink(Path(query.sink.path)).values() for row in rows]
    assert {r[5] for r in out} == {"last", "timeout"}
    emitted = sum(r[3] for r in out)
    in_state = open_events.count()
    assert emitted + in_state == len(_landed(root, "user_sessions"))


def test_page_visits_count_every_visit_per_user(ran, spark):
    root, registry, _, _ = ran
    ckpt = registry.query("page_visits").checkpoint
    counts = {
        r.key.user_id: r.value.visits
        for r in spark.read.format("statestore")
        .option("stateVarName", "count")
        .load(ckpt)
        .collect()
    }
    expected: dict[str, int] = {}
    for event in _landed(root, "page_visits"):
        expected[event["user_id"]] = expected.get(event["user_id"], 0) + 1
    assert counts == expected
    pages = spark.read.format("statestore").option("stateVarName", "pages").load(ckpt).count()
    assert pages == sum(expected.values())


def test_a_held_lock_refuses_the_run_and_changes_nothing(ran):
    root, registry, _, _ = ran
    ckpt = Path(registry.query("page_visits").checkpoint)
    before = tree_digest(ckpt)
    with QueryLock(registry.lock_path("page_visits"), "page_visits", "cleanup", run_id="c-1"):
        proc = run_cli("--registry", str(registry.path), "run", "page_visits")  # spark-submit
    # spark-submit passes the Python driver's stderr through on its stdout.
    output = proc.stdout + proc.stderr
    assert proc.returncode == 2
    assert "locked by cleanup (run c-1" in output
    assert "Traceback" not in output
    assert tree_digest(ckpt) == before


def test_inspect_by_path_uses_the_registered_snapshot_interval(ran):
    _, registry, _, _ = ran
    path = registry.query("page_visits").checkpoint
    by_name = run_cli(
        "--registry", str(registry.path), "inspect", "page_visits", "--json", check=True
    )
    by_path = run_cli("--registry", str(registry.path), "inspect", path, "--json", check=True)
    assert by_name.stdout == by_path.stdout
    groups = json.loads(by_path.stdout)["operators"][0]["snapshot_groups"]
    assert all(g["group_id"] == v // 2 for g in groups for v in g["snapshot_versions"])


def _one_line_error(proc: subprocess.CompletedProcess, needle: str) -> None:
    output = proc.stdout + proc.stderr  # spark-submit passes the driver's stderr on stdout
    assert proc.returncode == 2, output[-3000:]
    assert "Traceback" not in output
    errors = [line for line in output.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and needle in errors[0], output[-3000:]


def test_bad_processor_options_and_a_missing_source_are_one_line_errors(tmp_path):
    processor = yaml.safe_load((ROOT / "registry.yaml").read_text())["queries"]["page_visits"][
        "processor"
    ]
    # Options the processor does not take: refused by the job's preflight, before Spark reads
    # anything (the source is not there yet either).
    registry = write_registry(
        tmp_path, page_visits={"processor": {**processor, "options": {"max_pagez": 3}}}
    )
    _one_line_error(spark_submit_run_query(registry, "page_visits"), "processor.options")
    registry = write_registry(tmp_path)
    _one_line_error(spark_submit_run_query(registry, "page_visits"), "Path does not exist")
    assert not (tmp_path / "checkpoints" / "page_visits").exists()


def test_a_failing_query_still_writes_a_failed_summary_and_audit_record(tmp_path):
    (tmp_path / "not-a-folder").write_text("the sink cannot write under a file")
    registry = write_registry(
        tmp_path, page_visits={"sink": {"format": "parquet", "path": "not-a-folder"}}
    )
    land(tmp_path / "landing", round_=0, files=1)
    proc = spark_submit_run_query(registry, "page_visits", "--run-id", "doomed")
    assert proc.returncode == 1, (proc.stdout + proc.stderr)[-3000:]
    summary = json.loads(load_registry(registry).run_summary_path("page_visits").read_text())
    assert summary["status"] == "failed" and summary["error"]
    assert summary["last_committed_batch"] is None and summary["uncommitted_batches"] == [0]
    audit = run_cli("--registry", str(registry), "audit", "page_visits", "--json", check=True)
    assert json.loads(audit.stdout.splitlines()[-1])["result"] == "failed"
    assert read_lock(load_registry(registry).lock_path("page_visits")) is None


def test_unknown_query_is_one_line_exit_2(ran):
    _, registry, _, _ = ran
    proc = subprocess.run(
        [
            sys.executable,
            str(job_path("run_query.py")),
            "--registry",
            str(registry.path),
            "--query",
            "nope",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0 and "no query named 'nope'" in proc.stderr
    proc = run_cli("--registry", str(registry.path), "run", "nope")
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0 and "no query named 'nope'" in proc.stderr


def test_continuous_mode_stops_after_the_current_batch_on_a_stop_marker(tmp_path):
    registry = write_registry(tmp_path, page_visits={"trigger": {"processing_time": "1 second"}})
    land(tmp_path / "landing", round_=0, files=1)
    ckpt = Path(load_registry(registry).query("page_visits").checkpoint)
    cmd = run_query_command(registry, "page_visits", "--mode", "continuous", "--run-id", "cont-1")
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:

        def committed() -> int | None:
            try:
                return load_checkpoint(ckpt).last_committed_batch
            except Exception:
                return None

        deadline = time.time() + 120
        while committed() is None and time.time() < deadline:
            time.sleep(1)
        assert committed() == 0, "the first batch did not commit"
        land(tmp_path / "landing", round_=1, files=1)
        while committed() != 1 and time.time() < deadline:
            time.sleep(1)
        assert committed() == 1, "the query did not pick up new input while running"
        assert proc.poll() is None, "continuous mode must keep running until asked to stop"
        run_cli("--registry", str(registry), "stop", "page_visits", check=True)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err[-3000:]
    summary = json.loads(out.strip().splitlines()[-1])
    assert summary["stopped_by_marker"] is True and summary["mode"] == "continuous"
    assert summary["last_committed_batch"] == 1 and summary["input_rows"] == 2 * EVENTS_PER_FILE
    cp = load_checkpoint(ckpt)
    assert cp.uncommitted_batches == [], "a graceful stop leaves no planned-but-uncommitted batch"
    assert not load_registry(registry).stop_marker("page_visits").exists()
