"""Where a checkpoint lives: the one seam between the operations and their files.

A checkpoint location is a local folder (:class:`pathlib.Path`) or an S3 prefix
(:class:`S3Path`, from an ``s3://`` or ``s3a://`` URL; ``s3a://`` is how Spark's S3 connector
names the same objects). :class:`S3Path` has the part of ``Path``'s interface the model and
the operations use (``/``, ``name``, ``parent``, ``read_bytes``, ``write_bytes``, ``exists``,
``unlink``, ``open("rb")``), so reading a checkpoint is one code path for both. What differs
is done here, once per kind of storage:

- :func:`list_files`: every file with its size (local: parallel ``find``; S3: paged
  ``ListObjectsV2`` of each state folder at once, the sizes from the listing, no HEAD);
- :func:`prefetch`: the small files a model reads (logs, metadata), fetched concurrently;
- :func:`delete_files`: local ``unlink``; S3 ``DeleteObjects`` of up to 1,000 keys a request;
- :func:`publish`: a checkpoint built in a local folder put into S3 whole (S3 has no rename).

S3 connection settings are those of :func:`stateops.core.s3.s3_settings` (the environment, or
the Airflow connection named by ``STATEOPS_CHECKPOINT_CONN_ID``); credentials are never
printed. Every S3 error leaves as one line (:func:`stateops.core.errors.s3_error`); throttling
is retried with backoff by botocore before it does.
"""

from __future__ import annotations

import functools
import html
import io
import os
import re
import shutil
import threading
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path, PurePosixPath
from types import SimpleNamespace
from typing import Any, BinaryIO
from urllib.parse import unquote_plus

from stateops.core import fence
from stateops.core.errors import StateOpsError
from stateops.core.listing import local_files

__all__ = [
    "S3Path",
    "begin_unfinished",
    "copy_to_local",
    "delete_files",
    "delete_keys",
    "end_unfinished",
    "file_names",
    "in_s3",
    "list_files",
    "location",
    "open_stream",
    "prefetch",
    "publish",
    "remove_all",
    "safe_relative_path",
    "same_endpoint",
    "spark_url",
    "unfinished",
    "upload",
    "request_count",
    "walk",
    "write_file",
]


_SCHEMES = ("s3://", "s3a://")
_DELETE_BATCH = 1000  # DeleteObjects takes at most 1,000 keys
_WORKERS = 16


def spark_url(path: str | os.PathLike[str] | S3Path) -> str:
    """How Spark names a checkpoint location: an S3 one through its S3A connector
    (``s3a://``, the ``hadoop-aws`` jar: docs/checkpoints-on-s3.md)."""
    text = str(path)
    return "s3a://" + text[len("s3://") :] if text.startswith("s3://") else text


def in_s3(path: str | os.PathLike[str] | S3Path) -> bool:
    """Whether ``path`` names a place in S3 (``s3://`` or ``s3a://``); no request is made."""
    return isinstance(path, S3Path) or str(path).startswith(_SCHEMES)


def location(path: str | os.PathLike[str] | S3Path) -> Path | S3Path:
    """The location object of a checkpoint path or URL."""
    if isinstance(path, S3Path | Path):
        return path
    text = os.fspath(path)
    if not text.startswith(_SCHEMES):
        return Path(text)
    bucket, _, key = text.split("://", 1)[1].partition("/")
    if not bucket:
        raise StateOpsError(f"{text}: no bucket; use s3://BUCKET/PREFIX")
    return S3Path(bucket, key.strip("/"), _bucket_client())


