"""The S3 side of the storage seam against a real S3 API (rclone serve s3 on loopback): a
listing has every key and size, whatever characters a key has and however many pages it
takes; a listing page cut off, or a 200 answer that carries an error (as S3 sometimes sends),
is tried again, never read as a shorter listing."""

from __future__ import annotations

from pathlib import Path

import pytest

from stateops.core import storage
from stateops.dev.s3server import free_port
from tests.conftest import S3Server
from tests.s3proxy import S3Proxy

pytestmark = pytest.mark.unit

FILES = {
    "metadata": 10,
    "offsets/0": 3,
    "offsets/.0.crc": 12,
    "state/0/0/with space.tmp": 1,
    "state/0/0/a&b<c>'\"q.delta": 4,  # XML's special characters
    "state/0/0/plus+percent%41.delta": 5,  # URL encoding's
    "state/0/1/ünï.delta": 6,
    "state/0/1/SSTs/000008-x.sst": 4096,
    "state/1/0/3.snapshot": 33,
    "state/loose": 8,
    **{f"commits/{b}": 2 + b % 3 for b in range(1100)},  # two pages of a level
    **{f"state/0/3/{v}.delta": v % 7 for v in range(1, 1201)},  # two pages of a partition
}
URL = "s3://backups/ck"


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """The files in a bucket of a fresh S3 server (written before it starts: rclone lists
    what was there at its start)."""
    root = tmp_path_factory.mktemp("served")
    for rel, size in FILES.items():
        path = root / "backups" / "ck" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"x" * size)
    server = S3Server(root, free_port())
    server.start()
    yield server
    server.stop()


@pytest.fixture
def endpoint(served, monkeypatch):
    """Point the storage seam at ``endpoint(url)``: the server, or a proxy in front of it."""

    def point(url: str) -> None:
        for name, value in {**served.env(), "STATEOPS_S3_ENDPOINT_URL": url}.items():
            monkeypatch.setenv(name, value)

    return point


def test_a_listing_has_every_key_and_size_in_any_characters_over_pages(served, endpoint):
    endpoint(served.endpoint)
    before = storage.request_count()
    assert storage.list_files(storage.location(URL)) == FILES
    assert storage.request_count() - before > 4  # levels and partitions, two pages of each
    names = storage.file_names(storage.location(URL) / "commits")
    assert sorted(names) == sorted(rel[len("commits/") :] for rel in FILES if "commits/" in rel)


def test_a_page_cut_off_or_an_error_in_a_200_answer_is_tried_again(served, endpoint):
    spoiled = []

    def meddle(command: str, path: str, forward):
        status, headers, body = forward()
        if "list-type=2" in path and "state%2F0%2F3" in path and len(spoiled) < 2:
            # Once the page cut off mid-way, once an error inside a 200 answer.
            spoiled.append(path)
            error = b"<Error><Code>InternalError</Code><Message>again</Message></Error>"
            body = body[: len(body) // 2] if len(spoiled) == 1 else error
        return status, headers, body

    proxy = S3Proxy(served.port, meddle)
    try:
        endpoint(proxy.endpoint)
        assert storage.list_files(storage.location(URL)) == FILES
    finally:
        proxy.shutdown()
    assert len(spoiled) == 2


def test_the_storage_path_reads_writes_and_removes_an_object(served, endpoint, tmp_path: Path):
    endpoint(served.endpoint)
    path = storage.location(URL) / "scratch" / "note"
    assert not path.exists()
    path.write_text("hello")
    assert path.read_text() == "hello" and path.stat().st_size == 5
    storage.remove_all(storage.location(URL) / "scratch")
    assert not path.exists()
