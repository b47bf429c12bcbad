"""A holder that stalls past its lease and resumes (issue 74): two data folders as two hosts,
one S3 checkpoint and one S3 control store. Host A's rollback stops (SIGSTOP: a paused VM, a
closed laptop) before its first delete; host B finishes the interrupted rollback, as its
message advises, and runs the query on; A resumes. Before the fence, A went on with its plan
and deleted B's new batches (the checkpoint failed to verify until a restore); now it deletes
nothing and says, in one line, that it lost the query's lease."""

from __future__ import annotations

import hashlib
import json
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest

from stateops.control.markers import holder_marker, read_record
from stateops.core.checkpoint import load_checkpoint
from stateops.core.registry import load_registry
from stateops.core.storage import list_files, location
from stateops.spark.streaming import apply_query_conf, fenced_logs, start_query
from tests.conftest import paused_cli, paused_process, run_cli, start_cli
from tests.s3proxy import Cut, S3Proxy
from tests.spark.harness import land, run_in_session, two_hosts

pytestmark = pytest.mark.spark
NAME = "page_counts"  # Spark's own aggregation on the HDFS-backed store
TTL = 30  # a lease the loaded machine renews in time (10, the least, was lost before the stall)


def _hosts(s3a_env, root: Path, ttl: float) -> tuple[Path, Path]:
    tag = uuid.uuid4().hex[:8]
    shared = root / "shared"
    return two_hosts(
        root,
        NAME,
        source=shared / "landing" / "page_visits",
        checkpoint=s3a_env.url(f"stall-{tag}/checkpoint"),
        sink=shared / "output",
        control=s3a_env.url(f"stall-{tag}/control"),
        backups={"url": s3a_env.url(f"stall-{tag}/backups")},
        lease_seconds=ttl,
    )


@pytest.fixture
def hosts(s3a_env, tmp_path) -> tuple[Path, Path]:
    return _hosts(s3a_env, tmp_path, TTL)


def _objects(checkpoint: str) -> dict[str, str]:
    """Every file of the checkpoint and a digest of its bytes."""
    root = location(checkpoint)
    return {rel: hashlib.sha256((root / rel).read_bytes()).hexdigest() for rel in list_files(root)}


@pytest.mark.whole
def test_a_rollback_resumed_after_its_lease_was_taken_deletes_nothing_the_next_holder_wrote(
    spark, s3a_env, hosts, tmp_path
):
    a, b = hosts
    landing = tmp_path / "shared" / "landing"
    for round_ in range(3):
        land(landing, round_=round_, files=1)
        run_in_session(spark, a, NAME)
    checkpoint = load_registry(a).query(NAME).checkpoint
    last = load_checkpoint(checkpoint).last_committed_batch
    assert last >= 2

    with paused_cli(
        *("--registry", str(a), "rollback", NAME, "--to-batch", "0"),
        at="delete:1",
        trace=tmp_path / "trace",
        env=s3a_env.env(),
    ) as stalled:
        time.sleep(TTL * 1.1 + 2)  # its lease expires (S3's Last-Modified: whole seconds)

        # Host B finishes the interrupted rollback and runs the query on.
        resumed = run_cli("--registry", str(b), "rollback", NAME, "--to-batch", "0")
        assert resumed.returncode == 0, resumed.stderr[-3000:]
        land(landing, round_=3, files=1)
        assert run_in_session(spark, b, NAME)["status"] == "succeeded"
        after_b = load_checkpoint(checkpoint).last_committed_batch
        assert after_b >= 1
        written = _objects(checkpoint)
        assert "commits/1" in written

        # Host A resumes with the plan it made under its lease.
        resumed_a = stalled.resume()
    out, err = resumed_a.stdout, resumed_a.stderr
    assert resumed_a.returncode == 1, out + err
    lines = [line for line in err.splitlines() if "lost the query's lease" in line]
    assert len(lines) == 1 and "this rollback (run " in lines[0], err[-3000:]
    assert _objects(checkpoint) == written, "the resumed rollback changed the new holder's files"
    verify = run_cli("--registry", str(b), "verify", NAME)
    assert verify.returncode == 0, verify.stdout + verify.stderr
    land(landing, round_=4, files=1)
    assert run_in_session(spark, b, NAME)["status"] == "succeeded"
    assert load_checkpoint(checkpoint).last_committed_batch > after_b


