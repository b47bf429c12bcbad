"""Fault injection for rehearsing crashes and stalls: SIGKILL, or SIGSTOP for a while, at a
chosen point of an operation.

Operations call :func:`point` at the few places where a crash matters (before each deletion,
after each upload, between a restore's staging and its swap, ...). It does nothing unless the
environment, read once here when the module is imported, asks for it:

- ``STATEOPS_KILL_AT=NAME:K``: the process kills itself with SIGKILL (no cleanup of its own, as
  a crashed machine or ``kill -9`` would leave it) when it reaches point NAME for the K-th time;
- ``STATEOPS_PAUSE_AT=NAME:K:SECONDS``: the process stops itself (SIGSTOP: every thread,
  its lease's renewer too, as a paused VM, a frozen container or a closed laptop would) when it
  reaches point NAME for the K-th time, and a helper process it starts just before sends it
  SIGCONT after SECONDS;
- ``STATEOPS_FAULT_TRACE=FILE``: each point reached is appended to FILE (``NAME K TIME``), so
  a rehearsal knows which points a run passes and where a kill at a random moment landed.

Points: ``upload`` (an object uploaded by a backup), ``manifest`` (a backup's objects are all
uploaded, its manifest not yet written), ``download`` (a restore's file downloaded), ``stage``
(a restore's staging folder verified, not yet swapped in), ``swap`` (the staging folder renamed
aside, the exchange with the target not yet done), ``marker`` (a rollback's or a
repartition's backup taken, its marker not yet written), ``finish`` (a repartition's audit
record written, its marker not yet removed), ``delete`` (a cleanup's, rollback's or undone
repartition's file about to be deleted), ``move`` (a rollback's sink folder or file about to
be moved aside), ``copy`` (a transplant's
file copied), ``renamed`` (a transplant's new checkpoint renamed into place), ``audit`` (an
audit record about to be appended), ``export`` (one state variable of an export written),
``prune`` (a prune's manifests read and its unreferenced objects chosen, nothing deleted yet).
``tests/faults`` kills every operation at these points and at random moments, then checks
that running it again finishes the job.
"""

from __future__ import annotations

import os
import signal
import time

from stateops.core.errors import StateOpsError

__all__ = ["fail_after", "point"]


def _kill_at(spec: str | None) -> tuple[str, int] | None:
    if not spec:
        return None
    name, _, k = spec.partition(":")
    if not name or not k.isdigit() or int(k) < 1:
        raise ValueError(f"STATEOPS_KILL_AT={spec!r}: expected NAME:K with K >= 1, e.g. delete:3")
    return name, int(k)


def _pause_at(spec: str | None) -> tuple[str, int, float] | None:
    if not spec:
        return None
    name, _, rest = spec.partition(":")
    k, _, seconds = rest.partition(":")
    try:
        if name and k.isdigit() and int(k) >= 1 and float(seconds) > 0:
            return name, int(k), float(seconds)
    except ValueError:
        pass
    raise ValueError(
        f"STATEOPS_PAUSE_AT={spec!r}: expected NAME:K:SECONDS with K >= 1, e.g. delete:1:30"
    )


_KILL_AT = _kill_at(os.environ.get("STATEOPS_KILL_AT"))
_PAUSE_AT = _pause_at(os.environ.get("STATEOPS_PAUSE_AT"))
_TRACE = os.environ.get("STATEOPS_FAULT_TRACE") or None
_ACTIVE = _KILL_AT is not None or _PAUSE_AT is not None or _TRACE is not None
_counts: dict[str, int] = {}


def point(name: str) -> None:
    """A point where a crash is rehearsed; free unless the environment asks for faults."""
    if _ACTIVE:
        _reach(name)


def _reach(name: str) -> None:
    k = _counts[name] = _counts.get(name, 0) + 1
    if _TRACE is not None:
        # One write per line on an O_APPEND descriptor: a line is whole even if killed next.
        fd = os.open(_TRACE, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            os.write(fd, f"{name} {k} {time.time():.6f}\n".encode())
        finally:
            os.close(fd)
    if _KILL_AT == (name, k):
        os.kill(os.getpid(), signal.SIGKILL)
    if _PAUSE_AT is not None and _PAUSE_AT[:2] == (name, k):
        _stall(_PAUSE_AT[2])


def _stall(seconds: float) -> None:
    """Stop this whole process for ``seconds``: a helper wakes it (nothing in it runs)."""
    import subprocess

    subprocess.Popen(  # noqa: S603 (fixed arguments)
        ["sh", "-c", f"sleep {seconds}; kill -CONT {os.getpid()}"],
        start_new_session=True,
        # none of this process's streams: a reader of its output sees it end when it ends
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    os.kill(os.getpid(), signal.SIGSTOP)


def fail_after(step: str) -> None:
    """With ``STATEOPS_FAIL_AFTER=<step>`` in the environment, the step fails once its work is
    done (failure-injection tests, game days): a migration step of the CLI as of the DAG, whose
    tasks call this from their ``post_execute``. Read at each call: a test sets it per run."""
    if os.environ.get("STATEOPS_FAIL_AFTER") == step:
        raise StateOpsError(f"injected failure after {step} (STATEOPS_FAIL_AFTER)")
