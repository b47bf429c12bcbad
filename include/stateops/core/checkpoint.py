"""The checkpoint model: what a Spark streaming checkpoint holds and what a restart needs.

Pure Python, no Spark. One directory walk builds the model; everything else is derived.

Layout (Spark 4.x, checkpoint format v1):

    metadata                       {"id": query id}
    offsets/N, commits/N           batch N planned / committed ("v1" header + JSON lines)
    sources/<i>/K[.compact]        source logs; a file source's K is its ``logOffset``
    state/<op>/_metadata/metadata  operator metadata v1 (most operators)
    state/<op>/_metadata/v2/B      operator metadata v2 (transformWithState), per batch B
    state/<op>/_stateSchema/<store>/B_<uuid>   state schema files (v3)
    state/<op>/<part>[/<store>]/   versions: HDFS ``V.delta``/``V.snapshot``,
                                   RocksDB ``V.changelog``/``V.zip`` + ``SSTs/*.sst``
    .<name>.crc                    checksum sidecar beside most files

State version V holds the state after batch V - 1, so a restart after batch N loads V = N + 1.
"""

from __future__ import annotations

import bisect
import json
import os
import re
import shutil
import stat
import struct
import subprocess
import zipfile
import zlib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from stateops.core.errors import CheckpointError, NotACheckpointError
from stateops.core.staging import occupied

__all__ = [
    "Checkpoint",
    "copy_restart_set",
    "crc_sidecar",
    "hadoop_crc",
    "has_commit",
    "OffsetEntry",
    "OperatorState",
    "SnapshotGroup",
    "StoreState",
    "load_checkpoint",
    "relocate_checkpoint",
    "relocated_metadata",
    "require_checkpoint_dir",
    "schema_file_refs",
]

_VERSION_FILE = re.compile(r"^(\d+)\.(delta|snapshot|changelog|zip)$")
_BATCH_FILE = re.compile(r"^(\d+)$")
_SOURCE_LOG_FILE = re.compile(r"^(\d+)(\.compact)?$")
_DEFAULT_STORE = "default"
_FIND = shutil.which("find")


@dataclass(frozen=True)
class OffsetEntry:
    """One parsed ``offsets/N`` file."""

    batch_id: int
    watermark_ms: int
    timestamp_ms: int
    conf: dict[str, str]
    source_offsets: list[dict | str | None]


@dataclass(frozen=True)
class SnapshotGroup:
    """A base (a full snapshot, or version 0 = empty) and the deltas/changelogs built on it.

    ``snapshot_version`` is 0 for the group that starts from an empty store. Loading any
    version in ``[snapshot_version, next group's snapshot_version)`` needs only this group.
    Sizes exclude RocksDB SST files, which several groups share.
    """

    snapshot_version: int
    versions: tuple[int, ...]
    files: tuple[str, ...]
    bytes: int


@dataclass
class StoreState:
    """The versioned files of one (operator, partition, store)."""

    operator_id: int
    partition: int
    store_name: str
    rel_dir: str
    provider: str
    deltas: dict[int, str] = field(default_factory=dict)
    snapshots: dict[int, str] = field(default_factory=dict)
    other_files: list[str] = field(default_factory=list)

    @property
    def versions(self) -> list[int]:
        return sorted(set(self.deltas) | set(self.snapshots))

    def version_files(self, version: int) -> list[str]:
        """The files of one version: its snapshot and/or its delta (changelog)."""
        return [f for f in (self.snapshots.get(version), self.deltas.get(version)) if f]

    def load_chain(self, version: int) -> tuple[list[str], list[str]]:
        """Files that load ``version`` (base snapshot first), and the names of missing ones."""
        if version == 0:
            return [], []
        bases = [v for v in self.snapshots if v <= version]
        base = max(bases) if bases else 0
        files = [self.snapshots[base]] if base else []
        missing = []
        for v in range(base + 1, version + 1):
            if v in self.deltas:
                files.append(self.deltas[v])
            else:
                kind = "changelog" if self.provider == "rocksdb" else "delta"
                missing.append(f"{self.rel_dir}/{v}.{kind}")
        return files, missing

    def snapshot_groups(self, sizes: dict[str, int]) -> list[SnapshotGroup]:
        """Groups by base: every file whose version lies in ``[base, next base)``.

        A base's own delta stays in its group, as Spark's own cleanup keeps it.
        """
        bases = sorted({0, *self.snapshots})
        versions = self.versions
        groups = []
        for i, base in enumerate(bases):
            lo = bisect.bisect_left(versions, base)
            hi = bisect.bisect_left(versions, bases[i + 1]) if i + 1 < len(bases) else None
            group = versions[lo:hi]
            if not group:
                continue
            files = [self.snapshots[v] for v in group if v in self.snapshots]
            files += [self.deltas[v] for v in group if v in self.deltas]
            size = sum(map(sizes.__getitem__, files))
            groups.append(SnapshotGroup(base, tuple(group), tuple(files), size))
        return groups


