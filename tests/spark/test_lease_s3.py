"""The lease in an S3 control store (``control: s3://...``): the lock and the hold as one object
changed only by conditional writes, on the SeaweedFS endpoint Spark writes checkpoints to;
refused on an endpoint that ignores the conditions (rclone's). The same rules as the local
files (tests/unit/test_lock.py), which the first tests here repeat on S3."""

from __future__ import annotations

import json
import multiprocessing
import threading
import time
import uuid

import pytest
import yaml

from stateops.control.lock import (
    QueryLock,
    force_release,
    hold_query,
    read_hold,
    read_lock,
    release_hold,
    require_conditional_writes,
)
from stateops.core.errors import LockHeldError, StateOpsError
from stateops.core.registry import load_registry
from stateops.core.storage import location
from tests.conftest import write_registry
from tests.s3proxy import S3Proxy

pytestmark = pytest.mark.spark  # no JVM: the tier whose workers already run SeaweedFS


@pytest.fixture
def lease(s3a_env, request):
    """A lease object no other test uses."""
    return location(s3a_env.url(f"control/{request.node.name}-{uuid.uuid4().hex[:6]}/lease.json"))


def _body(lease) -> dict:
    return json.loads(lease.read_bytes())


def test_a_second_holder_is_refused_and_a_release_leaves_a_tombstone(lease):
    with QueryLock(lease, "q", "cleanup", run_id="run-1") as first:
        assert read_lock(lease).run_id == "run-1" and first.epoch == 1
        with pytest.raises(LockHeldError, match=r"locked by cleanup \(run run-1"):
            QueryLock(lease, "q", "backup", run_id="run-2").acquire()
    assert read_lock(lease) is None
    assert _body(lease)["lock"] is None and _body(lease)["epoch"] == 1  # no DELETE
    with QueryLock(lease, "q", "backup", run_id="run-2") as second:
        assert second.epoch == 2


def test_a_holder_s_deadline_counts_from_its_lease_s_write_not_from_the_store_s_probe(
    lease, monkeypatch
):
    """A process's first lease on a store probes the store first (racing creates, seconds on
    a slow endpoint); the lease is written after it, and the store counts its TTL from
    that write. A holder whose deadline counted from before the probe thought itself lost
    as it took the lease (a loaded machine's first run, with the least TTL)."""
    from stateops.control import lock as lock_module

    probed = []

    def slow_probe(path, *args, **kwargs):
        if not probed:
            probed.append(path)
            time.sleep(4)  # more than the TTL less its margin (2 s less 0.5 s)
        return require_conditional_writes(path, *args, **kwargs)

    monkeypatch.setattr(lock_module, "require_conditional_writes", slow_probe)
    with QueryLock(lease, "q", "run", ttl_seconds=2.0) as holder:
        assert probed and holder.holds(), holder.lost_why
        holder.ensure()


def test_expiry_is_judged_by_the_store_s_clock_and_a_taken_over_holder_loses(lease):
    crashed = QueryLock(lease, "q", "rollback", ttl_seconds=1.0)
    crashed.acquire()
    crashed._stop.set()  # a crash: no more renewals, no release
    assert not read_lock(lease).expired
    time.sleep(2.5)  # S3's Last-Modified is in whole seconds
    assert read_lock(lease).expired
    with QueryLock(lease, "q", "run", run_id="new") as lock:
        assert read_lock(lease).token == lock.token and lock.epoch == crashed.epoch + 1
        crashed.renew()
        assert crashed.lost, "a renewal after a takeover must fail"
        crashed.release()  # a late release of the old holder removes nothing
        assert read_lock(lease).token == lock.token


def test_a_forced_release_moves_the_epoch_on_and_its_holder_loses(lease):
    holder = QueryLock(lease, "q", "run", run_id="run-1")
    holder.acquire()
    try:
        assert force_release(lease).run_id == "run-1"
        assert read_lock(lease) is None and _body(lease)["epoch"] == holder.epoch + 1
        holder.renew()
        assert holder.lost
    finally:
        holder.release()


