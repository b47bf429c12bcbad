"""A run's lease in the S3 control store, seen from two hosts (issue 55): two data folders
that share nothing but the control store, the checkpoint, the input and the sink, as two
Airflow workers would. The run on host A holds its query's lease; host B sees it and is
refused; B's ``stateops stop`` reaches A's driver, which stops after its current batch; and a
driver whose lease B force-released (``stateops lock release``) writes nothing more: its next
batch fails before the sink's write, which is where the stateful operators run."""

from __future__ import annotations

import functools
import json
import subprocess
import threading
import time
import uuid
from pathlib import Path

import pytest
import yaml

from stateops.control.lock import QueryLock, force_release, read_lock
from stateops.control.markers import request_stop
from stateops.core.checkpoint import load_checkpoint
from stateops.core.errors import LockHeldError
from stateops.core.registry import Registry, load_registry
from stateops.core.storage import location
from tests.conftest import run_cli, run_query_command, write_registry
from tests.spark.harness import (
    job_in_session,
    land,
    read_sink,
    read_state,
    run_in_session,
    two_hosts,
)

pytestmark = pytest.mark.spark
NAME = "page_counts"  # Spark's own aggregation on the HDFS-backed store


@pytest.fixture
def hosts(s3a_env, tmp_path) -> tuple[Path, Path]:
    """Host A's and host B's registry files: their own data folders (locks, markers, run
    summaries), one control store, and the query's checkpoint, input and sink where both see
    them."""
    shared = tmp_path / "shared"
    files = two_hosts(
        tmp_path,
        NAME,
        source=shared / "landing" / "page_visits",
        checkpoint=shared / "checkpoint",
        sink=shared / "output",
        entry={"trigger": {"processing_time": "1 second"}},
        control=s3a_env.url(f"fleet-{uuid.uuid4().hex[:8]}"),
    )
    land(shared / "landing", round_=0, files=1)
    return files


def running(spark, registry: Path) -> tuple[threading.Thread, dict]:
    """Host A's continuous run of the query, in the shared session, once its first batch has
    committed; its (exit code, output) lands in the dict when it ends."""
    ran: dict = {}

    def run() -> None:
        ran["result"] = job_in_session(
            spark, "run_query.py", "--registry", str(registry), "--query", NAME,
            "--mode", "continuous", "--run-id", "driver-1", "--poll-seconds", "0.2",
        )  # fmt: skip

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    commits = Path(load_registry(registry).query(NAME).checkpoint) / "commits"
    deadline = time.monotonic() + 180
    while not (commits / "0").exists() and thread.is_alive() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert (commits / "0").exists(), f"the first batch did not commit: {ran}"
    return thread, ran


def _between_batches(checkpoint: Path, quiet: float = 3.0) -> None:
    """Once the checkpoint's last planned batch is committed and nothing more was planned for
    ``quiet`` seconds (the no-data batch that a watermark's advance runs included)."""

    def last(log: str) -> int:
        return max(
            (int(p.name) for p in (checkpoint / log).iterdir() if p.name.isdigit()), default=-1
        )

    seen, since, deadline = None, time.monotonic(), time.monotonic() + 120
    while time.monotonic() < deadline:
        now = (last("offsets"), last("commits"))
        if now != seen:
            seen, since = now, time.monotonic()
        elif now[0] == now[1] and time.monotonic() - since >= quiet:
            return
        time.sleep(0.2)
    raise AssertionError(f"the run never rested between batches: {seen}")


def _state(registry: Registry) -> tuple[int | None, dict]:
    query = registry.query(NAME)
    return load_checkpoint(query.checkpoint).last_committed_batch, read_sink(Path(query.sink.path))