class _Client:
    """A boto3 client (thread-safe) for one set of S3 settings; every request it sends counts
    in :func:`request_count`."""

    def __init__(self, settings: Any) -> None:
        import botocore.handlers

        from stateops.core.s3 import s3_client

        self.endpoint = settings.endpoint_url or "AWS S3"
        self.s3 = s3_client(settings, retries=5)
        self.s3.meta.events.register("before-send.s3", _count)
        # botocore's check for an error inside a 200 answer parses a whole listing page; ours
        # calls it once the keys are out of the page (private name: if it goes, botocore's
        # own stays registered and only the speed is lost).
        check = getattr(botocore.handlers, "_handle_200_error", None)
        if check is not None:
            self.s3.meta.events.unregister("before-parse.s3.*", check)
        self.s3.meta.events.register_first(
            "before-parse.s3.*", functools.partial(_page_then_200_check, check)
        )

    def call(self, what: str, method: str, **kwargs: Any) -> Any:
        from botocore.exceptions import BotoCoreError, ClientError

        from stateops.core.errors import s3_error

        try:
            return getattr(self.s3, method)(**kwargs)
        except ClientError as err:
            code = err.response.get("Error", {}).get("Code")
            if code in ("NoSuchKey", "404", "NotFound"):
                raise FileNotFoundError(2, "no such object", what) from None
            raise s3_error(err, f"{what} at {self.endpoint}") from err
        except BotoCoreError as err:
            raise s3_error(err, f"{what} at {self.endpoint}") from err


_CONTENTS = re.compile(rb"<Contents>(.*?)</Contents>", re.S)
_KEY = re.compile(rb"<Key>(.*?)</Key>", re.S)
_SIZE = re.compile(rb"<Size>(\d+)</Size>")


def _page_then_200_check(
    check: Callable[..., None] | None,
    response_dict: dict,
    customized_response_dict: dict,
    operation_model: Any,
    **kwargs: Any,
) -> None:
    """Before botocore parses an answer: a listing page's keys and sizes are read here
    (``KeySizes``) and taken out of the page, then botocore's check for an error inside a 200
    answer runs on what is left. botocore's parser costs about 100 us a key, and its check
    parses the whole page once more: most of a large checkpoint's listing time otherwise.
    A cut-off page is left malformed for the check (it retries); errors are left whole."""
    if operation_model.name == "ListObjectsV2" and response_dict.get("status_code") == 200:
        body = response_dict["body"]
        decode = _url_key if b"<EncodingType>url</EncodingType>" in body else _xml_key
        customized_response_dict["KeySizes"] = [
            (decode(_KEY.search(entry)[1]), int(_SIZE.search(entry)[1]))
            for entry in _CONTENTS.findall(body)
        ]
        response_dict["body"] = _CONTENTS.sub(b"", body)
    if check is not None:
        check(operation_model=operation_model, response_dict=response_dict, **kwargs)


def _url_key(raw: bytes) -> str:
    return unquote_plus(raw.decode())


def _xml_key(raw: bytes) -> str:
    return html.unescape(raw.decode())


_CLIENTS: dict[Any, _Client] = {}
_LOCK = threading.Lock()
_REQUESTS = [0]
# A forked process (Airflow's LocalExecutor and Celery workers fork their tasks) makes its own
# clients: a parent's open connections are not to be shared.
os.register_at_fork(after_in_child=_CLIENTS.clear)


def _count(**_: Any) -> None:
    with _LOCK:
        _REQUESTS[0] += 1


def _bucket_client() -> _Client:
    """The client of the current settings (read each time: cheap, and a test or a task may
    change them), made once per settings."""
    from stateops.core.s3 import checkpoint_settings

    settings = checkpoint_settings()
    with _LOCK:
        if settings not in _CLIENTS:
            _CLIENTS[settings] = _Client(settings)
        return _CLIENTS[settings]


def request_count() -> int:
    """S3 requests this process has sent for checkpoints (for reports and benchmarks)."""
    return _REQUESTS[0]


