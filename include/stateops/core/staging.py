"""Target and staging folders: a result goes into a new or empty folder (:func:`occupied` says
where it may not), written in full beside its target, then renamed into place.

A staging folder is named ``<target>.<kind>-<stamp>`` and its run holds an exclusive ``flock``
on it for as long as it lives. The kernel drops that lock when the run dies, even by SIGKILL,
so the next run on the same target tells the folders of killed runs (removed) from those of
runs still going (left alone), and never touches anything that does not carry the name.
"""

from __future__ import annotations

import fcntl
import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from types import TracebackType

from stateops.core.storage import S3Path, location, unfinished

__all__ = [
    "Staging",
    "has_entries",
    "new_stamp",
    "occupied",
    "remove_stale_staging",
    "stale_staging",
]

# Microseconds since this module; whole seconds in staging folders of earlier versions.
_STAMP = r"\d{8}T\d{6}(\d{6})?Z"


def has_entries(path: str | os.PathLike[str] | S3Path) -> bool:
    """A folder with something in it (False: missing, a file, or an empty folder); an S3
    prefix with objects under it; but not what a killed writer left
    (:func:`storage.unfinished`: the next one empties it)."""
    path = location(path)
    filled = path.is_dir() and (isinstance(path, S3Path) or any(path.iterdir()))
    return filled and not unfinished(path)


def occupied(path: str | os.PathLike[str] | S3Path) -> bool:
    """Anything but a missing path or an empty folder: where a new result may not go."""
    path = location(path)
    if isinstance(path, S3Path):
        return has_entries(path)
    return path.exists() and (not path.is_dir() or any(path.iterdir()))


def new_stamp() -> str:
    return datetime.now(UTC).strftime("%Y%m%dT%H%M%S%fZ")


def _staging_folders(target: Path, kind: str) -> list[Path]:
    pattern = re.compile(re.escape(f"{target.name}.{kind}-") + _STAMP)
    try:
        names = os.listdir(target.parent)
    except FileNotFoundError:
        return []
    return sorted(
        target.parent / name
        for name in names
        if pattern.fullmatch(name)
        and (target.parent / name).is_dir()
        and not (target.parent / name).is_symlink()
    )


def _in_use(folder: Path) -> bool:
    """A live run holds the folder's flock (a flock conflicts across open files, so this is
    also true of the calling run's own staging folder)."""
    try:
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    except FileNotFoundError:
        return True  # gone meanwhile: nothing to remove
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # closing drops the probe's lock
    return False


def _named_after(target: str | os.PathLike[str] | S3Path) -> Path:
    """The path a target's staging folders are named after: the target's own; for an S3
    target (built locally, then published: storage.publish) the same key under the temp
    folder, so that a killed run's folder is found and removed as beside a local target."""
    target = location(target)
    if isinstance(target, S3Path):
        return Path(tempfile.gettempdir(), "stateops-staging", target.bucket, target.key)
    return target.absolute()


def stale_staging(target: str | os.PathLike[str] | S3Path, kind: str) -> list[Path]:
    """The staging folders of ``target`` that killed runs of ``kind`` left behind."""
    return [f for f in _staging_folders(_named_after(target), kind) if not _in_use(f)]


@contextmanager
def _folder_lock(folder: Path) -> Iterator[None]:
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def remove_stale_staging(target: str | os.PathLike[str] | S3Path, kind: str) -> list[str]:
    """Remove the staging folders killed runs of ``kind`` left beside ``target``; their paths."""
    target = _named_after(target)
    if not target.parent.is_dir():
        return []
    with _folder_lock(target.parent):
        return _remove_stale(target, kind)


def _remove_stale(target: Path, kind: str) -> list[str]:
    removed = []
    for folder in stale_staging(target, kind):
        shutil.rmtree(folder)
        removed.append(str(folder))
    return removed


class Staging:
    """``with Staging(target, "restoring") as s:`` write into ``s.path``, then rename it into
    place; an exception (not a kill) removes it. ``s.removed``: stale folders it removed."""

    def __init__(self, target: str | os.PathLike[str] | S3Path, kind: str) -> None:
        target = location(target)
        self.target = target.absolute() if isinstance(target, Path) else target
        self._named_after = _named_after(target)
        self.kind = kind
        self.stamp = new_stamp()
        self.path = self._named_after.with_name(f"{self._named_after.name}.{kind}-{self.stamp}")
        self.removed: list[str] = []
        self._fd: int | None = None

    def __enter__(self) -> Staging:
        here = self._named_after
        here.parent.mkdir(parents=True, exist_ok=True)
        # Under the parent's flock, another run cannot create its folder between our look for
        # stale ones and their removal (it would be new, unlocked for an instant, and removed).
        with _folder_lock(here.parent):
            self.removed = _remove_stale(here, self.kind)
            self.path.mkdir()
            self._fd = os.open(self.path, os.O_RDONLY | os.O_DIRECTORY)
            fcntl.flock(self._fd, fcntl.LOCK_EX)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc_type is not None or isinstance(self.target, S3Path):  # S3: published or not
            shutil.rmtree(self.path, ignore_errors=True)
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