@dataclass
class OperatorState:
    """One stateful operator: ``state/<operator_id>/``."""

    operator_id: int
    operator_name: str | None
    stores: list[StoreState]
    metadata_files: dict[int | None, str]
    """Operator metadata: v1 ``_metadata/metadata`` under key None, v2 files by batch id."""
    schema_files: dict[str, int]
    """``_stateSchema`` files, relative path -> batch id that wrote them."""

    @property
    def provider(self) -> str:
        providers = {s.provider for s in self.stores}
        return providers.pop() if len(providers) == 1 else "mixed" if providers else "unknown"

    @property
    def num_partitions(self) -> int:
        return len({s.partition for s in self.stores})

    @property
    def store_names(self) -> list[str]:
        return sorted({s.store_name for s in self.stores})


class Checkpoint:
    """A parsed checkpoint directory. Build it with :func:`load_checkpoint`."""

    def __init__(
        self,
        root: Path,
        query_id: str,
        sizes: dict[str, int],
        offsets: dict[int, OffsetEntry],
        commits: dict[int, dict],
        sources: dict[str, dict[int, str]],
        operators: list[OperatorState],
    ) -> None:
        self.root = root
        self.query_id = query_id
        self.sizes = sizes
        self.offsets = offsets
        self.commits = commits
        self.sources = sources
        self.operators = operators
        self._zip_references: dict[str, list[str]] = {}

    @property
    def last_committed_batch(self) -> int | None:
        return max(self.commits) if self.commits else None

    @property
    def latest_offset_batch(self) -> int | None:
        return max(self.offsets) if self.offsets else None

    @property
    def uncommitted_batches(self) -> list[int]:
        """Batches planned (in ``offsets/``) after the last commit: a restart re-runs them."""
        last = self.last_committed_batch
        return sorted(b for b in self.offsets if last is None or b > last)

    @property
    def total_bytes(self) -> int:
        return sum(self.sizes.values())

    def gaps(self, log: str) -> list[int]:
        """Batch ids missing inside the ``offsets`` or ``commits`` chain."""
        ids = set(self.offsets if log == "offsets" else self.commits)
        if not ids:
            return []
        return [b for b in range(min(ids), max(ids) + 1) if b not in ids]

    def input_files(self, batch: int, source: int = 0) -> list[dict]:
        """The files file source ``source`` read in ``batch``: ``[{"path", "timestamp"}]``.

        A file source logs its files by its own ``logOffset``; batch N read the entries after
        batch N-1's logOffset up to its own, found in the plain log file or, once compacted,
        in the next ``.compact`` file.
        """
        if batch not in self.offsets:
            raise CheckpointError(f"{self.root}: batch {batch} is not in offsets/")
        upper = self._log_offset(batch, source)
        lower = self._log_offset(batch - 1, source) if batch > 0 else -1
        log = self.sources.get(str(source), {})
        entries: list[dict] = []
        for wanted in range(lower + 1, upper + 1):
            plain = log.get(wanted)
            if plain is None or plain.endswith(".compact"):
                plain = next((log[i] for i in sorted(log) if i >= wanted and
                              log[i].endswith(".compact")), None)  # fmt: skip
            if plain is None:
                raise CheckpointError(
                    f"{self.root}: sources/{source}/{wanted} is missing: the files batch "
                    f"{batch} read are no longer logged"
                )
            for line in _read_text(self.root / plain).split("\n")[1:]:
                try:
                    entry = json.loads(line) if line.strip() else None
                except ValueError:
                    raise CheckpointError(
                        f"{self.root / plain}: corrupt entry; restore the checkpoint from a backup"
                    ) from None
                if entry and entry.get("batchId") == wanted:
                    entries.append({"path": entry["path"], "timestamp": entry.get("timestamp")})
        return entries

    def seen_files(self, source: int = 0) -> set[str]:
        """Local paths of every file file source ``source`` has logged (read or planned): its
        latest ``.compact`` file holds all entries up to it, plain files the rest."""
        from urllib.parse import unquote, urlparse

        log = self.sources.get(str(source), {})
        compacts = [i for i, rel in log.items() if rel.endswith(".compact")]
        start = max(compacts) if compacts else min(log, default=0)
        seen = set()
        for i in sorted(i for i in log if i >= start):
            for line in _read_text(self.root / log[i]).split("\n")[1:]:
                try:
                    path = json.loads(line)["path"] if line.strip() else None
                except (ValueError, KeyError, TypeError):
                    raise CheckpointError(
                        f"{self.root / log[i]}: corrupt entry; restore the checkpoint from a backup"
                    ) from None
                if path:
                    seen.add(unquote(urlparse(path).path))
        return seen

    def file_log_offset(self, batch: int, source: int) -> int | None:
        """The ``logOffset`` of file source ``source`` in ``offsets/<batch>``; None for other
        sources (rate, Kafka), whose logs are keyed by batch id."""
        offsets = self.offsets[batch].source_offsets
        offset = offsets[source] if source < len(offsets) else None
        if isinstance(offset, dict) and "logOffset" in offset:
            return int(offset["logOffset"])
        if offset is None and source < len(offsets) and self._file_source(source):
            # "-": the source had no offset yet (Spark writes it for a source without data in
            # the first batches; a carried-over batch 0 reads no input): nothing read so far.
            return -1
        return None

    def _file_source(self, source: int) -> bool:
        """True unless another batch shows ``source`` is not a file source."""
        seen = [e.source_offsets[source] for e in self.offsets.values()
                if source < len(e.source_offsets)]  # fmt: skip
        return all(o is None or (isinstance(o, dict) and "logOffset" in o) for o in seen)

    def _log_offset(self, batch: int, source: int) -> int:
        if batch not in self.offsets:
            raise CheckpointError(
                f"{self.root}: offsets/{batch} is gone: where batch {batch + 1}'s input starts "
                "is unknown"
            )
        offset = self.file_log_offset(batch, source)
        if offset is None:
            raise CheckpointError(
                f"{self.root}: source {source} is not a file source; only file sources log "
                "the files of each batch"
            )
        return offset

    def restart_files(self, batch: int) -> list[str]:
        """The exact files (relative paths, sorted) a restart after committed ``batch`` needs.

        Raises :class:`CheckpointError` when ``batch`` is not committed or a needed file is
        missing, naming what is missing.
        """
        needed, missing = self.restart_requirements(batch)
        if missing:
            raise CheckpointError(
                f"{self.root}: a restart after batch {batch} needs files that are missing: "
                f"{', '.join(missing[:5])}{' ...' if len(missing) > 5 else ''}; "
                "restore the checkpoint from a backup"
            )
        return needed

    def restart_requirements(self, batch: int) -> tuple[list[str], list[str]]:
        """(files present that a restart after ``batch`` needs, with sidecars; needed but missing).

        Raises :class:`CheckpointError` when ``batch`` is not a committed batch.
        """
        if batch not in self.commits or batch not in self.offsets:
            committed = self.last_committed_batch
            raise CheckpointError(
                f"{self.root}: batch {batch} is not a committed batch "
                f"(last committed batch: {committed}); pick a batch listed by `stateops inspect`"
            )
        needed = ["metadata", f"offsets/{batch}", f"commits/{batch}"]
        missing: list[str] = []
        # On restart Spark reads the previous batch's offsets as the committed start offsets.
        if batch > 0:
            needed.append(f"offsets/{batch - 1}")
        needed += self._source_log_files(batch, missing)
        version = batch + 1
        for op in self.operators:
            needed += self._operator_metadata_files(op, batch)
            for store in op.stores:
                chain, chain_missing = store.load_chain(version)
                needed += chain
                missing += chain_missing
                needed += [f for f in store.other_files if f.endswith("/_metadata/schema")]
                for rel in chain:
                    if rel.endswith(".zip") and rel in self.sizes:
                        needed += self.rocksdb_zip_references(store, rel)
        missing += [f for f in needed if f not in self.sizes]
        present = {f for f in needed if f in self.sizes}
        present |= {crc_sidecar(f) for f in present if crc_sidecar(f) in self.sizes}
        return sorted(present), sorted(set(missing))

    def _source_log_files(self, batch: int, missing: list[str]) -> list[str]:
        files = []
        for name, log in sorted(self.sources.items()):
            upper = self.file_log_offset(batch, int(name)) if name.isdigit() else None
            if upper is None:
                # Other sources (rate, Kafka) log their initial offsets: keep what is there.
                files += [rel for i, rel in sorted(log.items()) if i <= batch]
                continue
            # A file source's log is keyed by its own logOffset, not by batch id, and a restart
            # reads its latest compaction plus every entry after it.
            compacts = [i for i, rel in log.items() if i <= upper and rel.endswith(".compact")]
            for i in range(max(compacts) if compacts else 0, upper + 1):
                if i in log:
                    files.append(log[i])
                else:
                    missing.append(f"sources/{name}/{i}")
        return files

    def _operator_metadata_files(self, op: OperatorState, batch: int) -> list[str]:
        files = []
        if None in op.metadata_files:
            files.append(op.metadata_files[None])
        v2 = [b for b in op.metadata_files if b is not None and b <= batch]
        if not v2:
            return files + [
                rel for rel, written_by in op.schema_files.items() if written_by <= batch
            ]
        rel = op.metadata_files[max(v2)]
        # The v2 metadata names the schema files it was written with; a missing one is flagged.
        return files + [rel] + sorted(schema_file_refs(self.root, rel, op.operator_id))

    def rocksdb_zip_references(self, store: StoreState, zip_rel: str) -> list[str]:
        """The SST and log files a RocksDB ``N.zip`` names (read once per checkpoint object:
        the restart sets of many batches share their base snapshot)."""
        if zip_rel in self._zip_references:
            return self._zip_references[zip_rel]
        meta = read_rocksdb_zip_metadata(self.root / zip_rel)
        try:
            refs = [
                f"{store.rel_dir}/SSTs/{f['dfsSstFileName']}" for f in meta.get("sstFiles", [])
            ] + [f"{store.rel_dir}/logs/{f['dfsLogFileName']}" for f in meta.get("logFiles", [])]
        except (KeyError, TypeError) as err:
            raise CheckpointError(
                f"{self.root / zip_rel}: corrupt RocksDB snapshot metadata ({err!r}); "
                "restore the checkpoint from a backup"
            ) from err
        self._zip_references[zip_rel] = refs
        return refs