class S3Path:
    """An object or prefix in S3, addressed like a local path.

    Reads of files that :func:`prefetch` fetched come from memory (one model's lifetime: the
    cache belongs to the root the model was built on and is shared by the paths made from it);
    writes and deletes go through to S3 and update it.
    """

    __slots__ = ("bucket", "key", "_client", "_cache")

    def __init__(
        self, bucket: str, key: str, client: _Client, cache: dict[str, bytes] | None = None
    ) -> None:
        self.bucket = bucket
        self.key = key
        self._client = client
        self._cache = {} if cache is None else cache

    # -- naming -----------------------------------------------------------------------------
    def __truediv__(self, rel: str | os.PathLike[str]) -> S3Path:
        rel = os.fspath(rel).strip("/")
        key = f"{self.key}/{rel}" if self.key else rel
        return S3Path(self.bucket, key, self._client, self._cache)

    def __str__(self) -> str:
        return f"s3://{self.bucket}/{self.key}" if self.key else f"s3://{self.bucket}"

    def __repr__(self) -> str:
        return f"S3Path({str(self)!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, S3Path) and (self.bucket, self.key) == (other.bucket, other.key)

    def __hash__(self) -> int:
        return hash((self.bucket, self.key))

    @property
    def name(self) -> str:
        return PurePosixPath(self.key).name

    @property
    def parent(self) -> S3Path:
        return S3Path(self.bucket, str(PurePosixPath(self.key).parent).lstrip("."), self._client)

    def with_name(self, name: str) -> S3Path:
        return self.parent / name

    def resolve(self) -> S3Path:
        return self

    # -- reading ----------------------------------------------------------------------------
    def read_bytes(self) -> bytes:
        cached = self._cache.get(self.key)
        if cached is not None:
            return cached
        body = self._client.call(f"read {self}", "get_object", Bucket=self.bucket, Key=self.key)
        return body["Body"].read()

    def read_text(self, encoding: str = "utf-8") -> str:
        return self.read_bytes().decode(encoding)

    def open(self, mode: str = "rb") -> io.BytesIO:
        if mode != "rb":
            raise ValueError(f"{self}: S3 objects are opened for reading only ('rb')")
        return io.BytesIO(self.read_bytes())

    def exists(self) -> bool:
        """An object, or a prefix with objects under it."""
        return self.key in self._cache or self._is_object() or self.is_dir()

    def is_dir(self) -> bool:
        """A prefix with files under it (S3's folders); directory markers are no files."""
        prefix = self.key.rstrip("/") + "/"
        listed = self._client.call(
            f"list {self}", "list_objects_v2", Bucket=self.bucket, Prefix=prefix, MaxKeys=8
        )
        if any(not key.endswith("/") for key, _ in listed["KeySizes"]):
            return True
        # a first page of markers only: the rest, markers left out, decides
        return bool(listed.get("IsTruncated")) and bool(self._list(prefix, delimiter=False)[0])

    def stat(self) -> SimpleNamespace:
        """``st_size`` and ``st_mtime`` (the object's last modification) of one object."""
        head = self._client.call(f"read {self}", "head_object", Bucket=self.bucket, Key=self.key)
        modified = head["LastModified"]
        return SimpleNamespace(st_size=head["ContentLength"], st_mtime=modified.timestamp())

    def top_level(self) -> set[str]:
        """The names right under this prefix (files and folders), from one listing."""
        base = self.key + "/" if self.key else ""
        files, folders = self._list(base, delimiter=True)
        return {k[len(base) :] for k in files} | {f[len(base) :].rstrip("/") for f in folders}

    def _is_object(self) -> bool:
        try:
            self._client.call(f"read {self}", "head_object", Bucket=self.bucket, Key=self.key)
        except FileNotFoundError:
            return False
        return True

    # -- writing ----------------------------------------------------------------------------
    def write_bytes(self, data: bytes) -> int:
        self._client.call(
            f"write {self}", "put_object", Bucket=self.bucket, Key=self.key, Body=data
        )
        self._cache.pop(self.key, None)
        return len(data)

    def write_text(self, text: str, encoding: str = "utf-8") -> int:
        return self.write_bytes(text.encode(encoding))

    # -- compare and swap (the control store: stateops.control.lock) -------------------------
    def read_versioned(self) -> tuple[bytes | None, str | None, float]:
        """The object's bytes, its version (ETag) and its age by the store's own clock (the
        answer's ``Date`` less the object's ``LastModified``: no client clock enters); (None,
        None, 0.0) where there is no object."""
        from datetime import UTC
        from email.utils import parsedate_to_datetime

        from botocore.exceptions import BotoCoreError

        from stateops.core.errors import s3_error

        try:
            got = self._client.call(f"read {self}", "get_object", Bucket=self.bucket, Key=self.key)
        except FileNotFoundError:
            return None, None, 0.0
        try:
            data = got["Body"].read()  # a connection reset here is no OSError
        except BotoCoreError as err:
            raise s3_error(err, f"read {self} at {self._client.endpoint}") from err
        said = parsedate_to_datetime(got["ResponseMetadata"]["HTTPHeaders"].get("date", ""))
        if said.tzinfo is None:  # "-0000": UTC, with no zone said
            said = said.replace(tzinfo=UTC)
        age = max((said - got["LastModified"]).total_seconds(), 0.0)
        return data, got["ETag"], age

    def write_if(self, data: bytes, version: str | None) -> bool:
        """Write ``data`` only over version ``version`` of the object (``If-Match``), or
        where there is none yet (``version`` None: ``If-None-Match: *``); False when another
        writer came first (412, or 409 for a write at the same moment; 404: the object went)."""
        from botocore.exceptions import BotoCoreError, ClientError

        from stateops.core.errors import s3_error

        condition = {"IfNoneMatch": "*"} if version is None else {"IfMatch": version}
        try:
            self._client.s3.put_object(Bucket=self.bucket, Key=self.key, Body=data, **condition)
        except ClientError as err:
            if err.response.get("ResponseMetadata", {}).get("HTTPStatusCode") in (404, 409, 412):
                return False
            raise s3_error(err, f"write {self} at {self._client.endpoint}") from err
        except BotoCoreError as err:
            raise s3_error(err, f"write {self} at {self._client.endpoint}") from err
        self._cache.pop(self.key, None)
        return True

    def write_own(self, data: bytes, version: str | None) -> bool:
        """:meth:`write_if`, with this write's own refusal told apart from another writer's:
        the SDK retries a PUT whose answer was lost (a timeout, a 5xx), and the retry of one
        the store applied finds this very write there and is refused (412). ``data`` must be
        this write's alone (an id of its own in it): True when the object now holds it."""
        return self.write_if(data, version) or self.read_versioned()[0] == data

    def unlink(self, missing_ok: bool = False) -> None:
        """S3 deletes a missing key without complaint; ``missing_ok=False`` checks first."""
        if not missing_ok and not self._is_object():
            raise FileNotFoundError(2, "no such object", str(self))
        self._client.call(f"delete {self}", "delete_object", Bucket=self.bucket, Key=self.key)
        self._cache.pop(self.key, None)

    # -- many at once -----------------------------------------------------------------------
    def _list(
        self, prefix: str, delimiter: bool, markers: bool = False
    ) -> tuple[dict[str, int], list[str]]:
        """Sizes by key and (with ``delimiter``) the sub-prefixes, every page of one prefix.
        Directory markers (the empty ``folder/`` objects Spark's S3A connector writes for each
        folder it makes) are no files: left out, unless ``markers``."""
        sizes: dict[str, int] = {}
        folders: list[str] = []
        kwargs: dict[str, Any] = {"Bucket": self.bucket, "Prefix": prefix}
        if delimiter:
            kwargs["Delimiter"] = "/"
        while True:
            page = self._client.call(
                f"list s3://{self.bucket}/{prefix}", "list_objects_v2", **kwargs
            )
            sizes.update(kv for kv in page["KeySizes"] if markers or not kv[0].endswith("/"))
            folders += [p["Prefix"] for p in page.get("CommonPrefixes", [])]
            if not page.get("IsTruncated"):
                return sizes, folders
            kwargs["ContinuationToken"] = page["NextContinuationToken"]


