"""One lock per managed query, shared by every lifecycle operation (DAGs and CLI alike).

The lock is a record (owner, run id, operation, expiry) in the query's *lease*, kept in one of
two places (the registry's ``control``):

- a local folder (the default: one host): the lock a JSON file, its hold another beside it,
  each read-modify-write under an exclusive ``flock`` on a guard file, so taking over an
  expired lock is atomic too;
- an S3 prefix (``control: s3://BUCKET/PREFIX``: a fleet, whose hosts share no disk): one
  object holding the lock, the hold and an epoch, changed only by conditional writes
  (``If-None-Match: *`` to create it, ``If-Match: <etag>`` to replace the version read), so
  of two writers that read the same version one wins and the other reads again. A store that
  ignores the conditions is refused before first use (:func:`require_conditional_writes`).
  A lock's age there is judged by the store's clock, never a client's.

A holder that crashes stops renewing; once the lock expires, the next taker wins. On the
holder's own machine (its host name, boot and PID namespace) a taker sees at once that its
process is gone (``kill -9``) and wins: no process has its PID, or the one that has it started
after the lock's holder did (Linux hands a dead process's PID to a new one, within minutes on
a busy host: 32768 by default). A takeover bumps the lease's epoch and changes the token, so a
holder that was taken over fails its next renewal (``lost``).

An operation made of several processes (a migration: one Airflow task per step) puts a *hold*
on the query: while it lasts, only locks taken with the holding run's id are granted, so each
step takes the lock for its own work and nothing else gets in between.
"""

from __future__ import annotations

import dataclasses
import fcntl
import functools
import getpass
import json
import os
import random
import socket
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

from stateops.core import fence
from stateops.core.errors import LeaseLostError, LockHeldError, StateOpsError, one_line
from stateops.core.registry import LEASE_SECONDS
from stateops.core.steps import safe_run_id
from stateops.core.storage import S3Path

# Where a query's lease lives: a local lock file (its hold and guard beside it), or the
# object of an S3 control store.
Place = Path | S3Path

__all__ = [
    "LockInfo",
    "QueryLock",
    "describe_lock",
    "force_release",
    "hold_query",
    "holder_gone",
    "holder_pid",
    "lock_state",
    "new_run_id",
    "process_start",
    "read_hold",
    "read_lock",
    "release_hold",
    "require_conditional_writes",
    "safe_run_id",
    "this_machine",
]


@dataclass(frozen=True)
class LockInfo:
    query: str
    operation: str
    run_id: str
    owner: str
    token: str
    acquired_at: float
    expires_at: float
    holder_started: int | None = None  # the holder's process start (process_start), if known
    ttl_seconds: float | None = None  # on S3, expiry is judged by the store's clock with it
    machine: str | None = None  # the holder's boot and PID namespace (this_machine), if known

    @property
    def expired(self) -> bool:
        return time.time() >= self.expires_at


def takeover_grace(ttl: float) -> float:
    """How long past a lease's TTL a taker waits (:attr:`LockInfo.expires_at` includes it):
    with the holder's margin (:func:`holder_margin`), longer than any one guarded step, so a
    holder that passed its last check just before its deadline finishes that step before
    anyone may take the lease."""
    return ttl / 10


def holder_margin(ttl: float) -> float:
    """How long before the TTL counted from its last renewal a holder stops writing
    (:meth:`QueryLock.ensure`): the renewal's own time and a slower clock on its side."""
    return ttl / 4


def boot_clock() -> float:
    """Seconds on a clock that goes on through a system suspend (a laptop's lid closed, a VM
    paused): CLOCK_BOOTTIME where there is one, else the monotonic clock (which stops)."""
    return time.clock_gettime(getattr(time, "CLOCK_BOOTTIME", time.CLOCK_MONOTONIC))


@dataclass(frozen=True)
class _Lease:
    """What one read of a lease's place gives: the lock and the hold (as written: an expired
    one included), the epoch (S3: bumped by each new holder and each forced release), and
    the version read (S3: the ETag; None: no object)."""

    lock: LockInfo | None = None
    hold: LockInfo | None = None
    epoch: int = 0
    version: str | None = None


def read_lock(path: Place) -> LockInfo | None:
    """The current lock, or None when nobody holds it (an unreadable one counts as free)."""
    return _read(path).lock


def live_lock(path: Place) -> LockInfo | None:
    """The lock while its holder holds it (not expired, its process not known to be gone)."""
    return _alive(read_lock(path))