def test_a_hold_admits_only_its_run_on_any_host(lease):
    hold_query(lease, "q", "migration", "mig-1")
    with pytest.raises(LockHeldError, match=r"held by migration \(run mig-1\)"):
        QueryLock(lease, "q", "cleanup", run_id="cleanup-1").acquire()
    with QueryLock(lease, "q", "run", run_id="mig-1"):  # a step of the holding run
        assert read_hold(lease).run_id == "mig-1" and read_lock(lease).run_id == "mig-1"
    assert not release_hold(lease, "mig-2") and release_hold(lease, "mig-1")
    assert read_hold(lease) is None


def test_a_dead_step_s_expired_lock_stays_expired_when_its_hold_is_released(lease):
    """A migration's step died on another host holding the lock; once the lock expired, the
    roll back releases the hold. That write must not make the dead lock look alive again (the
    object's age is the lock's on S3): the next run takes the query at once, not a TTL later."""
    hold_query(lease, "q", "migration", "mig-1")
    step = QueryLock(lease, "q", "run", run_id="mig-1", ttl_seconds=1.0)
    step.acquire()
    step._stop.set()  # the host lost: no more renewals, no release
    time.sleep(2.5)  # S3's Last-Modified is in whole seconds
    assert read_lock(lease).expired
    assert release_hold(lease, "mig-1")
    assert read_lock(lease) is None, "the dead step's lock was written again as if alive"
    with QueryLock(lease, "q", "run", run_id="next") as run:
        assert read_lock(lease).token == run.token
        step.renew()
        assert step.lost, "the dead step's holder lost its lease"


def _race(url: str, rounds: int, barrier, results) -> None:
    """One contender: at each round, all start together; the winner holds, then releases."""
    place = location(url)
    for _ in range(rounds):
        barrier.wait(60)
        try:
            lock = QueryLock(place, "q", "race")
            lock.acquire()
        except LockHeldError:
            results.put(None)
            barrier.wait(60)
            continue
        results.put(lock.epoch)
        barrier.wait(60)  # the others have tried
        lock.release()


def test_exactly_one_of_many_processes_wins_each_epoch(lease):
    contenders, rounds = 6, 4
    barrier, results = multiprocessing.Barrier(contenders), multiprocessing.Queue()
    procs = [
        multiprocessing.Process(target=_race, args=(str(lease), rounds, barrier, results))
        for _ in range(contenders)
    ]
    for p in procs:
        p.start()
    won = [results.get(timeout=120) for _ in range(contenders * rounds)]
    for p in procs:
        p.join(60)
    epochs = sorted(e for e in won if e is not None)
    assert epochs == list(range(1, rounds + 1)), won  # one winner a round, a new epoch each


def test_a_store_that_ignores_conditional_writes_is_refused_in_one_line(s3, monkeypatch):
    """rclone's S3 server accepts If-None-Match and If-Match and ignores them."""
    for name, value in s3.env().items():
        monkeypatch.setenv(name, value)
    place = location("s3://backups/control/q/lease.json")
    with pytest.raises(StateOpsError) as refused:
        require_conditional_writes(place)
    said = str(refused.value)
    assert "\n" not in said and said.startswith(f"the S3 store at {s3.endpoint} ignores")
    assert "would exclude nothing: point the registry's control at a store" in said
    with pytest.raises(StateOpsError, match="ignores conditional writes"):
        QueryLock(place, "q", "run").acquire()
    assert not place.exists() and not place.parent.exists(), "the probe left nothing"


def test_a_run_on_an_s3_checkpoint_whose_store_ignores_conditional_writes_is_refused(
    s3, tmp_path, monkeypatch
):
    """A run's log files are conditional creates (and its fence reads the holder record): the
    checkpoint's store is probed before Spark starts, and one that ignores the conditions
    (rclone's) is refused in one line, with no checkpoint written and the lease given back."""
    from stateops.control.target import query_target
    from stateops.ops.start import run_start

    for name, value in s3.env().items():
        monkeypatch.setenv(name, value)
    path = write_registry(tmp_path)  # no control store: the lease is a file of this host
    raw = yaml.safe_load(path.read_text())
    raw["queries"]["page_visits"]["checkpoint"] = "s3://backups/unconditional/cp"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    target = query_target(load_registry(path), "page_visits")
    with pytest.raises(StateOpsError) as refused:
        run_start(target, run_id="run-1")
    said = str(refused.value)
    assert "\n" not in said and said.startswith(f"the S3 store at {s3.endpoint} ignores"), said
    assert said.endswith(
        "keep S3 checkpoints on a store that honours them (AWS S3, MinIO, SeaweedFS)"
    )
    assert not location("s3://backups/unconditional/cp").exists(), "no checkpoint written"
    assert read_lock(target.lock_file) is None, "the lease was given back"


