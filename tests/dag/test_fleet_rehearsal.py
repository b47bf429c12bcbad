"""The DAGs on a fleet, rehearsed (issue 55): every task of an ``airflow dags test`` run gets
its own empty data folder (tests/dag/fleet/airflow_local_settings.py), as under the
KubernetesExecutor, and its Spark job inherits it. The query's input, checkpoint and sink are
where every host sees them, and the registry names an S3 control store (the embedded
SeaweedFS): the lease, the run summary a Spark job hands to the task after it, and a backfill's
registry with its overrides go through it. Without the control store the same run fails where
a task reads what another wrote (the test's control: the rehearsal does separate the tasks).
"""

from __future__ import annotations

import json
import os
import time
import uuid
from concurrent.futures import Future, ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path

import pytest
import yaml

from stateops.control.audit import audit_dir, read_audit
from stateops.control.lock import read_lock
from stateops.core.checkpoint import load_checkpoint
from stateops.core.registry import load_registry
from stateops.core.storage import location
from stateops.ops.backup import list_backups
from tests.conftest import ROOT, S3_KEY, S3_SECRET, write_registry
from tests.dag.test_stream_start_run import OUTPUT_COLUMNS, _airflow, _failed_tasks
from tests.spark.harness import job_in_session, land, read_sink, run_in_session
from tests.spark.migrations import Migration, assert_migrated, uninterrupted
from tests.spark.upgrading import PER_PAGE, run_old_code, with_new_code

pytestmark = [pytest.mark.dag, pytest.mark.whole]
NAME = "page_visits"
REHEARSAL = ROOT / "tests" / "dag" / "fleet"


def _placed(path: Path) -> dict:
    """``NAME``'s entry in registry file ``path`` with its input, checkpoint and sink as
    absolute paths: where every host sees them (a host's own data folder holds none)."""
    query = load_registry(path).query(NAME)
    entry = yaml.safe_load(path.read_text())["queries"][NAME]
    entry["source"]["path"] = query.source.path
    entry["checkpoint"] = query.checkpoint
    entry["sink"]["path"] = query.sink.path
    return entry


def _fleet_registry(tmp_path: Path, control: str | None, backups: str) -> Path:
    """A registry of ``NAME`` alone (:func:`_placed`), with ``control`` (None: none) and
    backups at ``backups``."""
    path = write_registry(tmp_path)
    raw = yaml.safe_load(path.read_text())
    raw["queries"] = {NAME: _placed(path)}
    raw["backups"] = {"url": backups, "conn_id": "aws_default"}
    if control:
        raw["control"] = control
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


def _on_the_fleet(tmp_path: Path, s3a, *args: str, backups: str | None = None):
    """``airflow ARGS`` with each task on its own "host" (a data folder under ``hosts/``),
    the connection aws_default (backups) on endpoint ``backups``, else on ``s3a``."""
    hosts = tmp_path / "hosts"
    hosts.mkdir(exist_ok=True)
    conn = {
        "conn_type": "aws",
        "login": S3_KEY,
        "password": S3_SECRET,
        "extra": {"endpoint_url": backups or s3a.endpoint},
    }
    env = {
        **s3a.env(),
        "AIRFLOW_CONN_AWS_DEFAULT": json.dumps(conn),
        "STATEOPS_FLEET_HOSTS": str(hosts),
        "PYTHONPATH": os.pathsep.join([str(REHEARSAL), os.environ.get("PYTHONPATH", "")]),
    }
    before = set(hosts.iterdir())
    run = _airflow(tmp_path, *args, env=env)
    return run, run.stdout + run.stderr, sorted(set(hosts.iterdir()) - before)