def _alive(held: LockInfo | None) -> LockInfo | None:
    """``held`` while its holder holds it (not expired, its process not known to be gone)."""
    return None if held is None or held.expired or holder_gone(held) else held


def lock_state(held: LockInfo) -> str:
    """``holder gone`` (its process on this host no longer exists), ``expired`` or ``held``."""
    if holder_gone(held):
        return "holder gone"
    return "expired" if held.expired else "held"


def describe_lock(query: str, held: LockInfo, state: str) -> str:
    """One line on a lock (``state``: :func:`lock_state`, ``hold`` or ``released``), with what
    to do where the holder is gone."""
    who = f"{held.operation} (run id {held.run_id}, {held.owner})"
    if state == "released":
        return f"{query}: released the lock of {who}"
    if state == "hold":
        return f"{query}: held for the steps of {who} until {_until(held)}"
    if state == "holder gone":
        return (
            f"{query}: locked by {who}, whose process is gone (killed or crashed): "
            f"stateops lock release {query}"
        )
    if state == "expired":
        return (
            f"{query}: locked by {who}, expired at {_until(held)}: its holder stopped "
            f"renewing it (gone or hung): stateops lock release {query}"
        )
    return f"{query}: locked by {who} until {_until(held)}"


def _hold_path(path: Path) -> Path:
    return path.with_name(path.name + ".hold")


def read_hold(path: Place) -> LockInfo | None:
    """The hold on the query of lock ``path``, or None (an expired hold counts as none)."""
    return _live_hold(_read(path))


def _live_hold(lease: _Lease) -> LockInfo | None:
    return None if lease.hold is None or lease.hold.expired else lease.hold


def _until(info: LockInfo) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(info.expires_at))


def _refuse_hold(lease: _Lease, query: str, run_id: str) -> None:
    hold = _live_hold(lease)
    if hold and hold.run_id != run_id:
        raise LockHeldError(
            f"query {query!r} is held by {hold.operation} (run {hold.run_id}) until "
            f"{_until(hold)}; wait for that run to finish or roll back, or if it is dead: "
            f"stateops lock release {query} --hold"
        )


def refuse_unholdable(path: Place, query: str, run_id: str) -> LockInfo | None:
    """Raise LockHeldError unless ``run_id`` may hold the query; returns a live query run's
    lock (a run does not block a hold: the holder stops it)."""
    return _refuse_unholdable(_read(path), query, run_id)


def _refuse_unholdable(lease: _Lease, query: str, run_id: str) -> LockInfo | None:
    _refuse_hold(lease, query, run_id)
    held = _alive(lease.lock)
    if held and held.operation != "run" and held.run_id != run_id:
        raise LockHeldError(
            f"query {query!r} is locked by {held.operation} (run {held.run_id}, "
            f"{held.owner}) until {_until(held)}; wait for it to finish"
        )
    return held


def hold_query(
    path: Place, query: str, operation: str, run_id: str, ttl_seconds: float = 6 * 3600
) -> LockInfo:
    """Hold the query for ``run_id`` (taken again by the same run: renewed).

    Refused while another run holds it, or while an operation other than a query run holds the
    lock (a run may go on: the holder stops it, then takes the lock with its own run id).
    """
    now = time.time()
    info = LockInfo(
        query=query,
        operation=operation,
        run_id=run_id,
        owner=f"{getpass.getuser()}@{socket.gethostname()}",
        token=run_id,
        acquired_at=now,
        expires_at=now + ttl_seconds,
    )

    def decide(lease: _Lease) -> _Lease:
        _refuse_unholdable(lease, query, run_id)
        return dataclasses.replace(lease, hold=info)

    _change(path, decide)
    return info


def release_hold(path: Place, run_id: str) -> bool:
    """End ``run_id``'s hold; False when it held none."""
    released = []

    def decide(lease: _Lease) -> _Lease | None:
        released[:] = [lease.hold is not None and lease.hold.run_id == run_id]
        return dataclasses.replace(lease, hold=None) if released[0] else None

    _change(path, decide)
    return released[0]


# -- the lease's two places ---------------------------------------------------------------------
_ATTEMPTS = 50  # conditional writes lost to other writers before giving up