def _checked_apart(upstream_port: int) -> S3Proxy:
    """An endpoint whose ``If-None-Match: *`` is checked apart from the write (as a store
    without atomic conditions, or one reached through several gateways): a create refused
    when the object exists, but every create that arrives while the first is still being
    written is told it won too (last writer wins). Sequential creates are refused as they
    should be; only racing ones show it. ``If-Match`` stays the store's own."""
    lock, writing = threading.Lock(), set()

    def meddle(command: str, path: str, forward):
        if command != "PUT" or "if-none-match" not in forward.headers:
            return forward()
        with lock:
            racing = path in writing
            writing.add(path)
        if racing:
            return 200, [("ETag", '"00000000000000000000000000000001"')], b""
        try:
            time.sleep(0.2)  # the time the store takes between its look and its write
            return forward()
        finally:
            with lock:
                writing.discard(path)

    return S3Proxy(upstream_port, meddle)


def test_a_store_whose_conditional_create_is_not_atomic_is_refused(s3a_env, monkeypatch):
    """It passes every sequential check (a second create refused, a wrong version refused, the
    right one taken): only creates racing at once show two winners, two hosts with one lease."""
    proxy = _checked_apart(s3a_env.port)
    try:
        monkeypatch.setenv("STATEOPS_S3_ENDPOINT_URL", proxy.endpoint)
        place = location(s3a_env.url(f"control/apart-{uuid.uuid4().hex[:6]}/q/lease.json"))
        with pytest.raises(StateOpsError) as refused:
            require_conditional_writes(place)
    finally:
        proxy.shutdown()
    said = str(refused.value)
    assert "\n" not in said and f"the S3 store at {proxy.endpoint} let " in said, said
    assert "racing at once win (If-None-Match: * checked, but not atomically)" in said, said
    assert int(said.split(" let ")[1].split()[0]) > 1


def test_a_probe_whose_answers_were_lost_after_the_store_applied_them_passes(s3a_env, monkeypatch):
    """The store applies each first create and each first version write of a probe object,
    and the answer is lost (a 500 in its place); the SDK's retry of the same write finds this
    very write there and is refused (412). The probe reads back its own write and passes
    (FLEET-SAFETY finding 16): it does not call a store that honours conditions one that
    ignores them, and a racing create whose answer was lost still counts as the one winner."""
    lost, lock = set(), threading.Lock()

    def meddle(command: str, path: str, forward):
        answer = forward()
        kind = "create" if "if-none-match" in forward.headers else "version"
        if command == "PUT" and "/_probe-" in path and answer[0] == 200:
            with lock:
                first = (path, kind) not in lost
                lost.add((path, kind))
            if first:
                return 500, [], b"<Error><Code>InternalError</Code></Error>"
        return answer

    proxy = S3Proxy(s3a_env.port, meddle)
    try:
        monkeypatch.setenv("STATEOPS_S3_ENDPOINT_URL", proxy.endpoint)
        place = location(s3a_env.url(f"control/lost-{uuid.uuid4().hex[:6]}/q/lease.json"))
        require_conditional_writes(place)
    finally:
        proxy.shutdown()
    kinds = sorted(kind for _, kind in lost)
    assert kinds.count("version") == 1 and kinds.count("create") > 1, lost  # probe and races
    retried = [r for r in proxy.requests if r[0] == "PUT" and "/_probe-" in r[1]]
    assert len(retried) > len(lost), "every lost answer was retried"


def test_a_registry_with_a_control_store_keeps_its_leases_there(s3a_env, tmp_path):
    from stateops.control.target import query_target

    path = write_registry(tmp_path)
    raw = yaml.safe_load(path.read_text())
    raw["control"] = s3a_env.url(f"fleet-{uuid.uuid4().hex[:6]}")
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    registry = load_registry(path)
    target = query_target(registry, "page_visits")
    assert str(target.lock_file) == f"{raw['control']}/page_visits/lease.json"
    with target.lock("cleanup", "c-1"):
        assert read_lock(registry.lock_path("page_visits")).run_id == "c-1"
        assert not (tmp_path / "_stateops" / "locks").exists()
    raw["control"] = "/shared/locks"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    with pytest.raises(StateOpsError, match=r"control: expected s3://BUCKET/PREFIX"):
        load_registry(path)