def hadoop_crc(data: bytes, bytes_per_checksum: int = 512) -> bytes:
    """The ``.NAME.crc`` sidecar Hadoop's local file system writes (and checks on read)."""
    chunks = range(0, len(data), bytes_per_checksum)
    return (
        b"crc\x00"
        + struct.pack(">i", bytes_per_checksum)
        + b"".join(struct.pack(">I", zlib.crc32(data[i : i + bytes_per_checksum])) for i in chunks)
    )


def copy_restart_set(cp: Checkpoint, batch: int, dest: str | os.PathLike[str]) -> list[str]:
    """Copy the files a restart after ``batch`` needs into a new folder that Spark can run from.

    Operator metadata v2 (transformWithState) names its schema files by absolute path; a plain
    copy would keep reading (or fail on) the old folder, so those paths are rewritten to ``dest``
    and the rewritten files get fresh ``.crc`` sidecars. Returns the copied relative paths.
    """
    dest = Path(dest)
    if occupied(dest):
        raise CheckpointError(f"{dest}: not empty; copy a checkpoint into a new or empty folder")
    files = cp.restart_files(batch)
    for rel in files:
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(cp.root / rel, target)
    relocate_checkpoint(dest)
    return files


def relocate_checkpoint(
    root: str | os.PathLike[str], location: str | os.PathLike[str] | None = None
) -> list[str]:
    """Point the operator metadata v2 files of a copied checkpoint at its own schema files.

    ``transformWithState`` metadata names ``_stateSchema`` files by absolute path: after a copy
    or a restore they still name the old folder. ``location`` is where the checkpoint will
    live (default: ``root``; a restore stages elsewhere, then renames). Returns the rewritten
    relative paths.
    """
    root = Path(root).resolve()
    location = Path(location).resolve() if location is not None else root
    cp = load_checkpoint(root)
    rewritten = []
    for op in cp.operators:
        for key, rel in op.metadata_files.items():
            if key is not None:
                _relocate_schema_paths(root, rel, op.operator_id, location)
                rewritten.append(rel)
    return rewritten


