"""One lock per managed query, shared by every lifecycle operation (DAGs and CLI alike).

The lock is a JSON file (owner, run id, operation, expiry). Reads and writes of it happen under
an exclusive ``flock`` on a guard file beside it, so taking over an expired lock is atomic too.
A holder that crashes stops renewing; once ``expires_at`` passes, the next taker wins. On
the holder's own host a taker sees at once that its process is gone (``kill -9``) and wins:
no process has its PID, or the one that has it started after the lock's holder did (Linux
hands a dead process's PID to a new one, within minutes on a busy host: 32768 by default).

An operation made of several processes (a migration: one Airflow task per step) puts a *hold*
on the query (``<lock>.hold``): while it lasts, only locks taken with the holding run's id are
granted, so each step takes the lock for its own work and nothing else gets in between.
"""

from __future__ import annotations

import fcntl
import getpass
import json
import os
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

from stateops.core.errors import LockHeldError
from stateops.core.steps import safe_run_id

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
    "safe_run_id",
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

    @property
    def expired(self) -> bool:
        return time.time() >= self.expires_at


def read_lock(path: Path) -> LockInfo | None:
    """The current lock, or None when nobody holds it (an unreadable file counts as free)."""
    try:
        return LockInfo(**json.loads(path.read_text(encoding="utf-8")))
    except (OSError, ValueError, TypeError):
        return None


def live_lock(path: Path) -> LockInfo | None:
    """The lock while its holder holds it (not expired, its process not known to be gone)."""
    held = read_lock(path)
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


def read_hold(path: Path) -> LockInfo | None:
    """The hold on the query of lock ``path``, or None (an expired hold counts as none)."""
    held = read_lock(_hold_path(path))
    return None if held is None or held.expired else held


def _until(info: LockInfo) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(info.expires_at))


def _refuse_hold(path: Path, query: str, run_id: str) -> None:
    hold = read_hold(path)
    if hold and hold.run_id != run_id:
        raise LockHeldError(
            f"query {query!r} is held by {hold.operation} (run {hold.run_id}) until "
            f"{_until(hold)}; wait for that run to finish or roll back, or if it is dead: "
            f"stateops lock release {query}"
        )


def refuse_unholdable(path: Path, query: str, run_id: str) -> LockInfo | None:
    """Raise LockHeldError unless ``run_id`` may hold the query; returns a live query run's
    lock (a run does not block a hold: the holder stops it)."""
    _refuse_hold(path, query, run_id)
    held = live_lock(path)
    if held and held.operation != "run" and held.run_id != run_id:
        raise LockHeldError(
            f"query {query!r} is locked by {held.operation} (run {held.run_id}, "
            f"{held.owner}) until {_until(held)}; wait for it to finish"
        )
    return held


def hold_query(
    path: Path, query: str, operation: str, run_id: str, ttl_seconds: float = 6 * 3600
) -> LockInfo:
    """Hold the query for ``run_id`` (taken again by the same run: renewed).

    Refused while another run holds it, or while an operation other than a query run holds the
    lock (a run may go on: the holder stops it, then takes the lock with its own run id).
    """
    with _guarded(path):
        refuse_unholdable(path, query, run_id)
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
        target = _hold_path(path)
        tmp = target.with_name(f".{target.name}.tmp")
        tmp.write_text(json.dumps(asdict(info)), encoding="utf-8")
        os.replace(tmp, target)
    return info


def release_hold(path: Path, run_id: str) -> bool:
    """End ``run_id``'s hold; False when it held none."""
    with _guarded(path):
        held = read_lock(_hold_path(path))
        if held is None or held.run_id != run_id:
            return False
        _hold_path(path).unlink()
    return True


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


def holder_gone(held: LockInfo) -> bool:
    """The holder was a process on this host that no longer exists (killed, crashed): no
    process has its PID, or the one that has it is another (it started at another time)."""
    where = holder_pid(held)
    if where is None or where[0] != socket.gethostname():
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
    """``with QueryLock(path, query, operation, run_id):`` holds the lock, renewing it."""

    def __init__(
        self,
        path: Path,
        query: str,
        operation: str,
        run_id: str | None = None,
        ttl_seconds: float = 600.0,
    ) -> None:
        self.path = Path(path)
        self.query = query
        self.operation = operation
        self.run_id = run_id or new_run_id(operation)
        self.ttl = ttl_seconds
        self.token = uuid.uuid4().hex
        self.lost = False
        """Set when a renewal finds the lock gone or taken over: the holder should stop."""
        self._stop = threading.Event()
        self._renewer: threading.Thread | None = None

    def _write(self, acquired_at: float) -> None:
        info = LockInfo(
            query=self.query,
            operation=self.operation,
            run_id=self.run_id,
            owner=f"{getpass.getuser()}@{socket.gethostname()}:{os.getpid()}",
            token=self.token,
            acquired_at=acquired_at,
            expires_at=time.time() + self.ttl,
            holder_started=process_start(os.getpid()),
        )
        tmp = self.path.with_name(f".{self.path.name}.{self.token}.tmp")
        tmp.write_text(json.dumps(asdict(info)), encoding="utf-8")
        os.replace(tmp, self.path)

    def acquire(self) -> None:
        with _guarded(self.path):
            _refuse_hold(self.path, self.query, self.run_id)
            held = read_lock(self.path)
            if held and not held.expired and not holder_gone(held) and held.token != self.token:
                raise LockHeldError(
                    f"query {self.query!r} is locked by {held.operation} (run {held.run_id}, "
                    f"{held.owner}) until {_until(held)}; "
                    f"wait for it to finish, or if it is dead: stateops lock release {self.query}"
                )
            self._write(acquired_at=time.time())
        self._stop.clear()
        self._renewer = threading.Thread(target=self._renew_loop, daemon=True)
        self._renewer.start()

    def _renew_loop(self) -> None:
        while not self._stop.wait(self.ttl / 3):
            try:
                self.renew()
            except OSError:
                self.lost = True

    def renew(self) -> None:
        with _guarded(self.path):
            held = read_lock(self.path)
            if held and held.token == self.token:
                self._write(acquired_at=held.acquired_at)
            else:
                self.lost = True

    def release(self) -> None:
        self._stop.set()
        if self._renewer:
            self._renewer.join()
        with _guarded(self.path):
            held = read_lock(self.path)
            if held and held.token == self.token:
                self.path.unlink()

    def __enter__(self) -> QueryLock:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def force_release(path: Path) -> LockInfo | None:
    """Remove a lock and any hold whatever their owner (an operator's decision); returns what
    was there (the lock, else the hold)."""
    with _guarded(path):
        held = read_lock(path) or read_lock(_hold_path(path))
        path.unlink(missing_ok=True)
        _hold_path(path).unlink(missing_ok=True)
    return held


def new_run_id(operation: str) -> str:
    """The one recipe for a run id outside Airflow (whose runs bring their own): the
    operation, the time and a random part (``cleanup-20261124T162000-3f9a1c``)."""
    return f"{operation}-{time.strftime('%Y%m%dT%H%M%S')}-{uuid.uuid4().hex[:6]}"