def test_a_stop_from_another_host_reaches_the_driver(spark, s3a_env, hosts):
    a, b = hosts
    thread, ran = running(spark, a)
    # B sees A's run in the control store: its cleanup is refused, its stop reaches it.
    cleanup = run_cli("--registry", str(b), "cleanup", NAME, env=s3a_env.env())
    assert cleanup.returncode == 2 and "locked by run (run driver-1" in cleanup.stderr
    stop = run_cli("--registry", str(b), "stop", NAME, env=s3a_env.env(), check=True)
    assert stop.stdout.startswith("stop requested of run driver-1 (")
    thread.join(120)
    assert not thread.is_alive(), "the run on host A did not stop"
    code, out = ran["result"]
    summary = json.loads(out.strip().splitlines()[-1])
    assert code == 0 and summary["stopped_by_marker"] is True, out[-3000:]
    assert read_lock(load_registry(b).lock_path(NAME)) is None, "the run released its lease"
    assert not load_registry(b).stop_marker(NAME).exists(), "the driver took the request"
    # A stop with no run to take it is said so, and left nowhere for a later run to find.
    idle = run_cli("--registry", str(b), "stop", NAME, env=s3a_env.env(), check=True)
    assert "no run holds its lease" in idle.stdout
    assert not load_registry(b).stop_marker(NAME).exists()


def test_a_driver_whose_lease_was_released_elsewhere_writes_nothing_more(spark, hosts):
    a, b = hosts
    thread, ran = running(spark, a)
    lease = load_registry(b).lock_path(NAME)
    assert read_lock(lease).run_id == "driver-1"
    with pytest.raises(LockHeldError, match=r"locked by run \(run driver-1"):
        QueryLock(lease, NAME, "cleanup", run_id="host-b").acquire()

    # Once A's driver is between batches, an operator on host B forces the lease free and
    # takes it; then new input lands.
    _between_batches(Path(load_registry(b).query(NAME).checkpoint))
    force_release(lease)
    with QueryLock(lease, NAME, "rollback", run_id="host-b"):
        before = _state(load_registry(b))
        land(load_registry(b).data_dir.parent / "shared" / "landing", round_=1, files=1)
        thread.join(120)
        assert not thread.is_alive(), "the fenced run did not end"
        code, out = ran["result"]
        assert code == 1, out[-3000:]
        assert (
            "this run (run driver-1) lost the query's lease (it is held by rollback (run host-b"
            in out
        ), out[-3000:]
        assert _state(load_registry(b)) == before, "the fenced driver committed or wrote"
        assert read_lock(lease).run_id == "host-b", "its release took another's lease"


def test_an_idle_run_whose_lease_was_released_stops_itself_and_leaves_the_new_holders_stop(
    spark, hosts
):
    """A continuous run with no input runs no batch, so no batch's fence would ever stop it:
    its watcher does, within a third of the TTL of an operator releasing its lease, and it
    takes no stop request addressed to the lease's new holder."""
    ttl = 30
    for path in hosts:
        raw = yaml.safe_load(path.read_text())
        path.write_text(yaml.safe_dump({**raw, "lease_seconds": ttl}, sort_keys=False))
    a, b = hosts
    thread, ran = running(spark, a)
    registry = load_registry(b)
    lease = registry.lock_path(NAME)
    _between_batches(Path(registry.query(NAME).checkpoint))
    released = time.monotonic()
    force_release(lease)
    with QueryLock(lease, NAME, "run", run_id="host-b", ttl_seconds=ttl):
        marker = request_stop(registry, NAME, read_lock(lease))
        thread.join(ttl)
        took = time.monotonic() - released
        assert not thread.is_alive(), "the run whose lease was released runs on"
        assert took < ttl / 3, f"it stopped {took:.1f} s after its lease was released"
        code, out = ran["result"]
        summary = json.loads(out.strip().splitlines()[-1])
        assert code == 1 and summary["lock_lost"], out[-3000:]
        assert "this run (run driver-1) lost the query's lease" in summary["error"], summary
        assert marker.exists(), "the stale run took the new holder's stop request"
        assert read_lock(lease).run_id == "host-b"


def _released(value: int, lease: str) -> int:
    """A row's value, once the lease at ``lease`` is force-released (in a Python worker, while
    the batch writes)."""
    force_release(Path(lease))
    return value