def relocated_metadata(text: str, op_id: int, location: Path) -> bytes:
    """An operator metadata v2 file's content with its schema paths under ``location``."""
    header, _, body = text.partition("\n")
    meta = json.loads(body.split("\n")[0])
    marker = f"/state/{op_id}/_stateSchema/"
    for info in meta.get("stateStoreInfo", []):
        info["stateSchemaFilePaths"] = [
            f"file:{location}{marker}{str(p).rpartition(marker)[2]}"
            for p in info.get("stateSchemaFilePaths") or []
        ]
    return (header + "\n" + json.dumps(meta, separators=(",", ":"))).encode("utf-8")


def _relocate_schema_paths(root: Path, rel: str, op_id: int, location: Path) -> None:
    path = root / rel
    data = relocated_metadata(path.read_text(encoding="utf-8"), op_id, location)
    path.write_bytes(data)
    crc = root / crc_sidecar(rel)
    if crc.exists():
        crc.write_bytes(hadoop_crc(data))


def read_rocksdb_zip_metadata(path: Path) -> dict:
    """The ``metadata`` member of a RocksDB ``N.zip``: the SST and log files it refers to."""
    try:
        with zipfile.ZipFile(path) as zf:
            text = zf.read("metadata").decode("utf-8")
    except (zipfile.BadZipFile, KeyError, OSError) as err:
        raise CheckpointError(
            f"{path}: unreadable RocksDB snapshot ({err}); restore the checkpoint from a backup"
        ) from err
    return _parse_versioned_json(path, text)


