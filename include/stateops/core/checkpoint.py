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

The files are listed by :mod:`stateops.core.listing`, parsed by :mod:`stateops.core.formats`;
:mod:`stateops.core.files` writes copies.
"""

from __future__ import annotations

import bisect
import json
import os
import re
import stat
import time
from dataclasses import dataclass, field
from pathlib import Path

from stateops.core.errors import CheckpointError, NotACheckpointError
from stateops.core.formats import (
    OffsetEntry,
    crc_sidecar,
    parse_commit,
    parse_offsets,
    parse_versioned_json,
    read_changelog_lineage,
    read_query_id,
    read_rocksdb_zip_metadata,
    read_text,
    schema_file_refs,
)
from stateops.core.storage import S3Path, file_names, location, prefetch, walk
from stateops.kinds import SOURCE_KINDS, SourceKind, kind_at
from stateops.kinds.files import log_offset

__all__ = [
    "Checkpoint",
    "OperatorState",
    "SnapshotGroup",
    "StoreState",
    "has_commit",
    "interrupted_batch",
    "load_checkpoint",
    "require_checkpoint_dir",
]


_VERSION_FILE = re.compile(r"^(\d+)\.(delta|snapshot|changelog|zip)$")
# Checkpoint format v2 names a version's files by the id of the task attempt that wrote them.
_V2_VERSION_FILE = re.compile(r"^(\d+)_([0-9a-f-]+)\.(changelog|zip)$")


_BATCH_FILE = re.compile(r"^(\d+)$")


_SOURCE_LOG_FILE = re.compile(r"^(\d+)(\.compact)?$")


_DEFAULT_STORE = "default"


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
    v2_files: dict[int, dict[str, dict[str, str]]] = field(default_factory=dict)
    """Checkpoint format v2: version -> unique id -> kind (zip, changelog) -> file. Several
    ids of one version can exist (a retried task's upload); the commit log names the one a
    batch uses."""

    @property
    def versions(self) -> list[int]:
        return sorted(set(self.deltas) | set(self.snapshots) | set(self.v2_files))

    def version_files(self, version: int) -> list[str]:
        """The files of one version: its delta (changelog) and/or its snapshot; in format v2,
        those of every id."""
        files = [f for f in (self.deltas.get(version), self.snapshots.get(version)) if f]
        return files + [
            rel for kinds in self.v2_files.get(version, {}).values() for rel in kinds.values()
        ]

    @property
    def zips(self) -> list[str]:
        """Every RocksDB snapshot (``N.zip``; in format v2 ``N_<id>.zip`` of every id)."""
        zips = [rel for rel in self.snapshots.values() if rel.endswith(".zip")]
        return zips + [
            kinds["zip"]
            for by_id in self.v2_files.values()
            for kinds in by_id.values()
            if "zip" in kinds
        ]

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
        versions = sorted(set(self.deltas) | set(self.snapshots))  # format v2: committed_view
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
        self._state_ids: dict[int, dict[tuple[int, int, str], str]] = {}
        self._kinds: dict[int, SourceKind] | None = None

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

    @property
    def format_version(self) -> int:
        """Spark's checkpoint format: 2 (``spark.sql.streaming.stateStore.
        checkpointFormatVersion=2``) when a commit names the state files its batch uses
        (``stateUniqueIds``) or a state file is named ``<version>_<id>``; else 1. The offsets
        log does not record the setting."""
        if any(commit.get("stateUniqueIds") for commit in self.commits.values()):
            return 2
        return 2 if any(s.v2_files for op in self.operators for s in op.stores) else 1

    def state_ids(self, batch: int) -> dict[tuple[int, int, str], str]:
        """Format v2: (operator, partition, store) -> the unique id of the state version that
        committed ``batch`` wrote (version ``batch + 1``), from its commit. A partition's ids
        follow its stores' names in order (a join's four stores sort as Spark lists them)."""
        if batch in self._state_ids:
            return self._state_ids[batch]
        ids = (self.commits.get(batch) or {}).get("stateUniqueIds") or {}
        named = {}
        for op in self.operators:
            for partition, store_ids in enumerate(ids.get(str(op.operator_id)) or []):
                for store_name, uid in zip(op.store_names, store_ids, strict=False):
                    named[(op.operator_id, partition, store_name)] = uid
        self._state_ids[batch] = named
        return named

    def committed_view(self, store: StoreState, keep: set[str] = frozenset()) -> StoreState:
        """The store as format v1 names it, one file set per version: in format v2, of each
        version the id that a file in ``keep`` has, else the id its commit names, else the
        only id when that commit has left the log. The files of other ids are not in the view:
        an attempt no commit names (a retried or failed task's upload). Format v1: ``store``."""
        if not store.v2_files:
            return store
        key = (store.operator_id, store.partition, store.store_name)
        view = StoreState(
            store.operator_id,
            store.partition,
            store.store_name,
            store.rel_dir,
            store.provider,
            other_files=store.other_files,
        )
        for version, by_id in store.v2_files.items():
            kept = [i for i, kinds in by_id.items() if keep & set(kinds.values())]
            if kept:
                uid = kept[0]
            elif version - 1 in self.commits:
                uid = self.state_ids(version - 1).get(key)
            else:
                uid = next(iter(by_id)) if len(by_id) == 1 else None
            kinds = by_id.get(uid, {})
            if "zip" in kinds:
                view.snapshots[version] = kinds["zip"]
            if "changelog" in kinds:
                view.deltas[version] = kinds["changelog"]
        return view

    def v2_load_chain(self, store: StoreState, version: int, uid: str | None):
        """Format v2: the files that load ``version`` with id ``uid`` (its zip; else the newest
        zip its changelog's lineage names, then the changelogs after it), and the names of
        missing ones."""

        def named(v: int, i: str, kind: str) -> str | None:
            return store.v2_files.get(v, {}).get(i, {}).get(kind)

        if uid is None:
            return [], [f"{store.rel_dir}: commit of batch {version - 1} names no state id"]
        if zip_rel := named(version, uid, "zip"):
            return [zip_rel], []
        changelog = named(version, uid, "changelog")
        if changelog is None:
            return [], [f"{store.rel_dir}/{version}_{uid}.changelog"]
        chain = [*read_changelog_lineage(self.root / changelog), (version, uid)]
        base = next((n for n in range(len(chain) - 1, -1, -1) if named(*chain[n], "zip")), None)
        files, missing = [], []
        if base is not None:
            files.append(named(*chain[base], "zip"))
        elif chain[0][0] != 1:
            missing.append(f"{store.rel_dir}/{chain[0][0]}_{chain[0][1]}.zip")
        for v, i in chain[(base + 1 if base is not None else 0) :]:
            rel = named(v, i, "changelog")
            if rel:
                files.append(rel)
            else:
                missing.append(f"{store.rel_dir}/{v}_{i}.changelog")
        return files, missing

    def partitions(self, batch: int | None) -> int | None:
        """The number of state partitions batch ``batch`` ran with: the partition count in its
        offsets entry, which a repartition (``stateops repartition``) changes from its batch
        on. Spark's v1 operator metadata keeps the count of batch 0 and is never rewritten, so
        it is not read for this. None when the log does not say."""
        entry = self.offsets.get(batch) if batch is not None else None
        return entry.partitions if entry is not None else None

    def repartition_batches(self) -> dict[int, tuple[int, int]]:
        """Batch -> (partitions before, after) for every batch whose partition count differs
        from the batch before it: the batches ``stateops repartition`` wrote."""
        changes = {}
        for b in sorted(self.offsets):
            before, after = self.partitions(b - 1), self.partitions(b)
            if before is not None and after is not None and before != after:
                changes[b] = (before, after)
        return changes

    def reads_store(self, store: StoreState, batch: int | None) -> bool:
        """Whether batch ``batch`` reads ``store``: a store of one of its partitions. After a
        repartition to fewer partitions the others stay behind until cleanup."""
        count = self.partitions(batch)
        return count is None or store.partition < count

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
                plain = next(
                    (log[i] for i in sorted(log) if i >= wanted and log[i].endswith(".compact")),
                    None,
                )
            if plain is None:
                raise CheckpointError(
                    f"{self.root}: sources/{source}/{wanted} is missing: the files batch "
                    f"{batch} read are no longer logged"
                )
            for line in read_text(self.root / plain).split("\n")[1:]:
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
            for line in read_text(self.root / log[i]).split("\n")[1:]:
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
        found = log_offset(offset)
        if found is not None:
            return found
        if offset is None and source < len(offsets) and self._file_source(source):
            # "-": the source had no offset yet (Spark writes it for a source without data in
            # the first batches; a carried-over batch 0 reads no input): nothing read so far.
            return -1
        return None

    def _file_source(self, source: int) -> bool:
        """True unless another batch shows ``source`` is not a file source."""
        seen = [
            e.source_offsets[source]
            for e in self.offsets.values()
            if source < len(e.source_offsets)
        ]
        return all(o is None or log_offset(o) is not None for o in seen)

    def entry(self, batch: int, source: int) -> object | None:
        """Source ``source``'s entry in ``offsets/<batch>`` (JSON; None: none)."""
        entry = self.offsets.get(batch)
        found = entry.source_offsets if entry else []
        return found[source] if source < len(found) else None

    def source_kinds(self) -> dict[int, SourceKind]:
        """The kind of each source the checkpoint's entries show (:func:`kind_at`), or, before
        its first batch is planned, that its ``sources/<i>/0`` shows (a kind that writes its
        start there); by the source's index (read once: a loaded checkpoint is a snapshot)."""
        if self._kinds is not None:
            return self._kinds
        found: dict[int, SourceKind] = {}
        for batch in sorted(self.offsets):
            for i, raw in enumerate(self.offsets[batch].source_offsets):
                kind = kind_at(raw)
                if kind is not None:
                    found[i] = kind
        for name in self.sources:
            if name.isdigit() and int(name) not in found:
                i = int(name)
                if self.offsets and self._file_source(i):
                    continue  # a file source's own log is not read for this
                kind = next((k for k in _starting_kinds() if self._initial(i, k) is not None), None)
                if kind is not None:
                    found[i] = kind
        self._kinds = dict(sorted(found.items()))
        return self._kinds

    def started(self, source: int) -> object | None:
        """The entry source ``source`` started at (its ``sources/<source>/0``, where its kind
        writes its start); None for another source, or when the file is gone."""
        kind = self.source_kinds().get(source)
        return None if kind is None else self._initial(source, kind)

    def _initial(self, source: int, kind: SourceKind) -> object | None:
        rel = self.sources.get(str(source), {}).get(0)
        if rel is None or rel.endswith(".compact"):
            return None
        return kind.initial(read_text(self.root / rel))

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

    def require_committed(self, batch: int, older: str) -> None:
        """Refuse a ``batch`` that is not a committed batch here; one that cleanup removed says
        so, and ``older`` (what to do instead)."""
        if self.commits and batch < min(self.commits):
            raise CheckpointError(
                f"{self.root}: batch {batch} is older than the oldest retained batch "
                f"({min(self.commits)}): cleanup removed it; {older}"
            )
        if batch not in self.commits or batch not in self.offsets:
            raise CheckpointError(
                f"{self.root}: batch {batch} is not a committed batch (last committed batch: "
                f"{self.last_committed_batch}); pick a batch listed by `stateops inspect`"
            )

    def restart_requirements(self, batch: int) -> tuple[list[str], list[str]]:
        """(files present that a restart after ``batch`` needs, with sidecars; needed but missing).

        Raises :class:`CheckpointError` when ``batch`` is not a committed batch.
        """
        self.require_committed(batch, "pick a later batch, or restore an older backup")
        needed = ["metadata", f"offsets/{batch}", f"commits/{batch}"]
        missing: list[str] = []
        # On restart Spark reads the previous batch's offsets as the committed start offsets.
        if batch > 0:
            needed.append(f"offsets/{batch - 1}")
        needed += self._source_log_files(batch, missing)
        version = batch + 1
        ids = self.state_ids(batch) if self.format_version == 2 else None
        for op in self.operators:
            needed += self._operator_metadata_files(op, batch)
            for store in [s for s in op.stores if self.reads_store(s, batch)]:
                chain, chain_missing = (
                    store.load_chain(version)
                    if ids is None
                    else self.v2_load_chain(
                        store, version, ids.get((op.operator_id, store.partition, store.store_name))
                    )
                )
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


def interrupted_batch(batch: int) -> str:
    """The one wording of a batch Spark planned (its offsets are written) and did not commit,
    for every refusal and warning that names one (each adds what to do about it)."""
    return f"batch {batch} is planned but not committed (a run was interrupted)"


def has_commit(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` holds a committed batch, from a listing of its ``commits/`` log alone
    (for a scheduled operation that skips a query which has not committed yet; the operation
    then loads the model itself)."""
    return any(_BATCH_FILE.match(name) for name in file_names(location(path) / "commits"))


def require_checkpoint_dir(path: str | os.PathLike[str] | S3Path) -> Path | S3Path:
    """``path`` (a folder, or an S3 prefix: :mod:`stateops.core.storage`) if it holds a
    checkpoint (a ``metadata`` file or an ``offsets/`` or ``commits/`` log), without reading
    it; else :class:`NotACheckpointError`.

    Cheap enough to call before anything is written beside a path the user typed.
    """
    root = location(path)
    if isinstance(root, S3Path):
        top = root.top_level()
        if not top:
            raise NotACheckpointError(
                f"{root}: no objects under this prefix; pass the query's checkpoint location"
            )
        if not top & {"metadata", "offsets", "commits", "state"}:
            raise NotACheckpointError(
                f"{root}: not a Spark checkpoint (no metadata file, no offsets/ or commits/)"
            )
        return root
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


# How many times a checkpoint in S3 is listed again when a file it listed is gone by the time
# it is read: a cleanup or rollback on another host deleting while it is read (an S3 listing
# and its reads are not one snapshot, as a local folder's are not either).
_LISTINGS = 3


def load_checkpoint(path: str | os.PathLike[str]) -> Checkpoint:
    """Read a checkpoint directory into a :class:`Checkpoint`.

    Raises :class:`CheckpointError` naming the file when the path is not a checkpoint or an
    offsets/commits/metadata file is corrupt.
    """
    root = require_checkpoint_dir(path)
    for attempt in range(_LISTINGS):
        sizes, dirs = walk(root)
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
        offset_files, commit_files = _batch_files(dirs, "offsets"), _batch_files(dirs, "commits")
        try:
            prefetch(root, ["metadata", *offset_files.values(), *commit_files.values()])
            break
        except FileNotFoundError as err:  # listed, then deleted before it was read
            if attempt == _LISTINGS - 1:
                raise CheckpointError(
                    f"{root}: its files were deleted while they were read ({err.filename}): "
                    "another process changes it (a cleanup or a rollback?); try again once "
                    "it ends"
                ) from None
            time.sleep(0.2 * (attempt + 1))  # let the deleting requests finish
    query_id = read_query_id(root / "metadata")
    offsets = {b: parse_offsets(root / rel, b) for b, rel in offset_files.items()}
    commits = {b: parse_commit(root / rel) for b, rel in commit_files.items()}
    return Checkpoint(
        root=root,
        query_id=query_id,
        sizes=sizes,
        offsets=offsets,
        commits=commits,
        sources=_source_logs(dirs),
        operators=_operators(root, dirs),
    )


def _batch_files(dirs: dict[str, list[str]], log: str) -> dict[int, str]:
    cut = len(log) + 1
    return {int(rel[cut:]): rel for rel in dirs.get(log, []) if rel[cut:].isdigit()}


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
            v2 = _V2_VERSION_FILE.match(name)
            if v2 is not None:
                version, uid, kind = v2.groups()
                store.v2_files.setdefault(int(version), {}).setdefault(uid, {})[kind] = rel
                kinds.add(kind)
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
        meta = parse_versioned_json(root / meta_rel, read_text(root / meta_rel))
        info = meta.get("operatorInfo")
        operator_name = info.get("operatorName") if isinstance(info, dict) else None
    return OperatorState(
        operator_id=op_id,
        operator_name=operator_name,
        stores=sorted(stores.values(), key=lambda s: (s.partition, s.store_name)),
        metadata_files=metadata_files,
        schema_files=schema_files,
    )


def _starting_kinds() -> list[SourceKind]:
    """The kinds that write a new source's start into ``sources/<i>/0``."""
    return [k for k in dict.fromkeys(SOURCE_KINDS.values()) if k.logs_start]
