"""`airflow dags test stream_start` end to end: SQLite, local Spark through spark-submit."""

from __future__ import annotations

import atexit
import json
import os
import re
import shutil
import subprocess
import tempfile
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml

from stateops.control.audit import read_audit
from stateops.core.checkpoint import load_checkpoint
from stateops.core.registry import load_registry
from stateops.ops.backup import list_backups
from tests.conftest import (
    ROOT,
    S3_KEY,
    S3_SECRET,
    run_cli,
    tree_digest,
    whole_after,
    write_registry,
)
from tests.spark.harness import land, read_sink, read_state, run_in_session
from tests.spark.test_kafka_queries import kafka_source, visits

OUTPUT_COLUMNS = ["user_id", "visits", "last_page", "distinct_pages"]
READS = [{"stateVarName": "pages"}, {"stateVarName": "count"}]

pytestmark = pytest.mark.dag


_MIGRATED: list[Path] = []  # this process's template of a migrated Airflow database


def _migrated_db() -> Path:
    """``airflow db migrate`` once per test process (about 15 s); each test's AIRFLOW_HOME gets a
    copy of the database file (it holds no paths: airflow.cfg, which does, is written anew)."""
    if not _MIGRATED:
        home = Path(tempfile.mkdtemp(prefix="stateops-airflow-template-"))
        atexit.register(shutil.rmtree, home, True)  # this test process's: gone with it
        env = {**os.environ, "AIRFLOW_HOME": str(home)}
        migrate = subprocess.run(
            ["bash", "-c", "source scripts/env.sh && exec airflow db migrate"],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert migrate.returncode == 0, f"airflow db migrate failed:\n{migrate.stderr[-3000:]}"
        _MIGRATED.append(home / "airflow.db")
    return _MIGRATED[0]


def _airflow(
    tmp_path, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    """``airflow ARGS`` with AIRFLOW_HOME under ``tmp_path``, its database already migrated."""
    home = tmp_path / "airflow"
    if not (home / "airflow.db").exists():
        home.mkdir(parents=True, exist_ok=True)
        shutil.copy(_migrated_db(), home / "airflow.db")
    env = {
        **os.environ,
        "AIRFLOW_HOME": str(home),
        "STATEOPS_REGISTRY": str(tmp_path / "registry.yaml"),
        "STATEOPS_DATA_DIR": str(tmp_path),
        **(env or {}),
    }
    return subprocess.run(
        ["bash", "-c", 'source scripts/env.sh && exec airflow "$@"', "airflow", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


def _failed_tasks(log: str) -> set[str]:
    """The tasks of an ``airflow dags test`` log whose state became failed."""
    parts = re.split(r"\[DAG TEST\] starting task_id=(\w+)", log)
    tasks = zip(parts[1::2], parts[2::2], strict=True)
    return {task for task, said in tasks if "new_state=failed" in said}


# The gate runs a processor on files and one on a topic; the whole proof every registered
# query, the transforms among them.
EVERY_QUERY = ["user_sessions", "page_visits", "page_counts", "idle_sessions", "kafka_visits"]


@pytest.mark.parametrize(
    "queries",
    whole_after(1, [["page_visits", "kafka_visits"], EVERY_QUERY], ids=["files-and-kafka", "all"]),
)
def test_airflow_dags_test_stream_start_runs_every_registered_query(kafka, tmp_path, queries):
    """The processors and the transforms (an aggregation on the HDFS store, group state), and
    a processor reading a topic (the operator hands Spark its Kafka connector); an entry the
    registry refuses (a typo) fails its own task in one line, and stops no other query."""
    topic = kafka.create_topic(f"dag-start-visits-{len(queries)}", partitions=2)
    kafka.produce(topic, visits(80))
    path = write_registry(tmp_path, with_kafka=True, kafka_visits={"source": kafka_source(topic)})
    raw = yaml.safe_load(path.read_text())
    typo = {**raw["queries"]["page_visits"], "trigger": {"processing_time": "ten seconds"}}
    raw["queries"] = {n: q for n, q in raw["queries"].items() if n in queries}
    raw["queries"]["typo_visits"] = {**typo, "checkpoint": "checkpoints/typo_visits"}
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    registry = load_registry(path)
    assert set(registry.invalid) == {"typo_visits"}
    land(tmp_path / "landing", round_=0, files=2)
    run = _airflow(tmp_path, "dags", "test", "stream_start")
    log = run.stdout + run.stderr
    assert _failed_tasks(log) == {"run_typo_visits"}, log[-5000:]
    assert registry.invalid["typo_visits"] in log, log[-5000:]
    assert not (tmp_path / "checkpoints" / "typo_visits").exists()
    assert set(registry.queries) == set(queries)
    for name in registry.queries:
        summary = json.loads(registry.run_summary_path(name).read_text())
        assert summary["status"] == "succeeded"
        assert summary["run_id"].startswith("manual__")
        assert summary["input_rows"] == 80
        assert (
            summary["last_committed_batch"]
            == load_checkpoint(registry.query(name).checkpoint).last_committed_batch
        )
        assert f"{name}: succeeded" in log


@pytest.mark.whole
def test_airflow_dags_test_stream_bootstrap_dry_run_then_real(tmp_path):
    registry = load_registry(write_registry(tmp_path))
    land(tmp_path / "landing", round_=0, files=1)
    initial = tmp_path / "initial.json"
    initial.write_text(
        json.dumps({"user_id": "u90001", "page": "help", "visited_at": "2025-12-29T08:00:00Z"})
        + "\n"
    )
    conf = {"query": "page_visits", "initial_state": str(initial), "dry_run": True}
    dry = _airflow(tmp_path, "dags", "test", "stream_bootstrap", "--conf", json.dumps(conf))
    log = dry.stdout + dry.stderr
    assert dry.returncode == 0, log[-5000:]
    assert "DRY RUN: nothing changed: bootstrap of page_visits" in log
    checkpoint = registry.query("page_visits").checkpoint
    assert not os.path.exists(checkpoint), "a dry run must not start anything"

    real = _airflow(
        tmp_path,
        "dags",
        "test",
        "stream_bootstrap",
        "--conf",
        json.dumps({**conf, "dry_run": False}),
    )
    log = real.stdout + real.stderr
    assert real.returncode == 0, log[-5000:]
    summary = json.loads(registry.run_summary_path("page_visits").read_text())
    assert summary["operation"] == "bootstrap" and summary["bootstrap"] == "complete"
    assert summary["prepared"]["rows"] == 1 and summary["run_id"].startswith("manual__")
    assert "page_visits: bootstrap complete, 1 initial rows" in log
    assert "OK: " in log and "0 errors" in log  # verify_state ran on the new checkpoint
    assert "OK: state of page_visits after batch 0; Data Docs: " in log  # validate_state ran


def test_airflow_dags_test_stream_checkpoint_backup_against_the_embedded_s3(spark, tmp_path, s3):
    path = write_registry(tmp_path)
    raw = yaml.safe_load(path.read_text())
    raw["backups"] = {"url": "s3://backups/dagtest", "conn_id": "aws_default", "keep_last": 2}
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    registry = load_registry(path)
    land(tmp_path / "landing", round_=0, files=1)
    run_in_session(spark, path, "page_visits")  # user_sessions never ran: skipped
    conn = {
        "conn_type": "aws",
        "login": S3_KEY,
        "password": S3_SECRET,
        "extra": {"endpoint_url": s3.endpoint},
    }
    env = {"AIRFLOW_CONN_AWS_DEFAULT": json.dumps(conn)}
    run = _airflow(tmp_path, "dags", "test", "stream_checkpoint_backup", env=env)
    log = run.stdout + run.stderr
    assert run.returncode == 0, log[-5000:]
    backups = list_backups("s3://backups/dagtest/page_visits", s3.client())
    last = load_checkpoint(registry.query("page_visits").checkpoint).last_committed_batch
    assert [b["batch_id"] for b in backups] == [last]
    assert "has no committed batch yet" in log  # user_sessions
    # The last task lists every query: the backup taken, or why it was skipped.
    assert f"page_visits: backup {backups[0]['backup_id']} of batch {last}" in log, log[-3000:]
    assert "user_sessions: skipped, no committed batch yet (stream_start runs it)" in log
    assert "uploaded" in log and "reused" in log and S3_SECRET not in log
    # ... stream_restore_drill restores it into a scratch place and Spark reads its state
    # (the export job on the plan its restore task handed over); the others have no backup.
    run = _airflow(tmp_path, "dags", "test", "stream_restore_drill", env=env)
    log = run.stdout + run.stderr
    assert run.returncode == 0, log[-5000:]
    [drilled] = list_backups("s3://backups/dagtest/page_visits", s3.client())
    assert drilled["drill"]["ok"], drilled
    assert f"drill of backup {drilled['backup_id']}: passed; its state read: operator 0 " in log
    assert "user_sessions: no backup yet: nothing to drill" in log
    assert not list(tmp_path.glob("checkpoints/*.drill-*")), "the scratch place is removed"
    # ... and stream_restore brings it back, into a new folder.
    target = tmp_path / "restored"
    conf = {"query": "page_visits", "target": str(target), "dry_run": False}
    run = _airflow(tmp_path, "dags", "test", "stream_restore", "--conf", json.dumps(conf), env=env)
    assert run.returncode == 0, (run.stdout + run.stderr)[-5000:]
    assert load_checkpoint(target).last_committed_batch == last
    assert f"PLAN: restore of backup {backups[0]['backup_id']} into " in run.stdout + run.stderr
    # `stateops restore --backup latest` into the same folder gives the same bytes.
    by_dag = target.with_name("restored-by-dag")
    target.rename(by_dag)
    cli = run_cli(
        "--registry",
        str(path),
        "restore",
        "page_visits",
        "--backup",
        "latest",
        "--to",
        str(target),
        "--conn-id",
        "aws_default",
        env=env,
    )
    assert cli.returncode == 0, cli.stderr
    assert json.loads(cli.stdout)["backup_id"] == backups[0]["backup_id"]
    assert tree_digest(target) == tree_digest(by_dag)
    # ... and stream_repartition moves its state from 2 to 3 partitions, backing up first.
    conf = {"query": "page_visits", "partitions": 3, "dry_run": False}
    run = _airflow(
        tmp_path, "dags", "test", "stream_repartition", "--conf", json.dumps(conf), env=env
    )
    assert run.returncode == 0, (run.stdout + run.stderr)[-5000:]
    cp = load_checkpoint(registry.query("page_visits").checkpoint)
    assert cp.last_committed_batch == last + 1 and cp.partitions(last + 1) == 3
    assert load_registry(path).query("page_visits").shuffle_partitions == 3
    assert len(list_backups("s3://backups/dagtest/page_visits", s3.client())) == 2
    assert "state partitions 2 -> 3" in run.stdout + run.stderr


def test_airflow_dags_test_stream_snapshot_cleanup(spark, tmp_path):
    path = write_registry(tmp_path)
    raw = yaml.safe_load(path.read_text())
    raw["cleanup"] = {"retain_batches": 2}
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    registry = load_registry(path)
    land(tmp_path / "landing", round_=0, files=5)
    run_in_session(spark, path, "page_visits")  # user_sessions never ran: skipped
    checkpoint = registry.query("page_visits").checkpoint
    before = load_checkpoint(checkpoint)
    run = _airflow(tmp_path, "dags", "test", "stream_snapshot_cleanup")
    log = run.stdout + run.stderr
    assert run.returncode == 0, log[-5000:]
    after = load_checkpoint(checkpoint)
    assert len(after.sizes) < len(before.sizes)
    assert sorted(after.commits) == sorted(before.commits)[-2:]
    assert "PLAN: cleanup of " in log and "snapshot groups" in log  # the plan, then the result
    assert "has no committed batch yet" in log  # user_sessions
    # The last task lists every query: what was deleted, or why it was skipped.
    deleted = len(before.sizes) - len(after.sizes)
    assert f"page_visits: deleted {deleted} files (" in log, log[-3000:]
    assert "user_sessions: skipped, no committed batch yet (stream_start runs it)" in log
    assert read_audit(checkpoint)[-1]["operation"] == "cleanup"


def test_airflow_dags_test_stream_backfill_with_changed_logic(spark, tmp_path, s3):
    """Dry run changes nothing; then roll back to the input before a time, reprocess with a
    smaller max_pages, and report what changed."""
    _dag_backfill(spark, tmp_path, s3)


@pytest.mark.whole  # the CLI's backfill alone: tests/spark/test_backfill_run.py
def test_stateops_backfill_gives_the_state_output_and_report_of_the_dags(spark, tmp_path, s3):
    """The same backfill through `stateops backfill`, on the same events in another folder:
    the same state, output and report as the stream_backfill DAG's."""
    query, new_rows, log = _dag_backfill(spark, tmp_path, s3)
    overrides = {"processor": {"options": {"max_pages": 2}}}
    cli_path = write_registry(tmp_path / "cli")
    raw = yaml.safe_load(cli_path.read_text())
    raw["backups"] = {"url": "s3://backups/backfill-cli", "conn_id": "aws_default"}
    cli_path.write_text(yaml.safe_dump(raw, sort_keys=False))
    cli_query = load_registry(cli_path).query("page_visits")
    land(tmp_path / "cli" / "landing", round_=0, files=5)
    run_in_session(spark, cli_path, "page_visits")
    cutoff = load_checkpoint(cli_query.checkpoint).input_files(2)[0]["timestamp"] / 1000
    cli_when = datetime.fromtimestamp(cutoff, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    args = ["--input-before", cli_when, "--overrides", json.dumps(overrides)]
    cli = run_cli(
        "--registry", str(cli_path), "backfill", "page_visits", *args, env=s3.env(), timeout=600
    )
    cli_log = cli.stdout + cli.stderr
    assert cli.returncode == 0, cli_log[-5000:]
    assert f"the last batch whose input is older than {cli_when}: 1" in cli_log
    assert read_sink(Path(cli_query.sink.path)) == new_rows
    assert read_state(spark, cli_query.checkpoint, READS) == read_state(
        spark, query.checkpoint, READS
    )
    report = re.search(r"batches .* keys changed", log)
    assert report and report.group(0) in cli_log, cli_log[-3000:]
    assert "OK: state of page_visits" in cli_log and S3_SECRET not in cli_log


def _dag_backfill(spark, tmp_path: Path, s3) -> tuple[Any, dict, str]:
    """stream_backfill of page_visits with a smaller max_pages, a dry run first: (the query,
    its output after, the run's log)."""
    path = write_registry(tmp_path)
    raw = yaml.safe_load(path.read_text())
    raw["backups"] = {"url": "s3://backups/backfill", "conn_id": "aws_default"}
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    registry = load_registry(path)
    query = registry.query("page_visits")
    land(tmp_path / "landing", round_=0, files=5)
    run_in_session(spark, path, "page_visits")
    before = load_checkpoint(query.checkpoint)
    assert before.last_committed_batch == 4  # one landing file per batch
    sink = Path(query.sink.path)
    conn = {
        "conn_type": "aws",
        "login": S3_KEY,
        "password": S3_SECRET,
        "extra": {"endpoint_url": s3.endpoint},
    }
    env = {"AIRFLOW_CONN_AWS_DEFAULT": json.dumps(conn)}
    overrides = {"processor": {"options": {"max_pages": 2}}}

    untouched = tree_digest(tmp_path)
    conf = {"query": "page_visits", "to_batch": 1, "overrides": overrides}  # dry run: default
    dry = _airflow(tmp_path, "dags", "test", "stream_backfill", "--conf", json.dumps(conf), env=env)
    log = dry.stdout + dry.stderr
    assert dry.returncode == 0, log[-5000:]
    assert "would delete" in log and "then: reprocess page_visits after batch 1" in log
    changed = {p for p, d in tree_digest(tmp_path).items() if untouched.get(p) != d}
    assert all(p.startswith(("airflow/", "_stateops/backfill/")) for p in changed), changed
    assert list_backups("s3://backups/backfill/page_visits", s3.client()) == []

    # Batch 2 read the first file modified at this time: batch 1 is the rollback point.
    cutoff = before.input_files(2)[0]["timestamp"] / 1000
    when = datetime.fromtimestamp(cutoff, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    old_rows = read_sink(sink)
    conf = {"query": "page_visits", "input_before": when, "overrides": overrides, "dry_run": False}
    run = _airflow(tmp_path, "dags", "test", "stream_backfill", "--conf", json.dumps(conf), env=env)
    log = run.stdout + run.stderr
    assert run.returncode == 0, log[-5000:]
    assert f"the last batch whose input is older than {when}: 1" in log

    backups = list_backups("s3://backups/backfill/page_visits", s3.client())
    assert [b["batch_id"] for b in backups] == [4]  # taken before the rollback
    rollback = next(r for r in read_audit(query.checkpoint) if r["operation"] == "rollback")
    assert rollback["backup_id"] == backups[0]["backup_id"]
    assert (rollback["batch_before"], rollback["batch_after"]) == (4, 1)
    aside = sink / "_rolled_back" / rollback["run_id"]
    assert read_sink(aside) == {b: old_rows[b] for b in (2, 3, 4)}  # the old output, kept

    after = load_checkpoint(query.checkpoint)
    assert after.last_committed_batch == 4 and after.query_id == before.query_id
    new_rows = read_sink(sink)
    assert {b: new_rows[b] for b in (0, 1)} == {b: old_rows[b] for b in (0, 1)}
    distinct = OUTPUT_COLUMNS.index("distinct_pages")
    reprocessed = [r for b in (2, 3, 4) for r in new_rows[b]]
    assert reprocessed and max(r[distinct] for r in reprocessed) <= 2  # the new logic
    assert max(r[distinct] for b in (2, 3, 4) for r in old_rows[b]) > 2  # ... which differs
    m = re.search(r"(\d+) rows before, (\d+) after; .* (\d+) keys changed", log)
    assert m, log[-3000:]
    assert int(m.group(1)) == sum(len(old_rows[b]) for b in (2, 3, 4))
    assert int(m.group(2)) == len(reprocessed) and int(m.group(3)) > 0
    assert "validate_state" in log and S3_SECRET not in log

    return query, new_rows, log