def _change(path: Place, decide: Callable[[_Lease], _Lease | None]) -> _Lease:
    """Read the lease at ``path``, let ``decide`` say what it becomes (None: unchanged; it may
    raise to refuse), and write that, unless another writer changed it since the read: then
    read and decide again. Returns the lease as it now is."""
    if not isinstance(path, S3Path):
        with _guarded(path):
            lease = _read_files(path)
            new = decide(lease)
            if new is None:
                return lease
            _write_files(path, lease, new)
            return new
    require_conditional_writes(path)
    for _ in range(_ATTEMPTS):
        lease = _read_object(path)
        new = decide(lease)
        if new is None:
            return lease
        lock = new.lock
        if lock is not None and lock == lease.lock and lock.expired:
            # its holder's: written again, the object's new age would make it look alive
            # for another TTL (a dead step's lock blocking the next run after its roll back)
            lock = None
        body = {
            "epoch": new.epoch,
            "lock": lock and asdict(lock),
            "hold": new.hold and asdict(new.hold),
            "write": uuid.uuid4().hex,  # each write its own ETag, whatever else it repeats
        }
        if path.write_if(json.dumps(body).encode(), lease.version):
            return new
        time.sleep(random.uniform(0.01, 0.1))
    raise LockHeldError(
        f"{path}: {_ATTEMPTS} other writers changed the lease first; try again in a minute"
    )


def _read(path: Place) -> _Lease:
    return _read_object(path) if isinstance(path, S3Path) else _read_files(path)


def _lock_from(raw: object) -> LockInfo | None:
    try:
        return LockInfo(**raw) if raw else None
    except TypeError:
        return None


def _read_files(path: Path) -> _Lease:
    """The lock and hold files (unreadable: none)."""

    def one(file: Path) -> LockInfo | None:
        try:
            return _lock_from(json.loads(file.read_text(encoding="utf-8")))
        except (OSError, ValueError):
            return None

    return _Lease(one(path), one(_hold_path(path)))


def _write_files(path: Path, old: _Lease, new: _Lease) -> None:
    for file, before, after in ((path, old.lock, new.lock), (_hold_path(path), old.hold, new.hold)):
        if after == before:
            continue
        if after is None:
            file.unlink(missing_ok=True)
            continue
        tmp = file.with_name(f".{file.name}.{uuid.uuid4().hex}.tmp")
        tmp.write_text(json.dumps(asdict(after)), encoding="utf-8")
        os.replace(tmp, file)


def _read_object(path: S3Path) -> _Lease:
    """The lease object, its lock's expiry judged by the store's clock: the lock expires
    ``ttl_seconds`` after the object was last written (a write of the hold only makes a live
    lock look younger: the safe side; an expired one is dropped by the next write)."""
    data, version, age = path.read_versioned()
    if data is None:
        return _Lease()
    try:
        raw = json.loads(data)
        lock, hold, epoch = _lock_from(raw.get("lock")), _lock_from(raw.get("hold")), raw["epoch"]
    except (ValueError, TypeError, KeyError, AttributeError):
        raise StateOpsError(
            f"{path}: the lease object is unreadable; stateops lock release <query> writes a "
            "new one"
        ) from None
    if lock is not None and lock.ttl_seconds is not None:
        ttl = lock.ttl_seconds
        lock = dataclasses.replace(lock, expires_at=time.time() - age + ttl + takeover_grace(ttl))
    return _Lease(lock, hold, int(epoch), version)


_PROBED: set[tuple[str, str]] = set()
_RACERS, _RACES = 8, 3  # the probe's racing creates of one object, and how many races


_LEASES = (
    "a lease kept there would exclude nothing: point the registry's control at a store that "
    "honours them (AWS S3, MinIO, SeaweedFS), or leave control out on one host"
)
CHECKPOINTS = (
    "Spark's log files there would not be created once (two drivers could both write one "
    "batch): keep S3 checkpoints on a store that honours them (AWS S3, MinIO, SeaweedFS)"
)