def test_a_stop_request_is_taken_only_by_the_run_it_names(lease, tmp_path):
    """A request left for an earlier run (its token) never stops a later one, nor is it taken
    by it (the earlier run may be a holder that lost its lease and still polls); one
    addressed to the holder replaces it, and is taken and honoured."""
    from stateops.control.markers import request_stop, take_stop

    path = write_registry(tmp_path)
    raw = yaml.safe_load(path.read_text())
    raw["control"] = str(lease.parent.parent)
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    registry = load_registry(path)
    place = registry.lock_path("page_visits")
    with QueryLock(place, "page_visits", "run", run_id="earlier") as earlier:
        marker = request_stop(registry, "page_visits", read_lock(place))
        assert str(marker).startswith("s3://") and marker.exists()
    with QueryLock(place, "page_visits", "run", run_id="later") as later:
        assert not take_stop(registry, "page_visits", later.token)
        assert marker.exists(), "the other holder's request was taken"
        request_stop(registry, "page_visits", read_lock(place))
        assert take_stop(registry, "page_visits", later.token) and not marker.exists()
    assert earlier.token != later.token


def test_an_unreachable_control_store_is_one_line_naming_it(tmp_path, monkeypatch):
    from stateops.dev.s3server import free_port

    port = free_port()  # nothing listens there
    monkeypatch.setenv("STATEOPS_S3_ENDPOINT_URL", f"http://127.0.0.1:{port}")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "key")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "secret")
    monkeypatch.delenv("STATEOPS_CHECKPOINT_CONN_ID", raising=False)
    place = location("s3://control/fleet/q/lease.json")
    with pytest.raises(StateOpsError) as refused:
        QueryLock(place, "q", "cleanup").acquire()
    said = str(refused.value)
    assert "\n" not in said and f"127.0.0.1:{port}" in said, said


def test_an_s3_checkpoint_names_its_lease_and_a_registry_without_that_control_is_refused(
    s3a_env, tmp_path
):
    """A bastion's registry copy without ``control`` (or another one) would take a lease
    nobody else takes: the checkpoint's anchor, written at the first lease taken for it,
    refuses it in one line; an operation addressed to the checkpoint by its URL takes the
    query's own lease."""
    from stateops.control.target import checkpoint_target, query_target

    tag = uuid.uuid4().hex[:6]
    control, checkpoint = s3a_env.url(f"fleet-{tag}"), s3a_env.url(f"anchored-{tag}/cp")
    files = {}
    hosts = (("fleet", control), ("bastion", None), ("other", control + "x"), ("apart", control))
    for host, its_control in hosts:
        path = write_registry(tmp_path / host)
        raw = yaml.safe_load(path.read_text())
        if host != "apart":  # its page_visits has a checkpoint of its own
            raw["queries"]["page_visits"]["checkpoint"] = checkpoint
        raw["control"] = its_control
        path.write_text(yaml.safe_dump(raw, sort_keys=False))
        files[host] = path
    fleet = query_target(load_registry(files["fleet"]), "page_visits")
    with fleet.lock("cleanup", "c-1"):
        pass
    anchor = json.loads(location(f"{checkpoint}.audit/control.json").read_bytes())
    assert anchor == {
        "control": control,
        "lease": f"{control}/page_visits/lease.json",
        "holder": "page_visits",
    }
    for host in ("bastion", "other"):
        target = query_target(load_registry(files[host]), "page_visits")
        with pytest.raises(StateOpsError) as refused:
            target.lock("rollback", "r-1")
        said = str(refused.value)
        assert "\n" not in said and f"its lease lives in the control store {control}" in said
        assert f"set the registry's control: {control}" in said
    unregistered = checkpoint_target(load_registry(files["apart"]), checkpoint)
    assert unregistered.query is None and unregistered.lock_file == fleet.lock_file
