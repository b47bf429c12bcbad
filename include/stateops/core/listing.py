"""Every file of a local checkpoint with its size, fast: the directory walk the model is built on.

Most of a large checkpoint is ``state/<op>/<partition>/``: those folders are listed by GNU
``find`` (a stat per file in C, not in Python), by several processes at once; the few files
above them, and everything where ``find`` is missing or fails, by ``os.scandir``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

__all__ = [
    "local_files",
]


_FIND = shutil.which("find")


def local_files(root: Path) -> dict[str, int]:
    """Every regular file's size by relative path, in a local folder
    (:func:`stateops.core.storage.list_files` is the one for both kinds of storage).

    Most of a large checkpoint is ``state/<op>/<partition>/``: those folders are listed by GNU
    ``find`` (a stat per file in C, not in Python), by several processes at once; the few
    files above them, and everything where ``find`` is missing or fails (a file deleted during
    the listing), by ``os.scandir``.
    """
    sizes: dict[str, int] = {}
    subtrees = _scan(root, "", sizes, expand=lambda rel: rel == "state" or _is_operator(rel))
    if not subtrees:
        return sizes
    workers = min(len(subtrees), os.cpu_count() or 1, 4)
    batches = [subtrees[i::workers] for i in range(workers)]
    with ThreadPoolExecutor(workers) as pool:
        outputs = list(pool.map(lambda starts: _find(root, starts), batches))
    for starts, out in zip(batches, outputs, strict=True):
        if out is None:
            for rel in starts:
                _scan(root / rel, rel, sizes, expand=lambda _: True)
            continue
        parts = out.split("\0")
        sizes.update(zip(parts[1::2], map(int, parts[0:-1:2]), strict=True))
    return sizes


def _is_operator(rel: str) -> bool:
    parent, _, name = rel.rpartition("/")
    return parent == "state" and name.isdigit()


def _scan(directory: Path, rel_dir: str, sizes: dict[str, int], expand) -> list[str]:
    """Add the files under ``directory`` to ``sizes``, descending into the folders ``expand``
    accepts; return the relative paths of the others (for ``find``)."""
    left: list[str] = []
    stack = [(directory, rel_dir)]
    while stack:
        folder, rel_folder = stack.pop()
        prefix = rel_folder + "/" if rel_folder else ""
        with os.scandir(folder) as entries:
            for entry in entries:
                rel = prefix + entry.name
                if entry.is_dir(follow_symlinks=False):
                    if expand(rel) or _FIND is None or entry.name.startswith("-"):
                        stack.append((Path(entry.path), rel))
                    else:
                        left.append(rel)
                elif entry.is_file(follow_symlinks=False):
                    sizes[rel] = entry.stat(follow_symlinks=False).st_size
    return left


def _find(root: Path, starts: list[str]) -> str | None:
    """``size NUL path NUL`` for every file under ``starts`` (relative to ``root``), or None."""
    proc = subprocess.run(
        [_FIND, *starts, "-type", "f", "-printf", "%s\\0%p\\0"],
        cwd=root,
        capture_output=True,
    )
    return proc.stdout.decode("utf-8", "surrogateescape") if proc.returncode == 0 else None
