"""A holder that stalls past its lease and resumes (issue 74): two data folders as two hosts,
one S3 checkpoint and one S3 control store. Host A's rollback stops (SIGSTOP: a paused VM, a
closed laptop) before its first delete; host B finishes the interrupted rollback, as its
message advises, and runs the query on; A resumes. Before the fence, A went on with its plan
and deleted B's new batches (the checkpoint failed to verify until a restore); now it deletes
nothing and says, in one line, that it lost the query's lease."""

from __future__ import annotations

import hashlib
import time
import uuid
from pathlib import Path

import pytest

from stateops.control.markers import holder_marker, read_record
from stateops.core.checkpoint import load_checkpoint
from stateops.core.registry import load_registry
from stateops.core.storage import list_files, location
from stateops.spark.streaming import apply_query_conf, fenced_logs, start_query
from tests.conftest import paused_cli, run_cli
from tests.spark.harness import land, run_in_session, two_hosts

pytestmark = pytest.mark.spark
NAME = "page_counts"  # Spark's own aggregation on the HDFS-backed store
TTL = 30  # a lease the loaded machine renews in time (10, the least, was lost before the stall)


@pytest.fixture
def hosts(s3a_env, tmp_path) -> tuple[Path, Path]:
    tag = uuid.uuid4().hex[:8]
    shared = tmp_path / "shared"
    return two_hosts(
        tmp_path,
        NAME,
        source=shared / "landing" / "page_visits",
        checkpoint=s3a_env.url(f"stall-{tag}/checkpoint"),
        sink=shared / "output",
        control=s3a_env.url(f"stall-{tag}/control"),
        backups={"url": s3a_env.url(f"stall-{tag}/backups")},
        lease_seconds=TTL,
    )


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