def require_conditional_writes(path: S3Path, then: str = _LEASES) -> None:
    """Refuse, in one line that ends with ``then`` (what it breaks, what to do), an S3 store
    that does not honour conditional writes (some accept
    the headers and ignore them: a lock on it would always be granted, some check them but not
    atomically: two hosts would both win one race). Probed once per process and bucket: a
    create over an object that exists must fail, a write over a version that is not the
    object's must fail and one over its version must succeed, and of several creates of one
    object racing at once exactly one must win, race after race."""
    key = (path._client.endpoint, path.bucket)
    if key in _PROBED:
        return
    probe = path.parent / f"_probe-{uuid.uuid4().hex}"

    def body() -> bytes:  # each write its own: a retry's 412 over it is told apart
        return uuid.uuid4().hex.encode()

    try:
        honoured = (
            probe.write_own(body(), None)
            and not probe.write_if(body(), None)
            and not probe.write_if(body(), '"0123456789abcdef0123456789abcdef"')
            and probe.write_own(body(), probe.read_versioned()[1])
        )
    finally:
        probe.unlink(missing_ok=True)
    if not honoured:
        raise StateOpsError(
            f"the S3 store at {path._client.endpoint} ignores conditional writes (a second "
            f"create of {probe} with If-None-Match: * was accepted, or a write over the "
            f"object's own version refused), so {then}"
        )
    winners = _race_creates(path.parent)
    if winners != 1:
        raise StateOpsError(
            f"the S3 store at {path._client.endpoint} let {winners} of {_RACERS} creates of "
            f"one object racing at once win (If-None-Match: * checked, but not atomically), so "
            f"{then}"
        )
    _PROBED.add(key)


def _race_creates(folder: S3Path) -> int:
    """:data:`_RACERS` creates (``If-None-Match: *``) of one new object at once, :data:`_RACES`
    times: the most winners of a race (1 where the store decides atomically)."""
    from concurrent.futures import ThreadPoolExecutor

    most = 0
    with ThreadPoolExecutor(_RACERS) as pool:
        for _ in range(_RACES):
            probe = folder / f"_probe-{uuid.uuid4().hex}"
            start = threading.Barrier(_RACERS)

            def create(_: int, probe: S3Path = probe, start: threading.Barrier = start) -> bool:
                start.wait()
                return probe.write_own(uuid.uuid4().hex.encode(), None)

            try:
                most = max(most, sum(pool.map(create, range(_RACERS))))
            finally:
                probe.unlink(missing_ok=True)
    return most


@contextmanager
def _guarded(path: Path) -> Iterator[None]:
    """Exclusive flock on ``<lock>.guard``: every read-modify-write of a lock happens under it.

    The guard goes once neither the lock nor a hold is left, so an operation leaves no file
    behind in the state folder. A process that waited on a guard removed meanwhile holds an
    flock on a file nobody else will open: it checks that the path still names the file it
    locked, and otherwise starts again.
    """
    guard_path = path.with_name(path.name + ".guard")
    while True:
        path.parent.mkdir(parents=True, exist_ok=True)
        guard = open(guard_path, "a")  # noqa: SIM115 (closed below, after the unlock)
        fcntl.flock(guard, fcntl.LOCK_EX)
        try:
            if os.stat(guard_path).st_ino == os.fstat(guard.fileno()).st_ino:
                break
        except FileNotFoundError:
            pass
        guard.close()
    try:
        yield
    finally:
        if not path.exists() and not _hold_path(path).exists():
            guard_path.unlink(missing_ok=True)
        fcntl.flock(guard, fcntl.LOCK_UN)
        guard.close()


def holder_pid(held: LockInfo) -> tuple[str, int] | None:
    """(host, pid) of the process holding ``held`` (a hold records none: None)."""
    host, _, pid = held.owner.rpartition("@")[2].rpartition(":")
    return (host, int(pid)) if host and pid.isdigit() else None


def process_start(pid: int) -> int | None:
    """When process ``pid`` started, in clock ticks since boot (``/proc/PID/stat``, field 22):
    with the PID, it names one process for good. None where there is no such process or no
    ``/proc`` (not Linux)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rpartition(")")[2].split()[19])  # fields after the name start at field 3


@functools.cache
def this_machine() -> str | None:
    """This process's boot and PID namespace (``boot_id:pidns inode``): two processes with one
    PID are one only on the same machine, in the same PID namespace (containers that share a
    host name need not). None where Linux's ``/proc`` does not say."""
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
        return f"{boot}:{os.stat('/proc/self/ns/pid').st_ino}"
    except OSError:
        return None