def list_files(root: Path | S3Path) -> dict[str, int]:
    """Every file's size by path relative to ``root``."""
    return local_files(root) if isinstance(root, Path) else _list_s3(root)


def walk(root: Path | S3Path) -> tuple[dict[str, int], dict[str, list[str]]]:
    """Sizes by relative path (:func:`list_files`), and the relative paths by relative
    directory ("" is the root).

    The model keeps these very path objects (their hashes are computed once, and a plan on a
    large checkpoint looks each up several times).
    """
    sizes = list_files(root)
    dirs: dict[str, list[str]] = {}
    for rel in sizes:
        parent = rel[: max(rel.rfind("/"), 0)]
        paths = dirs.get(parent)
        if paths is None:
            dirs[parent] = [rel]
        else:
            paths.append(rel)
    return sizes, dirs


def file_names(folder: Path | S3Path) -> list[str]:
    """The names of the files right in ``folder``; [] when it does not exist."""
    if isinstance(folder, S3Path):
        base = folder.key + "/"
        return [key[len(base) :] for key in folder._list(base, delimiter=True)[0]]
    try:
        with os.scandir(folder) as entries:
            return [e.name for e in entries if e.is_file(follow_symlinks=False)]
    except (FileNotFoundError, NotADirectoryError):
        return []


