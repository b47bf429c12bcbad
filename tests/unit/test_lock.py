from __future__ import annotations

import json
import multiprocessing
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from stateops.control.lock import (
    QueryLock,
    force_release,
    hold_query,
    holder_gone,
    process_start,
    read_hold,
    read_lock,
    release_hold,
)
from stateops.control.markers import request_stop, take_stop
from stateops.core import fence
from stateops.core.errors import LeaseLostError, LockHeldError, StateOpsError
from stateops.core.registry import load_registry
from stateops.core.storage import delete_files
from tests.conftest import ROOT, run_cli, write_registry

pytestmark = pytest.mark.unit


def test_second_holder_is_refused_with_owner_and_run(tmp_path):
    path = tmp_path / "q.lock"
    with QueryLock(path, "q", "cleanup", run_id="run-1"):
        with pytest.raises(LockHeldError, match=r"locked by cleanup \(run run-1"):
            QueryLock(path, "q", "backup", run_id="run-2").acquire()
    assert read_lock(path) is None


def test_expired_lock_of_a_crashed_holder_is_taken_over(tmp_path):
    path = tmp_path / "q.lock"
    crashed = QueryLock(path, "q", "rollback", ttl_seconds=0.2)
    crashed.acquire()
    crashed._stop.set()  # simulate a crash: no more renewals, no release
    time.sleep(0.3)
    assert read_lock(path).expired
    with QueryLock(path, "q", "run", run_id="new") as lock:
        assert read_lock(path).run_id == "new"
        assert read_lock(path).token == lock.token
    crashed.release()  # a late release of the old holder must not remove someone else's lock


def test_holder_renews_before_expiry(tmp_path):
    path = tmp_path / "q.lock"
    with QueryLock(path, "q", "run", ttl_seconds=0.3):
        first = read_lock(path).expires_at
        time.sleep(0.5)
        assert read_lock(path).expires_at > first
        assert not read_lock(path).expired


def test_release_only_removes_own_lock_and_force_release_removes_any(tmp_path):
    path = tmp_path / "q.lock"
    holder = QueryLock(path, "q", "run")
    holder.acquire()
    other = QueryLock(path, "q", "other")
    other.release()
    assert read_lock(path).token == holder.token
    assert force_release(path).operation == "run"
    assert read_lock(path) is None
    holder.release()


def _try_acquire(path, results, done=None):
    try:
        QueryLock(path, "q", "race").acquire()
        results.put("won")
    except LockHeldError:
        results.put("lost")
    if done is not None:
        done.wait(30)  # the winner stays alive (a dead holder's lock is free) until all tried


def test_exactly_one_of_many_processes_wins(tmp_path):
    path = tmp_path / "q.lock"
    results, done = multiprocessing.Queue(), multiprocessing.Event()
    procs = [
        multiprocessing.Process(target=_try_acquire, args=(path, results, done)) for _ in range(8)
    ]
    for p in procs:
        p.start()
    outcomes = sorted(results.get(timeout=30) for _ in procs)
    done.set()
    for p in procs:
        p.join(30)
    assert outcomes.count("won") == 1, outcomes
    assert json.loads(path.read_text())["operation"] == "race"


def test_a_lock_whose_holder_process_died_is_taken_at_once(tmp_path):
    path = tmp_path / "q.lock"
    holder = multiprocessing.Process(target=_try_acquire, args=(path, multiprocessing.Queue()))
    holder.start()
    holder.join(30)  # it took the lock and exited without releasing it (as kill -9 would)
    held = read_lock(path)
    assert held is not None and not held.expired
    with QueryLock(path, "q", "cleanup") as lock:
        assert read_lock(path).token == lock.token


def test_a_holder_whose_pid_now_names_another_process_is_gone(tmp_path):
    """The PID of a killed holder, given by Linux to a process started since (within minutes
    on a busy host), does not keep its lock: the lock also names when its holder started."""
    path = tmp_path / "q.lock"
    with QueryLock(path, "q", "run"):
        held = read_lock(path)
    live = subprocess.Popen(["sleep", "60"])  # the PID's new owner
    try:
        started = process_start(live.pid)
        assert started is not None and started > held.holder_started
        owner = held.owner.rpartition(":")[0] + f":{live.pid}"
        path.write_text(json.dumps({**held.__dict__, "owner": owner}))
        assert holder_gone(read_lock(path)), "the lock's holder started before this process"
        with QueryLock(path, "q", "cleanup") as lock:
            assert read_lock(path).token == lock.token
        # The same PID and start time: the holder itself, alive; a lock written before locks
        # named their holder's start (no start): its PID alone decides.
        for start in (started, None):
            path.write_text(json.dumps({**held.__dict__, "owner": owner, "holder_started": start}))
            assert not holder_gone(read_lock(path))
            with pytest.raises(LockHeldError):
                QueryLock(path, "q", "cleanup").acquire()
    finally:
        live.kill()
        live.wait()


