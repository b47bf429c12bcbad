"""The checkpoint listing: `find` in parallel, `os.scandir` as the fallback, same answer."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from stateops.core import listing

pytestmark = pytest.mark.unit


@pytest.fixture
def tree(tmp_path: Path) -> tuple[Path, dict[str, int]]:
    """Files at every level the listing treats differently, with awkward names."""
    root = tmp_path / "ck"
    files = {
        "metadata": 10,
        "offsets/0": 3,
        "offsets/.0.crc": 12,
        "sources/0/0.compact": 7,
        "state/0/_metadata/metadata": 5,
        "state/0/0/1.delta": 100,
        "state/0/0/.1.delta.crc": 12,
        "state/0/0/with space.tmp": 1,
        "state/0/0/new\nline": 2,
        "state/0/1/SSTs/000008-x.sst": 4096,
        "state/0/1/left/right/2.zip": 0,
        "state/0/-dash/1.delta": 9,
        "state/1/0/3.snapshot": 33,
        "state/loose": 8,
    }
    for rel, size in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"x" * size)
    odd = os.fsencode(root / "state/0/0") + b"/\xff.delta"  # not UTF-8
    Path(os.fsdecode(odd)).write_bytes(b"yy")
    files[os.fsdecode(b"state/0/0/\xff.delta")] = 2
    (root / "state/0/2").mkdir()  # empty partition
    (root / "state/0/0/link").symlink_to(root / "metadata")  # not a regular file
    return root, files


def test_find_and_scandir_list_the_same_files_and_sizes(tree, monkeypatch):
    root, expected = tree
    assert listing._FIND is not None, "GNU find is part of the machine this runs on"
    assert listing.local_files(root) == expected
    monkeypatch.setattr(listing, "_FIND", None)
    assert listing.local_files(root) == expected


def test_a_failing_find_falls_back_to_scandir(tree, monkeypatch):
    root, expected = tree
    calls = []

    def failing(root_, starts):
        calls.append(starts)
        return None  # what _find returns when find exits non-zero

    monkeypatch.setattr(listing, "_find", failing)
    assert listing.local_files(root) == expected
    assert calls, "the state partitions are listed by find first"