def write_file(path: Path | S3Path, text: str) -> None:
    """``text`` into the file ``path``: a local one's folders made first (an S3 prefix needs
    none; the object appears whole when written)."""
    if isinstance(path, Path):
        path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")


def remove_all(root: Path | S3Path) -> None:
    """Delete ``root`` and everything under it (for an S3 prefix: every object under it, the
    directory markers of Spark's S3A connector too)."""
    if isinstance(root, Path):
        fence.guard()
        shutil.rmtree(root)
        return
    base = root.key + "/" if root.key else ""
    delete_keys(root, sorted(root._list(base, delimiter=False, markers=True)[0]))


def delete_keys(root: S3Path, keys: list[str]) -> None:
    """Delete the objects of whole ``keys`` in ``root``'s bucket (a directory marker's key ends
    with ``/``, which a path relative to ``root`` cannot name), 1,000 a request."""
    for start in range(0, len(keys), _DELETE_BATCH):
        _delete_batch(root, keys[start : start + _DELETE_BATCH])


def _list_s3(root: S3Path) -> dict[str, int]:
    """The root's folders one level at a time down to ``state/<op>/``; then each folder below
    (a partition: most of a checkpoint's objects) listed whole, several at once."""
    base = root.key + "/" if root.key else ""
    sizes: dict[str, int] = {}
    whole: list[str] = []
    level = [base]
    while level:
        below = []
        for prefix in level:
            found, folders = root._list(prefix, delimiter=True)
            sizes.update(found)
            for folder in folders:
                rel = folder[len(base) :].rstrip("/")
                expand = rel == "state" or (rel.startswith("state/") and rel.count("/") == 1)
                (below if expand else whole).append(folder)
        level = below
    with ThreadPoolExecutor(min(_WORKERS, max(len(whole), 1))) as pool:
        for found, _ in pool.map(lambda prefix: root._list(prefix, delimiter=False), whole):
            sizes.update(found)
    return {key[len(base) :]: size for key, size in sizes.items()}


def open_stream(path: Path | S3Path) -> BinaryIO:
    """``path`` opened for reading in chunks (an S3 object is not read into memory first)."""
    if isinstance(path, Path):
        return path.open("rb")
    body = path._client.call(f"read {path}", "get_object", Bucket=path.bucket, Key=path.key)
    return body["Body"]


def same_endpoint(path: S3Path, client: Any) -> bool:
    """Whether ``client`` talks to the endpoint ``path`` is on (a server-side copy can go)."""
    return client.meta.endpoint_url == path._client.s3.meta.endpoint_url


_PUBLISHING = ".stateops-publishing"


def begin_unfinished(target: Path | S3Path) -> None:
    """Mark ``target`` (a folder or an S3 prefix that holds nothing, or what a killed writer
    left) as being written: a marker goes in first, :func:`end_unfinished` takes it out once
    the result is whole. What a killed writer left (:func:`unfinished`) is emptied first: it
    is ours to redo, and a marked prefix counts as empty
    (:func:`stateops.core.staging.has_entries`)."""
    if unfinished(target):
        remove_all(target)
    if isinstance(target, Path):
        target.mkdir(parents=True, exist_ok=True)
    fence.guard()
    (target / _PUBLISHING).write_bytes(b"")


def end_unfinished(target: Path | S3Path) -> None:
    """``target`` is whole: see :func:`begin_unfinished`."""
    fence.guard()
    (target / _PUBLISHING).unlink(missing_ok=True)


def unfinished(target: Path | S3Path) -> bool:
    """Whether ``target`` holds a result whose writer was killed before it finished
    (:func:`begin_unfinished`)."""
    marker = target / _PUBLISHING
    return marker.is_file() if isinstance(marker, Path) else marker._is_object()