def test_a_hold_admits_only_its_own_run_until_released(tmp_path):
    path = tmp_path / "q.lock"
    hold_query(path, "q", "migration", "mig-1")
    with pytest.raises(LockHeldError, match=r"held by migration \(run mig-1\)"):
        QueryLock(path, "q", "cleanup", run_id="cleanup-1").acquire()
    with pytest.raises(LockHeldError, match=r"held by migration \(run mig-1\)"):
        hold_query(path, "q", "migration", "mig-2")
    with QueryLock(path, "q", "run", run_id="mig-1"):  # a step of the holding run
        assert read_lock(path).run_id == "mig-1"
    hold_query(path, "q", "migration", "mig-1")  # taken again by the same run: renewed
    assert not release_hold(path, "mig-2") and read_hold(path).run_id == "mig-1"
    assert release_hold(path, "mig-1") and read_hold(path) is None
    with QueryLock(path, "q", "cleanup", run_id="cleanup-2"):
        pass


def test_a_hold_waits_for_no_run_but_for_other_operations(tmp_path):
    path = tmp_path / "q.lock"
    with QueryLock(path, "q", "run", run_id="start-1"):
        hold_query(path, "q", "migration", "mig-1")  # the migration stops the run itself
    release_hold(path, "mig-1")
    with QueryLock(path, "q", "cleanup", run_id="cleanup-1"):
        with pytest.raises(LockHeldError, match=r"locked by cleanup \(run cleanup-1"):
            hold_query(path, "q", "migration", "mig-2")
    assert read_hold(path) is None


def test_expired_hold_is_no_hold_and_force_release_removes_it(tmp_path):
    path = tmp_path / "q.lock"
    hold_query(path, "q", "migration", "mig-1", ttl_seconds=0.1)
    time.sleep(0.2)
    assert read_hold(path) is None
    taken = QueryLock(path, "q", "cleanup")
    taken.acquire()
    force_release(path)
    taken.release()
    hold_query(path, "q", "migration", "mig-2")
    assert force_release(path) is None, "a hold is kept unless asked"
    assert read_hold(path).run_id == "mig-2"
    assert force_release(path, hold=True).run_id == "mig-2" and read_hold(path) is None


def _files(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if not p.is_dir())


def test_the_demo_refuses_a_data_folder_with_files_it_did_not_create(tmp_path):
    (tmp_path / "_stateops" / "locks").mkdir(parents=True)
    (tmp_path / "_stateops" / "locks" / "q.lock.guard").touch()  # as an older version left
    (tmp_path / "notes.txt").write_text("mine")
    demo = subprocess.run(
        [str(ROOT / "scripts" / "demo.sh")],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "STATEOPS_DATA_DIR": str(tmp_path)},
    )
    assert demo.returncode == 2 and "holds data the demo did not create" in demo.stderr
    assert (tmp_path / "notes.txt").exists()


