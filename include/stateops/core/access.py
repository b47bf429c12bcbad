"""Can this process delete and write what a plan names? Asked before the plan executes.

A destructive operation that fails half-way on a read-only file leaves work to resume (and,
for a rollback, a marker that keeps the query from starting). Asking first turns a read-only
checkpoint, an immutable file or a read-only file system into a refusal that changed nothing.

``os.access`` answers for the real user, as the kernel would: it says no for a read-only file
system and for an immutable file even to root, and to root it says yes for permission bits
(which root does not obey either).
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

from stateops.core.errors import PathError
from stateops.core.storage import in_s3

__all__ = ["refuse_unreadable", "refuse_unwritable", "write_problems"]


def _dir_writable(folder: Path) -> bool:
    return os.access(folder, os.W_OK | os.X_OK)


def _nearest_existing(path: Path) -> Path:
    for candidate in (path, *path.parents):
        if os.path.lexists(candidate):
            return candidate
    return Path("/")


def _why(path: Path) -> str:
    try:
        if os.statvfs(path).f_flag & os.ST_RDONLY:
            return "on a read-only file system"
    except OSError:
        pass
    return "not writable by this user (permissions, or an immutable attribute: see lsattr)"


def _local(paths: Iterable[str | os.PathLike[str]]) -> list[str | os.PathLike[str]]:
    """The local ones of ``paths``: S3 has no file modes to check (its refusals come from the
    endpoint, as one line, when the request is made)."""
    return [p for p in paths if not in_s3(p)]


def write_problems(
    delete: Iterable[str | os.PathLike[str]] = (),
    write: Iterable[str | os.PathLike[str]] = (),
    move: Iterable[str | os.PathLike[str]] = (),
) -> list[tuple[Path, str]]:
    """(path, why) for each path that could not be deleted, written or moved; [] when all can.

    ``delete``: files to unlink (the file and its folder must be writable: a read-only file in
    a writable folder is a file someone meant to keep). ``write``: files to create or replace,
    their folders created as needed. ``move``: files or folders to rename to another folder.
    """
    problems: list[tuple[Path, str]] = []
    checked: dict[Path, bool] = {}
    delete, write, move = _local(delete), _local(write), _local(move)

    def folder_ok(folder: Path) -> bool:
        if folder not in checked:
            checked[folder] = _dir_writable(folder)
        return checked[folder]

    for raw in delete:
        path = Path(raw)
        if not os.path.lexists(path):
            continue  # already gone: a killed run deleted it
        if not folder_ok(path.parent):
            problems.append((path.parent, _why(path.parent)))
        elif not os.access(path, os.W_OK, follow_symlinks=False):
            problems.append((path, _why(path)))
    for raw in move:
        path = Path(raw)
        if not os.path.lexists(path):
            continue
        if not folder_ok(path.parent):
            problems.append((path.parent, _why(path.parent)))
        # Moving a folder to another parent rewrites its "..": it must be writable itself.
        elif path.is_dir() and not os.access(path, os.W_OK):
            problems.append((path, _why(path)))
    for raw in write:
        path = Path(raw)
        if os.path.lexists(path):
            if not os.access(path, os.W_OK) or not folder_ok(path.parent):
                problems.append((path, _why(path)))
            continue
        existing = _nearest_existing(path.parent)
        if not existing.is_dir():
            problems.append((existing, "a file where a folder is needed"))
        elif not folder_ok(existing):
            problems.append((existing, _why(existing)))
    seen: set[Path] = set()
    return [(p, why) for p, why in problems if not (p in seen or seen.add(p))]


def refuse_unwritable(
    what: str,
    delete: Iterable[str | os.PathLike[str]] = (),
    write: Iterable[str | os.PathLike[str]] = (),
    move: Iterable[str | os.PathLike[str]] = (),
) -> None:
    """Raise :class:`PathError` (one line: the first path, why, how many) when any path of a
    plan could not be changed; ``what`` names the operation and its target."""
    problems = write_problems(delete, write, move)
    if not problems:
        return
    path, why = problems[0]
    more = f" (and {len(problems) - 1} more paths)" if len(problems) > 1 else ""
    raise PathError(
        f"{what}: refused before changing anything: {path} is {why}{more}; make the checkpoint "
        "and its .audit folder writable (or run as their owner), then run again"
    )


def refuse_unreadable(what: str, paths: Iterable[str | os.PathLike[str]]) -> None:
    """Raise :class:`PathError` (one line) when any of ``paths`` could not be read: checked
    before work that reads them in another process (a Spark job) and would fail half-way."""
    unreadable = [Path(p) for p in _local(paths) if not os.access(p, os.R_OK)]
    if unreadable:
        more = f" (and {len(unreadable) - 1} more files)" if len(unreadable) > 1 else ""
        raise PathError(
            f"{what}: {unreadable[0]} is not readable by this user{more}; run as a user who "
            "may read the checkpoint, or change its permissions"
        )