def _running(spark, registry: Path, run_id: str) -> Future:
    """``NAME`` run continuously as ``run_id`` in this process's session (a host of its own),
    once it holds its lease and has committed a batch; its (exit code, output) when it ends."""
    query = load_registry(registry).query(NAME)
    before = load_checkpoint(query.checkpoint).last_committed_batch
    driver = ThreadPoolExecutor(1).submit(
        job_in_session, spark, "run_query.py", "--registry", str(registry), "--query", NAME,
        "--mode", "continuous", "--run-id", run_id, "--poll-seconds", "0.5",
    )  # fmt: skip
    deadline = time.monotonic() + 120
    while not driver.done() and time.monotonic() < deadline:
        held = read_lock(load_registry(registry).lock_path(NAME))
        if held and held.run_id == run_id:
            if load_checkpoint(query.checkpoint).last_committed_batch != before:
                return driver
        time.sleep(0.5)
    raise AssertionError(f"{run_id} did not start: {driver.result() if driver.done() else ''}")


def _local_records(hosts: list[Path]) -> list[str]:
    """What the hosts kept of the lifecycle's records in their own folders (none should:
    another host could not read them)."""
    kept = ("runs", "switch", "locks", "control", "backfill", "bootstrap", "migration", "upgrade")
    return [str(p) for h in hosts for k in kept for p in (h / "_stateops" / k).glob("**/*")]