def has_commit(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` holds a committed batch, from a listing of its ``commits/`` log alone
    (for a scheduled operation that skips a query which has not committed yet; the operation
    then loads the model itself)."""
    commits = Path(path) / "commits"
    try:
        return any(_BATCH_FILE.match(name) for name in os.listdir(commits))
    except (FileNotFoundError, NotADirectoryError):
        return False


def require_checkpoint_dir(path: str | os.PathLike[str]) -> Path:
    """``path`` if it is a folder that holds a checkpoint (a ``metadata`` file or an
    ``offsets/`` or ``commits/`` log), without reading it; else :class:`NotACheckpointError`.

    Cheap enough to call before anything is written beside a path the user typed.
    """
    root = Path(path)
    try:
        # stat, not is_dir(): is_dir() answers False for a link loop or a name too long, and
        # the user would read "no such directory" for a path that is there.
        is_dir = stat.S_ISDIR(root.stat().st_mode)
    except FileNotFoundError:
        raise NotACheckpointError(
            f"{root}: no such directory; pass the query's checkpoint location"
        ) from None
    if not is_dir:
        raise NotACheckpointError(
            f"{root}: a file, not a checkpoint directory; pass the query's checkpoint location"
        )
    if not any((root / name).exists() for name in ("metadata", "offsets", "commits", "state")):
        raise NotACheckpointError(
            f"{root}: not a Spark checkpoint (no metadata file, no offsets/ or commits/)"
        )
    return root


def load_checkpoint(path: str | os.PathLike[str]) -> Checkpoint:
    """Read a checkpoint directory into a :class:`Checkpoint`.

    Raises :class:`CheckpointError` naming the file when the path is not a checkpoint or an
    offsets/commits/metadata file is corrupt.
    """
    root = require_checkpoint_dir(path)
    sizes, dirs = _walk(root)
    has_logs = any(p.startswith(("offsets/", "commits/")) for p in sizes)
    if "metadata" not in sizes:
        if has_logs or any(p.startswith("state/") for p in sizes):
            raise CheckpointError(
                f"{root / 'metadata'}: missing, so the query id is lost; "
                "restore the checkpoint from a backup"
            )
        raise NotACheckpointError(
            f"{root}: not a Spark checkpoint (no metadata file, no offsets/ or commits/)"
        )
    query_id = _read_query_id(root / "metadata")
    offsets = {b: _parse_offsets(root / rel, b) for b, rel in _batch_files(dirs, "offsets").items()}
    commits = {b: _parse_commit(root / rel) for b, rel in _batch_files(dirs, "commits").items()}
    return Checkpoint(
        root=root,
        query_id=query_id,
        sizes=sizes,
        offsets=offsets,
        commits=commits,
        sources=_source_logs(dirs),
        operators=_operators(root, dirs),
    )


def _walk(root: Path) -> tuple[dict[str, int], dict[str, list[str]]]:
    """Sizes by relative path, and the relative paths by relative directory ("" is the root).

    The model keeps these very path objects (their hashes are computed once, and a plan on a
    large checkpoint looks each up several times).
    """
    sizes = _list_files(root)
    dirs: dict[str, list[str]] = {}
    for rel in sizes:
        parent = rel[: max(rel.rfind("/"), 0)]
        paths = dirs.get(parent)
        if paths is None:
            dirs[parent] = [rel]
        else:
            paths.append(rel)
    return sizes, dirs


def _list_files(root: Path) -> dict[str, int]:
    """Every regular file's size by relative path.

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


def crc_sidecar(rel: str) -> str:
    parent, _, name = rel.rpartition("/")
    return f"{parent}/.{name}.crc" if parent else f".{name}.crc"


def _batch_files(dirs: dict[str, list[str]], log: str) -> dict[int, str]:
    cut = len(log) + 1
    return {int(rel[cut:]): rel for rel in dirs.get(log, []) if rel[cut:].isdigit()}


def _read_text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise CheckpointError(f"{path}: unreadable ({err})") from err


def _read_query_id(path: Path) -> str:
    try:
        query_id = json.loads(_read_text(path))["id"]
    except (ValueError, KeyError, TypeError) as err:
        raise CheckpointError(
            f'{path}: corrupt query metadata (expected {{"id": ...}}); '
            "restore the checkpoint from a backup"
        ) from err
    return str(query_id)


def _parse_versioned_json(path: Path, text: str) -> dict:
    lines = text.split("\n")
    if not lines or not re.fullmatch(r"v\d+", lines[0].strip()):
        raise CheckpointError(
            f"{path}: corrupt (no version header); restore the checkpoint from a backup"
        )
    try:
        value = json.loads(lines[1]) if len(lines) > 1 and lines[1].strip() else None
    except ValueError as err:
        raise CheckpointError(
            f"{path}: corrupt JSON on line 2; restore the checkpoint from a backup"
        ) from err
    if not isinstance(value, dict):
        raise CheckpointError(f"{path}: corrupt (line 2 is not a JSON object)")
    return value


def _parse_commit(path: Path) -> dict:
    return _parse_versioned_json(path, _read_text(path))


def _parse_offsets(path: Path, batch_id: int) -> OffsetEntry:
    text = _read_text(path)
    meta = _parse_versioned_json(path, text)
    source_offsets: list[dict | str | None] = []
    for n, line in enumerate(text.split("\n")[2:], start=3):
        line = line.strip()
        if not line:
            continue
        if line == "-":
            source_offsets.append(None)
            continue
        try:
            source_offsets.append(json.loads(line))
        except ValueError:
            if line.startswith(("{", "[")):
                raise CheckpointError(
                    f"{path}: corrupt source offset on line {n}; "
                    "restore the checkpoint from a backup"
                ) from None
            source_offsets.append(line)
    try:
        return OffsetEntry(
            batch_id=batch_id,
            watermark_ms=int(meta.get("batchWatermarkMs", 0)),
            timestamp_ms=int(meta.get("batchTimestampMs", 0)),
            conf={str(k): str(v) for k, v in (meta.get("conf") or {}).items()},
            source_offsets=source_offsets,
        )
    except (AttributeError, TypeError, ValueError) as err:
        raise CheckpointError(
            f"{path}: corrupt batch metadata on line 2 ({err}); "
            "restore the checkpoint from a backup"
        ) from err


def _source_logs(dirs: dict[str, list[str]]) -> dict[str, dict[int, str]]:
    logs: dict[str, dict[int, str]] = {}
    for rel_dir, paths in dirs.items():
        parts = rel_dir.split("/")
        if len(parts) == 2 and parts[0] == "sources":
            for rel in paths:
                m = _SOURCE_LOG_FILE.match(rel[len(rel_dir) + 1 :])
                if m:
                    logs.setdefault(parts[1], {})[int(m.group(1))] = rel
    return logs


def schema_file_refs(root: Path, metadata_rel: str, op_id: int) -> set[str]:
    """Checkpoint-relative paths of the schema files a v2 operator metadata file names."""
    meta = _parse_versioned_json(root / metadata_rel, _read_text(root / metadata_rel))
    marker = f"/state/{op_id}/_stateSchema/"
    refs = set()
    try:
        for info in meta.get("stateStoreInfo", []):
            for p in info.get("stateSchemaFilePaths") or []:
                head, sep, tail = str(p).rpartition(marker)
                if not sep:
                    raise ValueError(p)
                refs.add(f"state/{op_id}/_stateSchema/{tail}")
    except (AttributeError, TypeError, ValueError) as err:
        raise CheckpointError(
            f"{root / metadata_rel}: corrupt operator metadata (schema file paths: {err}); "
            "restore the checkpoint from a backup"
        ) from err
    return refs


def _operators(root: Path, dirs: dict[str, list[str]]) -> list[OperatorState]:
    by_op: dict[int, dict[str, list[str]]] = {}
    for rel_dir, paths in dirs.items():
        parts = rel_dir.split("/", 2)
        if len(parts) >= 3 and parts[0] == "state" and parts[1].isdigit() and paths:
            by_op.setdefault(int(parts[1]), {})[parts[2]] = paths
    return [_operator(root, op_id, op_dirs) for op_id, op_dirs in sorted(by_op.items())]


def _operator(root: Path, op_id: int, op_dirs: dict[str, list[str]]) -> OperatorState:
    """Classify ``state/<op_id>/`` one directory at a time (``op_dirs``: sub-path -> paths)."""
    stores: dict[tuple[int, str], StoreState] = {}
    metadata_files: dict[int | None, str] = {}
    schema_files: dict[str, int] = {}
    base = f"state/{op_id}/"
    for sub, paths in op_dirs.items():
        parts = sub.split("/")
        rel_dir = base + sub
        cut = len(rel_dir) + 1
        names = [rel[cut:] for rel in paths]
        if parts[0] == "_metadata":
            if parts == ["_metadata"] and "metadata" in names:
                metadata_files[None] = rel_dir + "/metadata"
            elif parts == ["_metadata", "v2"]:
                metadata_files.update({int(n): f"{rel_dir}/{n}" for n in names if n.isdigit()})
            continue
        if parts[0] == "_stateSchema":
            for name in names:
                m = re.match(r"^(\d+)_", name)
                if m:
                    schema_files[f"{rel_dir}/{name}"] = int(m.group(1))
            continue
        if not parts[0].isdigit():
            continue
        # Stores other than "default" (e.g. the four of a stream-stream join) are subfolders.
        rest = parts[1:]
        store_name = _DEFAULT_STORE
        if rest and not rest[0].startswith("_") and rest[0] not in ("SSTs", "logs"):
            store_name, rest = rest[0], rest[1:]
        store_dir = base + parts[0] + ("" if store_name == _DEFAULT_STORE else "/" + store_name)
        store = stores.setdefault(
            (int(parts[0]), store_name),
            StoreState(op_id, int(parts[0]), store_name, store_dir, provider="unknown"),
        )
        if rest:  # SSTs/, logs/ and the like: no versions here
            store.other_files += [rel for rel in paths if not rel.endswith(".crc")]
            continue
        kinds = set()
        for name, rel in zip(names, paths, strict=True):
            if name.endswith(".crc"):
                continue
            m = _VERSION_FILE.match(name)
            if m is None:
                store.other_files.append(rel)
                continue
            version, kind = m.groups()
            kinds.add(kind)
            if kind == "delta" or kind == "changelog":
                store.deltas[int(version)] = rel
            else:
                store.snapshots[int(version)] = rel
        if kinds:
            store.provider = "rocksdb" if kinds & {"zip", "changelog"} else "hdfs"
    operator_name = None
    v2 = [k for k in metadata_files if k is not None]
    meta_rel = metadata_files.get(None) or (metadata_files[max(v2)] if v2 else None)
    if meta_rel:
        meta = _parse_versioned_json(root / meta_rel, _read_text(root / meta_rel))
        info = meta.get("operatorInfo")
        operator_name = info.get("operatorName") if isinstance(info, dict) else None
    return OperatorState(
        operator_id=op_id,
        operator_name=operator_name,
        stores=sorted(stores.values(), key=lambda s: (s.partition, s.store_name)),
        metadata_files=metadata_files,
        schema_files=schema_files,
    )