def holder_gone(held: LockInfo) -> bool:
    """The holder was a process on this machine (its host name, and where it recorded them,
    its boot and PID namespace) that no longer exists (killed, crashed): no process has its
    PID, or the one that has it is another (it started at another time)."""
    where = holder_pid(held)
    if where is None or where[0] != socket.gethostname():
        return False
    if held.machine is not None and held.machine != this_machine():
        return False
    try:
        os.kill(where[1], 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        pass
    started = process_start(where[1])
    return None not in (held.holder_started, started) and started != held.holder_started


class QueryLock:
    """``with QueryLock(path, query, operation, run_id):`` holds the lock, renewing it.

    The holder keeps its own deadline: the TTL from the moment it sent its last successful
    renewal, less a margin (:func:`holder_margin`), on a clock that goes on through a suspend
    (:func:`boot_clock`). Every destructive write the holder makes passes
    :meth:`ensure` first (:func:`stateops.core.fence.guard`), which refuses once the deadline
    is past, the lease was taken over or released, or the renewer is gone: a holder that
    stalled past its lease and resumed writes nothing more."""

    def __init__(
        self,
        path: Place,
        query: str,
        operation: str,
        run_id: str | None = None,
        ttl_seconds: float = LEASE_SECONDS,
        on_acquire: Callable[[LockInfo], None] | None = None,
    ) -> None:
        """``on_acquire``: called with this holder's record once the lease is taken and
        guarded (it fails the acquire, releasing the lease, when it fails)."""
        self.path = path if isinstance(path, S3Path) else Path(path)
        self._on_acquire = on_acquire
        self.query = query
        self.operation = operation
        self.run_id = run_id or new_run_id(operation)
        self.ttl = ttl_seconds
        self.token = uuid.uuid4().hex
        self.lost = False
        """Set once this holder may no longer hold the lease (why: :attr:`lost_why`): taken
        over, released, or its deadline passed; it stops writing, for good."""
        self.lost_why = ""
        self._trouble = ""  # the last failed renewal's error
        self.epoch = 0
        """The lease's epoch this holder took it at (S3; the local files keep none)."""
        self._confirmed = 0.0  # boot clock when the last renewal that found the lease ours was sent
        self._stop = threading.Event()
        self._renewer: threading.Thread | None = None

    def _info(self, acquired_at: float) -> LockInfo:
        return LockInfo(
            query=self.query,
            operation=self.operation,
            run_id=self.run_id,
            owner=f"{getpass.getuser()}@{socket.gethostname()}:{os.getpid()}",
            token=self.token,
            acquired_at=acquired_at,
            expires_at=time.time() + self.ttl + takeover_grace(self.ttl),
            holder_started=process_start(os.getpid()),
            ttl_seconds=self.ttl,
            machine=this_machine(),
        )

    def acquire(self) -> None:
        def decide(lease: _Lease) -> _Lease:
            _refuse_hold(lease, self.query, self.run_id)
            held = _alive(lease.lock)
            if held and held.token != self.token:
                raise LockHeldError(
                    f"query {self.query!r} is locked by {held.operation} (run {held.run_id}, "
                    f"{held.owner}) until {_until(held)}; "
                    f"wait for it to finish, or if it is dead: stateops lock release {self.query}"
                )
            ours = lease.lock is not None and lease.lock.token == self.token
            epoch = lease.epoch if ours else lease.epoch + 1
            return dataclasses.replace(lease, lock=self._info(time.time()), epoch=epoch)

        if isinstance(self.path, S3Path):
            require_conditional_writes(self.path)  # once per store, before the lease's time
        sent = boot_clock()
        self.epoch = _change(self.path, decide).epoch
        self._confirmed = sent
        self._stop.clear()
        self._renewer = threading.Thread(target=self._renew_loop, daemon=True)
        self._renewer.start()
        fence.hold(self.ensure)
        if self._on_acquire is not None:
            try:
                self._on_acquire(self._info(time.time()))
            except BaseException:
                self.release()
                raise

    @property
    def deadline(self) -> float:
        """On :func:`boot_clock`: after it, this holder may no longer hold the lease."""
        return self._confirmed + self.ttl - holder_margin(self.ttl)

    def _renew_loop(self) -> None:
        """Renew every TTL/3. A failed renewal (any error: a connection reset while the lease
        is read is no ``OSError``) is tried again soon, until the deadline: only a lease taken
        over or released, or a deadline passed, loses it."""
        wait = self.ttl / 3
        while not self._stop.wait(wait):
            try:
                self.renew()
                wait = self.ttl / 3
            except Exception as err:  # noqa: BLE001 (the deadline decides, below)
                wait = min(self.ttl / 12, 10.0)
                self._trouble = f"{type(err).__name__}: {err}"
            if self.lost:
                return
            if boot_clock() >= self.deadline:
                self._lose(f"no renewal succeeded in time; the last said {self._trouble}")
                return

    def renew(self) -> None:
        """Renew the lease now (a conditional write); sets ``lost`` when it is no longer ours."""

        def decide(lease: _Lease) -> _Lease | None:
            held = lease.lock
            if held is None or held.token != self.token:
                by = f"{held.operation} (run {held.run_id}, {held.owner})" if held else "nobody"
                self._lose(f"it is held by {by} now")
                return None
            return dataclasses.replace(lease, lock=self._info(held.acquired_at))

        sent = boot_clock()
        _change(self.path, decide)
        if not self.lost:
            self._confirmed = max(self._confirmed, sent)

    def _lose(self, why: str) -> None:
        if not self.lost:
            self.lost_why, self.lost = why, True

    def holds(self) -> bool:
        """Whether this holder may still hold the lease by what it knows, without asking the
        store: not lost, its deadline ahead, its renewer alive (otherwise it is lost now)."""
        if not self.lost:
            now = boot_clock()
            if now >= self.deadline:
                self._lose(f"its deadline passed {now - self.deadline:.0f} s ago (a stall?)")
            elif self._renewer is None or not self._renewer.is_alive():
                self._lose("its renewer is gone")
        return not self.lost

    def ensure(self, fresh: float = 1.0) -> None:
        """Right before a destructive write: raise :class:`LeaseLostError` (and set ``lost``)
        unless this holder still holds the lease (:meth:`holds`) and its token is still the
        lease's, asked of the store when it was last confirmed more than ``fresh`` seconds
        ago (0: now; a run's batch fence): a holder that stalled past its lease, or whose
        lease was taken over or released, writes nothing more."""
        if self.holds() and boot_clock() - self._confirmed >= min(fresh, self.ttl / 10):
            try:
                self.renew()
            except Exception:  # noqa: BLE001 (a store that does not answer: the deadline decides)
                pass
        if not self.holds():  # again: a renewal that failed slowly may have outlived it
            raise LeaseLostError(self.lost_line())

    def lost_line(self) -> str:
        """What a holder that lost the lease says, in one line, with what to do."""
        return (
            f"query {self.query!r}: this {self.operation} (run {self.run_id}) lost the "
            f"query's lease ({self.lost_why}) and stopped before its next write; see "
            f"stateops status {self.query}, then run the {self.operation} again once the lease "
            "is free: it goes on from where it stopped"
        )

    def release(self) -> None:
        """Give the lease back. A store that does not answer leaves it to lapse by itself
        (said in one line on stderr), and raises nothing: the operation's own outcome, an
        error it is leaving with included, is what its caller hears."""
        fence.drop(self.ensure)
        self._stop.set()
        if self._renewer:
            self._renewer.join()

        def decide(lease: _Lease) -> _Lease | None:
            mine = lease.lock is not None and lease.lock.token == self.token
            return dataclasses.replace(lease, lock=None) if mine else None

        try:
            _change(self.path, decide)
        except (StateOpsError, OSError) as err:
            print(
                f"query {self.query!r}: this {self.operation} (run {self.run_id}) could not "
                f"give its lease back ({one_line(err)}); it lapses by itself {self.ttl:g} s "
                "after its last renewal",
                file=sys.stderr,
            )

    def __enter__(self) -> QueryLock:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def force_release(path: Place, hold: bool = False) -> LockInfo | None:
    """Remove a lock whatever its owner, and with ``hold`` the hold too (an operator's
    decision; on S3 the epoch moves on, so a holder still running fails its next renewal);
    returns what was removed (the lock, else the hold). A hold is kept unless asked: it keeps
    a migration's or a backfill's query from others between its steps, and dropping it
    wastes every approval given so far."""
    was: list[LockInfo | None] = [None]

    def decide(lease: _Lease) -> _Lease:
        was[0] = lease.lock or (lease.hold if hold else None)
        kept = None if hold else lease.hold
        return _Lease(hold=kept, epoch=lease.epoch + 1, version=lease.version)

    _change(path, decide)
    return was[0]


def new_run_id(operation: str) -> str:
    """The one recipe for a run id outside Airflow (whose runs bring their own): the
    operation, the time and a random part (``cleanup-20261124T162000-3f9a1c``)."""
    return f"{operation}-{time.strftime('%Y%m%dT%H%M%S')}-{uuid.uuid4().hex[:6]}"