def _take_turns(path: Path, inside: Path, rounds: int, clashes) -> None:
    for _ in range(rounds):
        try:
            lock = QueryLock(path, "q", "race")
            lock.acquire()
        except LockHeldError:
            continue
        try:
            fd = os.open(inside, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            clashes.put(1)  # two holders at once
        else:
            os.close(fd)
            os.unlink(inside)
        lock.release()


def test_a_guard_removed_while_another_waits_on_it_admits_one_holder_at_a_time(tmp_path):
    """Each release removes the guard file: a taker that waited on the removed one must not
    hold the lock beside a taker of the new one."""
    path, inside = tmp_path / "q.lock", tmp_path / "inside"
    clashes = multiprocessing.Queue()
    procs = [
        multiprocessing.Process(target=_take_turns, args=(path, inside, 1000, clashes))
        for _ in range(4)
    ]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
    assert [p.exitcode for p in procs] == [0] * 4
    assert clashes.empty()
    assert _files(tmp_path) == []


def _stalls_then_deletes(path: Path, folder: Path, said: Path, ttl: float) -> None:
    """A cleanup that takes the lease, stalls (SIGSTOP: a paused VM, a closed laptop), and once
    resumed goes on with the deletes it planned under the lease."""
    with QueryLock(path, "q", "cleanup", run_id="stalled", ttl_seconds=ttl):
        os.kill(os.getpid(), signal.SIGSTOP)
        try:
            delete_files(folder, ["commits/2", "offsets/2"])
        except LeaseLostError as err:
            said.write_text(str(err))


def _state(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]


def test_a_holder_that_stalls_past_its_lease_deletes_nothing_the_next_holder_wrote(tmp_path):
    """The rollback stalled before its deletes while another host took the lease over and ran
    the query on: resumed, it deletes none of the new holder's files and says it lost the
    lease (its renewer stalled with it: the deadline on its own clock decides)."""
    path, folder, said = tmp_path / "q.lock", tmp_path / "checkpoint", tmp_path / "said"
    stalled = multiprocessing.Process(target=_stalls_then_deletes, args=(path, folder, said, 1.0))
    stalled.start()
    deadline = time.monotonic() + 30
    while _state(stalled.pid) != "T":  # stopped inside the lease
        assert time.monotonic() < deadline, "the holder never stalled"
        time.sleep(0.05)
    time.sleep(1.2)  # past the TTL and the taker's grace
    with QueryLock(path, "q", "run", run_id="next"):
        for rel in ("commits/2", "offsets/2"):  # the next holder's batch 2
            (folder / rel).parent.mkdir(parents=True, exist_ok=True)
            (folder / rel).write_text("the new holder's")
        os.kill(stalled.pid, signal.SIGCONT)
        stalled.join(30)
    assert stalled.exitcode == 0
    assert (folder / "commits/2").read_text() == "the new holder's"
    assert (folder / "offsets/2").exists()
    assert "this cleanup (run stalled) lost the query's lease" in said.read_text(), said


def test_a_taker_waits_the_ttl_and_a_grace(tmp_path):
    path = tmp_path / "q.lock"
    crashed = QueryLock(path, "q", "rollback", ttl_seconds=1.0)
    crashed.acquire()
    crashed._stop.set()  # a crash: no more renewals
    time.sleep(1.02)  # past the TTL, inside the grace (a tenth of it)
    with pytest.raises(LockHeldError):
        QueryLock(path, "q", "run").acquire()
    time.sleep(0.2)
    with QueryLock(path, "q", "run"):
        pass


def test_a_released_lease_stops_its_holder_at_its_next_guarded_write(tmp_path):
    path, folder = tmp_path / "q.lock", tmp_path / "checkpoint"
    folder.mkdir()
    (folder / "a").write_text("a")
    with QueryLock(path, "q", "rollback", ttl_seconds=60) as lock:
        fence.guard()  # held: passes
        force_release(path)  # an operator's `stateops lock release`
        time.sleep(1.0)  # the guard asks the store at most once a second
        with pytest.raises(LeaseLostError, match="held by nobody now"):
            delete_files(folder, ["a"])
        assert lock.lost
    assert (folder / "a").exists()
    fence.guard()  # released: this thread holds no lease any more


def _flaky(fails: int):
    """``QueryLock.renew`` on a store that fails ``fails`` renewals with the error botocore
    raises on a connection reset while a body is read (not an OSError), then answers."""
    renew, left = QueryLock.renew, [fails]

    def flaky(lock: QueryLock) -> None:
        from botocore.exceptions import ResponseStreamingError

        if left[0]:
            left[0] -= 1
            raise ResponseStreamingError(error="connection reset")
        renew(lock)

    return flaky


@pytest.mark.parametrize("fails", [1, 1000], ids=["one failure", "failing on"])
def test_a_renewal_error_is_retried_until_the_holders_deadline(tmp_path, monkeypatch, fails):
    monkeypatch.setattr(QueryLock, "renew", _flaky(fails))
    with QueryLock(tmp_path / "q.lock", "q", "run", ttl_seconds=0.6) as lock:
        time.sleep(1.0)  # renewals at 0.2 s, retried every 0.05 s; the deadline at 0.45 s
        assert lock._renewer.is_alive() is (fails == 1)
        assert lock.lost is (fails != 1)
        if fails != 1:
            assert "no renewal succeeded in time; the last said ResponseStreamingError" in (
                lock.lost_why
            )
            with pytest.raises(LeaseLostError):
                lock.ensure()
        else:
            lock.ensure()


def test_a_stop_request_for_another_holder_is_left_for_it(tmp_path):
    registry = load_registry(write_registry(tmp_path / "data"))
    with QueryLock(registry.lock_path("q"), "q", "run", run_id="new") as new:
        request_stop(registry, "q", read_lock(registry.lock_path("q")))
        assert not take_stop(registry, "q", "a stale holder's token")
        assert take_stop(registry, "q", new.token)
        assert not take_stop(registry, "q", new.token)  # taken once


def test_a_live_lock_is_released_only_with_force_saying_what_it_does_to_its_holder(tmp_path):
    """A slow or cut-off holder cannot be told from a dead one: releasing a live lease is a
    decision, and its holder stops at its next guarded write."""
    path = write_registry(tmp_path / "data")
    place = load_registry(path).lock_path("page_visits")
    with QueryLock(place, "page_visits", "rollback", run_id="rb-1") as holder:
        refused = run_cli("--registry", str(path), "lock", "release", "page_visits")
        assert refused.returncode == 2, refused.stderr
        assert "locked by rollback (run id rb-1" in refused.stderr
        assert "stateops lock release page_visits --force" in refused.stderr
        assert read_lock(place).token == holder.token
        run_cli("--registry", str(path), "lock", "release", "page_visits", "--force", check=True)
        assert read_lock(place) is None
        time.sleep(1.0)  # the guard asks the store at most once a second
        with pytest.raises(LeaseLostError):
            fence.guard()


def test_a_release_keeps_a_migration_s_hold_unless_asked_and_says_so(tmp_path):
    """A hold keeps the query for a migration's (or backfill's) steps: dropping it with a
    dead step's lock would let a scheduled start in between them and waste every approval.
    The release keeps it and says how to drop it; ``--hold`` drops it too."""
    path = write_registry(tmp_path / "data")
    place = load_registry(path).lock_path("page_visits")
    hold_query(place, "page_visits", "migration", "mig-1")
    step = QueryLock(place, "page_visits", "migration", run_id="mig-1")
    step.acquire()
    step._stop.set()  # the step's process is gone: nobody renews or releases its lock
    fence.drop(step.ensure)
    released = run_cli("--registry", str(path), "lock", "release", "page_visits", "--force")
    assert released.returncode == 0, released.stderr
    assert "released the lock of migration (run id mig-1" in released.stdout
    assert "held for the steps of migration (run id mig-1" in released.stderr
    assert "to drop it too: stateops lock release page_visits --hold" in released.stderr
    assert read_lock(place) is None and read_hold(place).run_id == "mig-1"
    with pytest.raises(LockHeldError, match="lock release page_visits --hold"):
        QueryLock(place, "page_visits", "run").acquire()
    run_cli("--registry", str(path), "lock", "release", "page_visits", "--hold", check=True)
    assert read_hold(place) is None


def test_a_lease_the_store_cannot_take_back_is_left_to_lapse_and_the_error_stands(
    tmp_path, monkeypatch, capsys
):
    """A holder whose first guarded write finds it lost (a deadline passed while its lease was
    written) gives the lease back on its way out; the store does not answer that either. The
    caller hears the lost lease, not the store's error, and one line says the lease lapses."""
    from stateops.control import lock as lock_module

    path = tmp_path / "q.lock"
    real = lock_module._change

    def unreachable(place, decide):
        raise StateOpsError("S3 read s3://b/q.lock: ResponseStreamingError: connection reset")

    def first_write(info) -> None:
        monkeypatch.setattr(lock_module, "_change", unreachable)
        raise LeaseLostError("this run lost the query's lease")

    with pytest.raises(LeaseLostError, match="lost the query's lease"):
        QueryLock(path, "q", "run", ttl_seconds=30, on_acquire=first_write).acquire()
    said = capsys.readouterr().err.splitlines()
    assert len(said) == 1 and "could not give its lease back (S3 read s3://b/q.lock" in said[0]
    assert "it lapses by itself 30 s after its last renewal" in said[0]
    monkeypatch.setattr(lock_module, "_change", real)
    assert read_lock(path).operation == "run", "the lease was left as it was, to lapse"