def test_a_batch_whose_lease_is_lost_while_it_writes_fails_uncommitted(spark, tmp_path):
    """The lease is checked after the sink's write too: a batch whose lease an operator
    released while it wrote fails, before Spark could commit it."""
    from pyspark.sql import functions as F

    from stateops.spark.streaming import fenced, write_batch

    registry = load_registry(write_registry(tmp_path))
    query, lease = registry.query(NAME), registry.lock_path(NAME)
    release = F.udf(lambda v: _released(v, str(lease)), "long")
    batch = spark.range(1).select(release("id").alias("id"))
    writer = QueryLock(lease, NAME, "run", run_id="writer")
    with writer, fenced(NAME, functools.partial(writer.ensure, fresh=0)):
        with pytest.raises(
            LockHeldError,
            match=r"this run \(run writer\) lost the query's lease \(it is held by nobody",
        ):
            write_batch(batch, 7, query)
    assert list(read_sink(Path(query.sink.path)).values()) == [[(0,)]], "the write came first"
    assert read_lock(lease) is None, "its release took nothing"


@pytest.mark.whole
def test_two_drivers_started_at_once_on_an_s3_checkpoint_one_runs_and_kafka_gets_each_batch_once(
    spark, kafka, s3a_env, tmp_path
):
    """Two spark-submits of one query that reads and writes Kafka, its checkpoint and control
    store in S3, started at once (two workers' retries of one task): one runs, the other is
    refused by the lease before it reads anything. The sink topic and the state then hold each
    batch once: what the same query run alone writes."""
    from tests.spark.test_kafka_rollback import READS, entry, read_topic, visits

    tag = uuid.uuid4().hex[:8]
    source = kafka.create_topic(f"two-drivers-in-{tag}", partitions=2, **{"retention.ms": "-1"})
    kafka.produce(source, visits(60))  # 6 batches of 10
    registries, sinks = {}, {}
    for side in ("both", "alone"):
        sinks[side] = kafka.create_topic(f"two-drivers-{side}-{tag}", partitions=2)
        path = write_registry(tmp_path / side, page_visits=entry(tmp_path, source, sinks[side]))
        raw = yaml.safe_load(path.read_text())
        raw["queries"]["page_visits"]["trigger"] = {"processing_time": "1 second"}
        if side == "both":
            raw["queries"]["page_visits"]["checkpoint"] = s3a_env.url(f"two-drivers-{tag}/cp")
            raw["control"] = s3a_env.url(f"fleet-{tag}")
        path.write_text(yaml.safe_dump(raw, sort_keys=False))
        registries[side] = path
    run_in_session(spark, registries["alone"], "page_visits", "--mode", "available-now")
    alone = load_registry(registries["alone"]).query("page_visits").checkpoint
    last = load_checkpoint(alone).last_committed_batch

    logs = {run_id: tmp_path / f"{run_id}.log" for run_id in ("driver-1", "driver-2")}
    drivers = {
        run_id: subprocess.Popen(
            run_query_command(
                registries["both"], "page_visits", "--mode", "continuous", "--run-id", run_id
            ),
            stdout=log.open("w"),
            stderr=subprocess.STDOUT,
        )
        for run_id, log in logs.items()
    }
    try:
        both = load_registry(registries["both"]).query("page_visits").checkpoint
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and not (
            location(both).exists() and load_checkpoint(both).last_committed_batch == last
        ):
            time.sleep(1)
        winner = read_lock(load_registry(registries["both"]).lock_path("page_visits")).run_id
        (loser,) = set(drivers) - {winner}
        assert drivers[loser].wait(120) == 2, logs[loser].read_text()[-3000:]
        said = logs[loser].read_text()
        assert f"locked by run (run {winner}" in said, said[-3000:]
        assert drivers[winner].poll() is None, "the winner runs on until it is stopped"
        assert load_checkpoint(both).last_committed_batch == last, "the winner ran every batch"
        stop = run_cli("--registry", str(registries["both"]), "stop", "page_visits")
        assert stop.returncode == 0, stop.stderr
        assert drivers[winner].wait(120) == 0, logs[winner].read_text()[-3000:]
    finally:
        for driver in drivers.values():
            driver.kill()
    assert read_topic(kafka, sinks["both"], {}, kafka.offsets(sinks["both"])) == read_topic(
        kafka, sinks["alone"], {}, kafka.offsets(sinks["alone"])
    )
    assert read_state(spark, both, READS) == read_state(spark, alone, READS)
