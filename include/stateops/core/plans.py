"""How a plan reads, for every operation that changes a checkpoint, a sink or a backup store,
in the CLI and in the task log alike: its first line says whether anything changes
(``DRY RUN: nothing changed: ...`` or ``PLAN: ...``), its last three lines what cannot be
undone, where the backup goes and the exact command that undoes it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

DRY_RUN = "DRY RUN: nothing changed"


def plan_head(dry_run: bool, what: str) -> str:
    return f"{DRY_RUN if dry_run else 'PLAN'}: {what}"


def plan_tail(*, irreversible: str, backup: str, undo: str) -> list[str]:
    return [
        f"  irreversible: {irreversible}",
        f"  backup:       {backup}",
        f"  undo:         {undo}",
    ]


@dataclass(frozen=True)
class BackupFirst:
    """The backup an operation takes before it changes anything: where it goes (its plan shows
    it) and taking it (``backup()`` returns the backup id)."""

    to: str
    take: Callable[[], str]

    def __call__(self) -> str:
        return self.take()
