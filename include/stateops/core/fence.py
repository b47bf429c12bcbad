"""The one guard every destructive write passes through: a holder that may have lost its
query's lease writes nothing more.

A lease excludes only holders that stop acting when they *might* have lost it (a process
paused, frozen or cut off past its lease resumes with the plan it made under it). So each
write that must not come from a stale holder calls :func:`guard` right before it: each delete
batch and upload batch (:mod:`stateops.core.storage`), each marker, switch and sink move. It
raises unless every lease this thread holds is still its own by the holder's own deadline
(:meth:`stateops.control.lock.QueryLock.ensure`); a thread that holds none passes.
"""

from __future__ import annotations

from collections.abc import Callable
from contextvars import ContextVar

__all__ = ["bound", "drop", "guard", "hold"]

# The checks of the leases this thread (this context) holds: each raises once its lease may
# be gone (LeaseLostError).
_HELD: ContextVar[tuple[Callable[[], None], ...]] = ContextVar("stateops_leases", default=())


def hold(ensure: Callable[[], None]) -> None:
    """From now on, :func:`guard` in this thread calls ``ensure`` (a lease just taken)."""
    _HELD.set((*_HELD.get(), ensure))


def drop(ensure: Callable[[], None]) -> None:
    """``ensure``'s lease is released: :func:`guard` calls it no more."""
    _HELD.set(tuple(e for e in _HELD.get() if e != ensure))


def guard() -> None:
    """Right before a destructive write: raise unless each lease this thread holds is still
    its own (none held: nothing to check)."""
    for ensure in _HELD.get():
        ensure()


def bound() -> Callable[[], None]:
    """:func:`guard` for the leases this thread holds now, to call from the worker threads it
    hands writes to (they do not share its context)."""
    held = _HELD.get()

    def check() -> None:
        for ensure in held:
            ensure()

    return check
