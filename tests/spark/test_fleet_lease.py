"""A run's lease in the S3 control store, seen from the driver (issue 55): a run holds its
query's lease while it runs, another host sees it and is refused, and a driver whose lease was
force-released (``stateops lock release`` on another host) or taken over writes nothing more:
its next batch fails before the sink's write, which is where the stateful operators run."""

from __future__ import annotations

import threading
import time
import uuid
from pathlib import Path

import pytest
import yaml

from stateops.control.lock import QueryLock, force_release, read_lock
from stateops.core.checkpoint import load_checkpoint
from stateops.core.errors import LockHeldError
from stateops.core.registry import load_registry
from tests.conftest import write_registry
from tests.spark.harness import job_in_session, land, read_sink

pytestmark = pytest.mark.spark
NAME = "page_counts"  # Spark's own aggregation on the HDFS-backed store


def test_a_driver_whose_lease_was_released_elsewhere_writes_nothing_more(spark, s3a_env, tmp_path):
    path = write_registry(tmp_path, page_counts={"trigger": {"processing_time": "1 second"}})
    raw = yaml.safe_load(path.read_text())
    raw["control"] = s3a_env.url(f"fleet-{uuid.uuid4().hex[:8]}")
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    registry = load_registry(path)
    lease, query = registry.lock_path(NAME), registry.query(NAME)
    land(tmp_path / "landing", round_=0, files=1)
    ran: dict = {}

    def run() -> None:
        ran["result"] = job_in_session(
            spark, "run_query.py", "--registry", str(path), "--query", NAME,
            "--mode", "continuous", "--run-id", "driver-1", "--poll-seconds", "0.2",
        )  # fmt: skip

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    commits = Path(query.checkpoint) / "commits"
    deadline = time.monotonic() + 180
    while not (commits / "0").exists() and thread.is_alive() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert (commits / "0").exists(), "the first batch did not commit"

    # Another host sees the run's lease in the control store, and is refused.
    assert read_lock(lease).run_id == "driver-1"
    with pytest.raises(LockHeldError, match=r"locked by run \(run driver-1"):
        QueryLock(lease, NAME, "cleanup", run_id="other-host").acquire()

    # An operator on that host forces it free and takes it; then new input lands.
    force_release(lease)
    with QueryLock(lease, NAME, "rollback", run_id="other-host"):
        committed = load_checkpoint(query.checkpoint).last_committed_batch
        output = read_sink(Path(query.sink.path))
        land(tmp_path / "landing", round_=1, files=1)
        thread.join(120)
        assert not thread.is_alive(), "the fenced run did not end"
        code, out = ran["result"]
        assert code == 1, out[-3000:]
        assert "is no longer its own (held by rollback (run other-host" in out, out[-3000:]
        assert load_checkpoint(query.checkpoint).last_committed_batch == committed
        assert read_sink(Path(query.sink.path)) == output, "the fenced driver wrote output"
        assert read_lock(lease).run_id == "other-host", "its release took another's lease"