def test_a_driver_whose_lease_was_taken_writes_no_log_of_the_checkpoint(
    spark, s3a_env, hosts, tmp_path
):
    """Spark's own writes, fenced at the write: host A's driver, stalled with its plan while
    host B took the lease and ran the query on, resumes and plans its next batch. The
    checkpoint file manager reads the holder record B wrote and refuses the batch's offsets:
    nothing of the checkpoint changes. Under the holder's own token the same start runs."""
    a, b = hosts
    landing = tmp_path / "shared" / "landing"
    land(landing, round_=0, files=1)
    ran_a = run_in_session(spark, a, NAME)
    query = load_registry(a).query(NAME)
    holder = read_record(holder_marker(query.checkpoint))
    assert (holder["operation"], holder["run_id"]) == ("run", ran_a["run_id"])
    stale_token = holder["token"]

    land(landing, round_=1, files=1)
    ran_b = run_in_session(spark, b, NAME)
    holder = read_record(holder_marker(query.checkpoint))
    assert holder["run_id"] == ran_b["run_id"] and holder["token"] != stale_token
    before = _objects(query.checkpoint)
    last = load_checkpoint(query.checkpoint).last_committed_batch

    land(landing, round_=2, files=1)
    apply_query_conf(spark, query)
    with fenced_logs(spark, holder_marker(query.checkpoint), stale_token):
        stale = start_query(spark, query, available_now=True)
        with pytest.raises(Exception, match="no longer holds the query's lease") as refused:
            stale.awaitTermination(120)
    assert ran_b["run_id"] in str(refused.value)
    assert _objects(query.checkpoint) == before, "the stale driver wrote to the checkpoint"

    with fenced_logs(spark, holder_marker(query.checkpoint), holder["token"]):
        start_query(spark, query, available_now=True).awaitTermination(120)
    assert load_checkpoint(query.checkpoint).last_committed_batch > last


def _through(s3a_env, proxy: S3Proxy) -> dict[str, str]:
    """The S3 settings of a host whose requests go through ``proxy``."""
    return {**s3a_env.env(), "STATEOPS_S3_ENDPOINT_URL": proxy.endpoint}


def _key(path: str) -> str:
    return path.split("?")[0]


@pytest.mark.whole
def test_a_first_run_whose_renewals_fail_removes_nothing_of_the_next_holder_s_checkpoint(
    spark, s3a_env, tmp_path
):
    """Rehearsal 3 of FLEET-SAFETY.md: host A's first run of a fresh checkpoint reads its
    lease, from its batch 0 on, through an endpoint that cuts every answer short (botocore's
    ResponseStreamingError, no OSError: the renewer died of it silently before), and its
    batch 0's offsets file is held on its way to the store. A's lease lapses; host B takes
    it and plans batch 0 (its offsets written); A's held write arrives then, and A's run
    ends without a commit while B's batch 0 is uncommitted, its commit held until A is gone.
    A removes nothing (before, a failed first run removed the whole checkpoint: B's plan and
    state, under B's commit); B commits, and its checkpoint verifies and runs on."""
    ttl = 10  # the least
    a, b = _hosts(s3a_env, tmp_path, ttl)
    checkpoint = load_registry(a).query(NAME).checkpoint
    cutting, b_planned, a_gone, cut = (threading.Event(), threading.Event(), threading.Event(), [])

    def meddle_a(command: str, path: str, forward):
        if command == "GET" and _key(path).endswith("/lease.json") and cutting.is_set():
            status, headers, body = forward()
            cut.append(path)
            return status, headers, Cut(body)
        if command == "PUT" and _key(path).endswith("/checkpoint/offsets/0"):
            cutting.set()  # from A's batch 0 on, every renewal is cut short
            b_planned.wait(240)  # and batch 0's plan reaches the store after B's
        return forward()

    def meddle_b(command: str, path: str, forward):
        if command == "PUT" and _key(path).endswith("/checkpoint/commits/0"):
            a_gone.wait(240)  # B's batch 0 commits once A's run has ended
        answer = forward()
        if command == "PUT" and _key(path).endswith("/checkpoint/offsets/0"):
            b_planned.set()
        return answer

    proxy_a, proxy_b = S3Proxy(s3a_env.port, meddle_a), S3Proxy(s3a_env.port, meddle_b)
    land(tmp_path / "shared" / "landing", round_=0, files=1)
    first = start_cli(*("--registry", str(a), "run", NAME), env=_through(s3a_env, proxy_a))
    second = None
    try:
        deadline = time.monotonic() + 240
        while not cutting.wait(1):
            if first.poll() is not None or time.monotonic() > deadline:
                first.kill()
                raise AssertionError(f"A's run wrote no batch 0 offsets: {first.communicate()}")
        time.sleep(ttl + 1)  # A's lease, renewed last before its batch 0, lapses
        assert cut, "A's lease was read through the endpoint that cuts it short"
        second = start_cli(*("--registry", str(b), "run", NAME), env=_through(s3a_env, proxy_b))
        out, err = first.communicate(timeout=240)
        a_gone.set()
        out_b, err_b = second.communicate(timeout=240)
    finally:
        b_planned.set()
        a_gone.set()
        for proc in (first, second):
            if proc is not None:
                proc.kill()
        proxy_a.shutdown()
        proxy_b.shutdown()
    assert second.returncode == 0, out_b + err_b
    verify = run_cli("--registry", str(b), "verify", NAME)
    assert verify.returncode == 0, verify.stdout + verify.stderr
    assert first.returncode == 1, out + err
    said = out + err  # the driver's lines come through the CLI's output
    lost = [line for line in said.splitlines() if "lost the query's lease" in line]
    assert lost, said[-3000:]
    after_b = load_checkpoint(checkpoint).last_committed_batch
    assert after_b is not None
    land(tmp_path / "shared" / "landing", round_=1, files=1)
    assert run_in_session(spark, b, NAME)["status"] == "succeeded"
    assert load_checkpoint(checkpoint).last_committed_batch > after_b