def test_stream_start_and_a_backfill_with_overrides_run_with_every_task_on_its_own_host(
    spark, s3a_env, tmp_path
):
    s3a = s3a_env  # this process reads the control store too
    control = s3a.url(f"fleet-{uuid.uuid4().hex[:8]}")
    path = _fleet_registry(tmp_path, control, s3a.url(f"backups-{uuid.uuid4().hex[:8]}"))
    land(tmp_path / "landing", round_=0, files=2)

    run, log, hosts = _on_the_fleet(tmp_path, s3a, "dags", "test", "stream_start")
    assert run.returncode == 0, log[-5000:]
    assert {h.name.rsplit("-", 1)[0] for h in hosts} >= {f"run_{NAME}", f"record_{NAME}"}
    registry = load_registry(path)  # from here, as a bastion that shares no folder either
    summary = json.loads(registry.run_summary_path(NAME).read_text())
    assert str(registry.run_summary_path(NAME)).startswith(control)
    assert summary["status"] == "succeeded" and f"{NAME}: succeeded" in log
    assert summary["last_committed_batch"] == 1  # one landing file a batch
    assert _local_records(hosts) == []

    # A backfill whose reprocessing runs with overrides: planned on one host, rolled back on
    # another, reprocessed on a third (its registry read from the control store).
    query = registry.query(NAME)
    land(tmp_path / "landing", round_=1, files=2)
    run_in_session(spark, path, NAME)
    before = load_checkpoint(query.checkpoint)
    cutoff = before.input_files(2)[0]["timestamp"] / 1000
    when = datetime.fromtimestamp(cutoff, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    overrides = {"processor": {"options": {"max_pages": 2}}}
    conf = {"query": NAME, "input_before": when, "overrides": overrides, "dry_run": False}
    run, log, hosts = _on_the_fleet(
        tmp_path, s3a, "dags", "test", "stream_backfill", "--conf", json.dumps(conf)
    )
    assert run.returncode == 0, log[-5000:]
    planned = {h.name.rsplit("-", 1)[0] for h in hosts}
    assert {"plan", "rollback", "reprocess"} <= planned, planned
    assert f"{control}/{NAME}/work/" in log  # the reprocessing's registry, on every host
    records = read_audit(query.checkpoint)
    reprocessed = [r for r in records if r["operation"] == "run"][-1]
    rolled = next(r for r in reversed(records) if r.get("result") == "rolled back")
    assert reprocessed["logic"] == rolled["logic"] != query.logic, "run with the overrides"
    assert records[-1]["operation"] == "backfill" and records[-1]["result"] == "succeeded"
    assert load_checkpoint(query.checkpoint).last_committed_batch == before.last_committed_batch
    distinct = OUTPUT_COLUMNS.index("distinct_pages")
    rows = read_sink(Path(query.sink.path))
    assert max(r[distinct] for b in (2, 3) for r in rows[b]) <= 2  # the new logic's output
    backups = list_backups(f"{registry.backups.url}/{NAME}", s3a.client())
    assert [b["batch_id"] for b in backups] == [before.last_committed_batch]
    assert _local_records(hosts) == []


# Each road's steps, each on a host of its own: on the initialState road the export is written
# on one host and bootstrapped from on another (its job runs the new checkpoint's batch 0),
# after the old state's validation on a third; the proof, on a fourth, reads what they left.
ROAD_STEPS = {
    "transplant": {"drain", "transplant", "first_batch", "prove", "switch"},
    "initial_state": {"drain", "export", "validate_export", "bootstrap", "prove", "switch"},
}


@pytest.mark.parametrize("road", ROAD_STEPS)
def test_a_migration_switches_on_one_host_and_the_next_run_on_another_runs_the_new_query(
    spark, s3, s3a_env, tmp_path, road
):
    """The migration DAG with each step on its own host, the old query running on yet another:
    the stop step reaches its driver through the control store; the run's own registry, its
    export and the first batch's summary go through the store; its switch is written there;
    the next scheduled stream_start, on other hosts, runs the new query on the new checkpoint;
    the state and output equal an uninterrupted run's."""
    whole = uninterrupted(spark, tmp_path, NAME)
    m = Migration(spark, tmp_path, NAME, s3)
    control = s3a_env.url(f"fleet-{uuid.uuid4().hex[:8]}")
    query = m.query()
    m.edit_registry(queries={NAME: _placed(m.path)}, control=control)
    new_source = tmp_path / "landing_v2" / NAME
    conf = m.conf(new_source_path=str(new_source), carry_over=road)
    last = sorted(new_source.iterdir())[-1]
    held_back = tmp_path / last.name
    os.replace(last, held_back)  # arrives after the switch: for the next scheduled run
    old_run = _running(spark, m.path, "old-driver")
    run, migrated, hosts = _on_the_fleet(
        tmp_path,
        s3a_env,
        "dags",
        "test",
        "stream_source_migration",
        "--conf",
        json.dumps(conf),
        backups=s3.endpoint,
    )
    assert run.returncode == 0, migrated[-8000:]
    code, out = old_run.result(timeout=60)
    assert code == 0 and json.loads(out.strip().splitlines()[-1])["stopped_by_marker"], out
    steps = {h.name.rsplit("-", 1)[0] for h in hosts}
    assert ROAD_STEPS[road] <= steps, steps
    switch = load_registry(m.path).switch_path(NAME)
    assert str(switch).startswith(control) and switch.exists()
    assert _local_records(hosts) == []

    os.replace(held_back, last)
    run, log, hosts = _on_the_fleet(
        tmp_path, s3a_env, "dags", "test", "stream_start", backups=s3.endpoint
    )
    assert run.returncode == 0, log[-5000:]
    summary = json.loads(load_registry(m.path).run_summary_path(NAME).read_text())
    assert summary["checkpoint"] == query.checkpoint + ".v2" and summary["batches_run"] > 0
    assert_migrated(spark, m, whole, migrated, road)
    lineage = json.loads((audit_dir(summary["checkpoint"]) / "lineage.json").read_text())
    assert lineage["export"].startswith(f"{control}/{NAME}/work/"), lineage["export"]


def test_a_bootstrap_from_an_initial_state_in_s3_runs_with_every_task_on_its_own_host(
    s3a_env, tmp_path
):
    """stream_bootstrap with each task on its own host, from data files in S3 (where every
    host reads them): planned on one, validated and started on another, its batch 0 recorded
    and its state verified and validated on others."""
    control = s3a_env.url(f"fleet-{uuid.uuid4().hex[:8]}")
    path = _fleet_registry(tmp_path, control, s3a_env.url(f"backups-{uuid.uuid4().hex[:8]}"))
    land(tmp_path / "landing", round_=0, files=1)
    initial = location(f"{control}-initial/visits.json")
    row = {"user_id": "u90001", "page": "help", "visited_at": "2025-12-29T08:00:00Z"}
    initial.write_text(json.dumps(row) + "\n")

    conf = {"query": NAME, "initial_state": str(initial), "dry_run": False}
    run, log, hosts = _on_the_fleet(
        tmp_path, s3a_env, "dags", "test", "stream_bootstrap", "--conf", json.dumps(conf)
    )
    assert run.returncode == 0, log[-5000:]
    steps = {h.name.rsplit("-", 1)[0] for h in hosts}
    assert {"plan", "bootstrap", "record", "verify_state"} <= steps, steps
    summary = json.loads(load_registry(path).run_summary_path(NAME).read_text())
    assert summary["operation"] == "bootstrap" and summary["bootstrap"] == "complete", summary
    assert summary["prepared"]["rows"] == 1 and summary["prepared"]["initial_state"] == str(initial)
    assert f"OK: state of {NAME} after batch 0; Data Docs: " in log  # validated on its own host
    assert _local_records(hosts) == []


def test_a_code_upgrade_rewrites_on_one_host_and_the_next_run_on_another_runs_the_new_code(
    spark, s3, s3a_env, tmp_path
):
    """stream_code_upgrade with each step on its own host: the export is written on one host
    and rewritten from on another (through the control store), the switch is recorded there,
    and the next scheduled stream_start, elsewhere, runs the new code on the new checkpoint."""
    old = run_old_code(spark, tmp_path / "old", "unsaferow")
    path = with_new_code(old, tmp_path / "data", "unsaferow", **PER_PAGE)
    control = s3a_env.url(f"fleet-{uuid.uuid4().hex[:8]}")
    raw = yaml.safe_load(path.read_text())
    raw.update(queries={NAME: _placed(path)}, control=control)
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    before = load_registry(path).query(NAME).checkpoint

    conf = {"query": NAME, "dry_run": False}
    run, log, hosts = _on_the_fleet(
        tmp_path / "data", s3a_env, "dags", "test", "stream_code_upgrade", "--conf",
        json.dumps(conf), backups=s3.endpoint,
    )  # fmt: skip
    assert run.returncode == 0, log[-8000:]
    steps = {h.name.rsplit("-", 1)[0] for h in hosts}
    assert {"backup", "export", "rewrite", "prove", "switch"} <= steps, steps
    query = load_registry(path).query(NAME)
    assert query.checkpoint == f"{before}.v2"
    lineage = json.loads((audit_dir(query.checkpoint) / "lineage.json").read_text())
    assert lineage["export"].startswith(f"{control}/{NAME}/work/"), lineage["export"]
    assert location(lineage["export"]).is_dir(), "the export the rewrite read is in the store"
    assert _local_records(hosts) == []

    land(tmp_path / "data" / "landing", round_=1, files=1)
    run, log, hosts = _on_the_fleet(
        tmp_path / "data", s3a_env, "dags", "test", "stream_start", backups=s3.endpoint
    )
    assert run.returncode == 0, log[-5000:]
    summary = json.loads(load_registry(path).run_summary_path(NAME).read_text())
    assert summary["checkpoint"] == query.checkpoint and summary["batches_run"] > 0, summary
    assert summary["logic"] == query.logic, "the new code ran"


def test_without_a_control_store_the_rehearsal_fails_where_a_task_reads_another_s_folder(
    s3a, tmp_path
):
    """The control: the same stream_start with the run summary in the run task's own folder
    fails at the task that reads it on another host."""
    _fleet_registry(tmp_path, None, s3a.url(f"backups-{uuid.uuid4().hex[:8]}"))
    land(tmp_path / "landing", round_=0, files=1)
    run, log, _ = _on_the_fleet(tmp_path, s3a, "dags", "test", "stream_start")
    assert run.returncode != 0
    assert _failed_tasks(log) == {f"record_{NAME}"}, log[-5000:]
    assert "no summary of run 'manual__" in log
