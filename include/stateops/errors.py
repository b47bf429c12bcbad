"""Domain exceptions: each message says what is wrong and what to do."""

from __future__ import annotations

__all__ = [
    "CheckpointError",
    "LockHeldError",
    "NotACheckpointError",
    "RegistryError",
    "StateOpsError",
]


class StateOpsError(Exception):
    """Base of every error a user can meet; the CLI prints its message on one line."""


class CheckpointError(StateOpsError):
    """A path is not a readable Spark checkpoint, or one of its files is corrupt."""


class NotACheckpointError(CheckpointError):
    """The path does not exist or holds no Spark checkpoint at all (as opposed to a damaged one)."""


class RegistryError(StateOpsError):
    """The managed-query registry is missing, malformed or names an unknown query."""


class LockHeldError(StateOpsError):
    """Another lifecycle operation holds the query's lock."""