# Host A's migration run as `stateops migrate` runs it (cmd_migrate), on a plan the test made,
# so that host B can roll back the same run as the DAG's roll_back task would on another worker.
_MIGRATE = """
import json, sys
from stateops.cli import migrate_planned, reported
from stateops.control.target import query_target
from stateops.core.s3 import s3_client, s3_settings

registry, plan = sys.argv[1], json.loads(sys.argv[2])


def migrate() -> int:
    target = query_target(registry, plan["query"])  # a refusal of it: one line, as the CLI's
    migrate_planned(target, plan, s3_client(s3_settings()), "local[2]")
    return 0


sys.exit(reported(migrate))
"""


@pytest.mark.whole
@pytest.mark.parametrize(
    "at, switched",
    [("marker:1", True), ("audit:2", False)],  # host A's own count (its backup's audit is 1)
    ids=["before-its-retirement", "before-its-switch-record"],
)
def test_a_switch_resumed_after_its_roll_back_on_another_host_retires_nothing(
    spark, s3a_env, hosts, tmp_path, at, switched
):
    """Rehearsal 4 of FLEET-SAFETY.md. Host A's migration stalls in its switch, after the
    switch record and before it retires the old checkpoint, or before the switch record
    (Airflow, hearing nothing, fails the switch task); host B's roll_back of the same run
    undoes what A switched and sets the new checkpoint aside; A resumes. Exactly one wins:
    the query is on its old checkpoint, which is not retired and runs on; the new one is set
    aside; A's switch stops at its next write, saying it lost the query's lease, and its run
    ends rolled back."""
    from stateops.control.lock import read_hold
    from stateops.control.markers import read_retired
    from stateops.control.target import query_target
    from stateops.ops.migration import plan_migration, roll_back_migration

    a, b = hosts
    shared = tmp_path / "shared"
    land(shared / "landing", round_=0, files=2)
    run_in_session(spark, a, NAME)
    land(shared / "landing_v2", round_=1, files=1)
    old = load_registry(a).query(NAME).checkpoint
    source = {"format": "json", "path": str(shared / "landing_v2" / "page_visits")}
    plan = plan_migration(query_target(a, NAME), source, run_id="m-stall")
    new = plan["new"]["checkpoint"]

    command = [str(Path(sys.executable)), "-c", _MIGRATE, str(a), json.dumps(plan)]
    # Before its switch host A runs the migration's Spark steps (export, bootstrap,
    # validation): about 40 s alone, over 2 minutes on 2 cores beside the whole proof.
    with paused_process(command, at=at, trace=tmp_path / "trace", timeout=600) as stalled:
        points = (tmp_path / "trace").read_text().split()[::3]
        assert points[-1] == at.split(":")[0] and "renamed" in points, points  # transplanted
        assert load_registry(b).query(NAME).checkpoint == (new if switched else old)
        time.sleep(TTL * 1.1 + 2)  # the step's lease expires (S3's Last-Modified: whole seconds)

        said: list[str] = []
        done = roll_back_migration(query_target(b, NAME), plan, log=said.append)
        assert done["switch_undone"] == switched, said
        assert load_registry(b).query(NAME).checkpoint == old
        assert (read_retired(new) or {}).get("state") == "set aside", said

        resumed = stalled.resume(timeout=300)
    out, err = resumed.stdout, resumed.stderr
    assert resumed.returncode == 1 and "Traceback" not in err, out + err
    lost = "this switch (run m-stall) lost the query's lease"
    lines = [line for line in err.splitlines() if lost in line]  # the step's, and the run's
    assert len(lines) == 2 and lines[0].startswith(f"{NAME}: switch failed: "), err[-3000:]
    assert lines[1] == err.strip().splitlines()[-1], err[-3000:]
    assert lines[1].startswith(f"error: the migration of {NAME} failed at switch ("), lines
    assert lines[1].endswith(
        f"it was rolled back and the query runs on {old}: fix the cause and migrate again"
    ), lines
    assert read_retired(old) is None, "the resumed switch retired the old checkpoint"
    for host in (a, b):
        assert load_registry(host).query(NAME).checkpoint == old
    assert (read_retired(new) or {}).get("state") == "set aside"
    assert read_hold(load_registry(b).lock_path(NAME)) is None, "the hold is released"
    last = load_checkpoint(old).last_committed_batch
    land(shared / "landing", round_=2, files=1)
    assert run_in_session(spark, b, NAME)["status"] == "succeeded"
    assert load_checkpoint(old).last_committed_batch > last