def publish(staging: Path, target: S3Path, each: Callable[[str], None] = lambda rel: None) -> None:
    """Upload the checkpoint built in the local folder ``staging`` into the prefix ``target``,
    which holds nothing or an unfinished publish: the prefix is a checkpoint only once it is
    whole. ``metadata`` (what makes a prefix a checkpoint) goes last, inside
    :func:`begin_unfinished` and :func:`end_unfinished`. ``each(rel)`` after a file."""
    begin_unfinished(target)
    rels = sorted(str(p.relative_to(staging)) for p in staging.rglob("*") if p.is_file())
    last = [rel for rel in rels if rel in ("metadata", ".metadata.crc")]
    upload(staging, target, [rel for rel in rels if rel not in last], each)
    for rel in last:  # metadata after its checksum, one at a time
        upload(staging, target, [rel], each)
    end_unfinished(target)


def upload(
    local: Path, target: S3Path, rels: Iterable[str], each: Callable[[str], None] = lambda rel: None
) -> None:
    """Upload the files ``rels`` of the local folder ``local`` to the same names under
    ``target``, many at once; ``each(rel)`` after a file. Each upload passes the lease's
    guard first (:mod:`stateops.core.fence`)."""
    guard = fence.bound()

    def put(rel: str) -> None:
        guard()
        with (local / rel).open("rb") as body:
            dest = target / rel
            target._client.call(
                f"write {dest}", "put_object", Bucket=dest.bucket, Key=dest.key, Body=body
            )
        each(rel)

    with ThreadPoolExecutor(_WORKERS) as pool:
        list(pool.map(put, rels))


def copy_to_local(source: Path | S3Path, dest: Path) -> None:
    """One file of a checkpoint into a local file."""
    if isinstance(source, Path):
        shutil.copyfile(source, dest)
        return
    with open_stream(source) as body, dest.open("wb") as out:
        shutil.copyfileobj(body, out, 1 << 20)


def prefetch(root: Path | S3Path, rels: Iterable[str]) -> None:
    """Fetch ``rels`` into memory at once, for the reads that follow (S3 only: a local read is
    as fast as memory would be)."""
    if isinstance(root, Path):
        return
    wanted = [root / rel for rel in rels]
    with ThreadPoolExecutor(_WORKERS) as pool:
        for path, data in zip(wanted, pool.map(S3Path.read_bytes, wanted), strict=True):
            root._cache[path.key] = data


def delete_files(
    root: Path | S3Path, rels: Iterable[str], done: Callable[[int], None] = lambda n: None
) -> None:
    """Delete ``rels`` in their order (a file already gone counts as deleted); ``done(n)``
    after each file (local) or batch (S3) with the count so far. Each file (local) or batch
    (S3) passes the lease's guard first (:mod:`stateops.core.fence`)."""
    if isinstance(root, Path):
        for n, rel in enumerate(rels, 1):
            fence.guard()
            (root / rel).unlink(missing_ok=True)
            done(n)
        return
    batch: list[str] = []
    count = 0
    for rel in rels:
        batch.append((root / rel).key)
        if len(batch) == _DELETE_BATCH:
            count += _delete_batch(root, batch)
            done(count)
            batch = []
    if batch:
        count += _delete_batch(root, batch)
        done(count)


def _delete_batch(root: S3Path, keys: list[str]) -> int:
    fence.guard()
    answer = root._client.call(
        f"delete {len(keys)} objects under {root}",
        "delete_objects",
        Bucket=root.bucket,
        Delete={"Objects": [{"Key": k} for k in keys], "Quiet": True},
    )
    errors = answer.get("Errors") or []
    if errors:
        first = errors[0]
        raise StateOpsError(
            f"S3 delete under {root}: {len(errors)} of {len(keys)} objects not deleted "
            f"({first.get('Key')}: {first.get('Code')}); check the connection's permissions, "
            "then run again: it continues where it stopped"
        )
    for key in keys:
        root._cache.pop(key, None)
    return len(keys)


def safe_relative_path(path: str, within: str) -> PurePosixPath:
    """A relative path read from outside (a manifest's, an S3 key's) that stays inside
    ``within`` (what it is joined to, for the refusal), or a one-line refusal naming it."""
    p = PurePosixPath(path)
    if not path or p.is_absolute() or "\\" in path or ".." in p.parts:
        raise StateOpsError(f"path {path!r} escapes {within}: refused")
    return p
