"""The checkpoint's file formats, read (and the ``.crc`` sidecars, written): versioned JSON logs
(``offsets/N``, ``commits/N``, operator metadata), the query ``metadata``, RocksDB ``N.zip``
metadata, schema file references, Hadoop's checksum sidecars. Each corrupt file is a
:class:`CheckpointError` naming it.
"""

from __future__ import annotations

import json
import re
import struct
import zipfile
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from stateops.core.errors import CheckpointError

__all__ = [
    "EXTRA_KEY_FIELDS",
    "OffsetEntry",
    "crc_sidecar",
    "hadoop_crc",
    "parse_commit",
    "parse_offsets",
    "parse_versioned_json",
    "partitioning_fields",
    "read_query_id",
    "read_rocksdb_zip_metadata",
    "read_text",
    "schema_file_refs",
    "spark_temp_file",
]


@dataclass(frozen=True)
class OffsetEntry:
    """One parsed ``offsets/N`` file."""

    batch_id: int
    watermark_ms: int
    timestamp_ms: int
    conf: dict[str, str]
    source_offsets: list[dict | str | None]

    @property
    def partitions(self) -> int | None:
        """The state partition count the batch ran with (its ``spark.sql.shuffle.partitions``,
        which a repartition changes); None when the entry does not say."""
        value = self.conf.get("spark.sql.shuffle.partitions")
        return int(value) if value and value.isdigit() else None


def hadoop_crc(data: bytes, bytes_per_checksum: int = 512) -> bytes:
    """The ``.NAME.crc`` sidecar Hadoop's local file system writes (and checks on read)."""
    chunks = range(0, len(data), bytes_per_checksum)
    return (
        b"crc\x00"
        + struct.pack(">i", bytes_per_checksum)
        + b"".join(struct.pack(">I", zlib.crc32(data[i : i + bytes_per_checksum])) for i in chunks)
    )


def crc_sidecar(rel: str) -> str:
    parent, _, name = rel.rpartition("/")
    return f"{parent}/.{name}.crc" if parent else f".{name}.crc"


_SPARK_TEMP = re.compile(r"\..+\.[0-9a-f]{8}(-[0-9a-f]{4}){3}-[0-9a-f]{12}\.tmp")


def spark_temp_file(rel: str) -> bool:
    """Whether ``rel`` is the temporary file of Spark's atomic checkpoint write
    (``.NAME.UUID.tmp``, renamed to NAME when the write completes). A stop or a crash in the
    middle of a write can leave one behind, with a partial ``.crc`` sidecar; Spark never
    reads it."""
    return bool(_SPARK_TEMP.fullmatch(rel.rpartition("/")[2]))


def read_rocksdb_zip_metadata(path: Path) -> dict:
    """The ``metadata`` member of a RocksDB ``N.zip``: the SST and log files it refers to."""
    try:
        with path.open("rb") as f, zipfile.ZipFile(f) as zf:
            text = zf.read("metadata").decode("utf-8")
    except (zipfile.BadZipFile, KeyError, OSError) as err:
        raise CheckpointError(
            f"{path}: unreadable RocksDB snapshot ({err}); restore the checkpoint from a backup"
        ) from err
    return parse_versioned_json(path, text)


def read_changelog_lineage(path: Path) -> list[tuple[int, str]]:
    """The lineage at the head of a RocksDB changelog of checkpoint format v2 (writer version
    v3 or v4): the (version, unique id) of each state version it builds on, oldest first, back
    to a snapshot or to version 1 (docs/checkpoint-format-v2.md)."""
    try:
        with path.open("rb") as f:
            head = b""
            for block in _lz4_blocks(f):  # only as many blocks as the head spans
                head += block
                header, rest = _java_utf(head)
                if len(rest) >= 2 and len(rest) >= 2 + struct.unpack_from(">H", rest)[0]:
                    break
        if header not in ("v3", "v4"):
            raise ValueError(f"changelog version {header!r} has no lineage")
        lineage = json.loads(_java_utf(rest)[0])
        return [(int(e["version"]), str(e["checkpointUniqueId"])) for e in lineage]
    except (OSError, ValueError, KeyError, TypeError, IndexError, struct.error) as err:
        raise CheckpointError(
            f"{path}: unreadable changelog lineage ({err}); restore the checkpoint from a backup"
        ) from err


_LZ4_MAGIC = b"LZ4Block"


def _lz4_blocks(f: BinaryIO) -> Iterator[bytes]:
    """The blocks of a file Spark compressed with its default ``lz4`` codec (Java's
    LZ4BlockOutputStream framing: magic, token, compressed and plain lengths, checksum, data).
    Pure Python: only a changelog's head is read, a few KB, and no dependency is added."""
    while True:
        frame = f.read(len(_LZ4_MAGIC) + 13)
        if not frame.startswith(_LZ4_MAGIC):
            raise ValueError(
                "not LZ4-compressed (the state store's compression codec is not lz4, the only "
                "one read here)"
            )
        token = frame[len(_LZ4_MAGIC)]
        compressed, length, _ = struct.unpack_from("<iii", frame, len(_LZ4_MAGIC) + 1)
        if length == 0:
            raise ValueError("the changelog ends before its lineage")
        block = f.read(compressed)
        yield block if token & 0xF0 == 0x10 else _lz4_block(block, length)  # 0x10: raw


def _lz4_block(src: bytes, length: int) -> bytes:
    """Decode one LZ4 block (the LZ4 block format: literals, then a match to copy)."""
    out, i = bytearray(), 0
    while i < len(src):
        token = src[i]
        i += 1
        literals, i = _lz4_length(src, i, token >> 4)
        out += src[i : i + literals]
        i += literals
        if i >= len(src):
            break
        offset = src[i] | src[i + 1] << 8
        i += 2
        match, i = _lz4_length(src, i, token & 0x0F)
        start = len(out) - offset
        for k in range(match + 4):  # byte by byte: a match may overlap what it writes
            out.append(out[start + k])
    if len(out) != length:
        raise ValueError(f"LZ4 block decoded to {len(out)} bytes, not {length}")
    return bytes(out)


def _lz4_length(src: bytes, i: int, length: int) -> tuple[int, int]:
    if length == 15:
        while True:
            more = src[i]
            i += 1
            length += more
            if more != 255:
                break
    return length, i


def _java_utf(data: bytes) -> tuple[str, bytes]:
    """One string written by Java's ``DataOutputStream.writeUTF`` and what follows it."""
    (length,) = struct.unpack_from(">H", data)
    return data[2 : 2 + length].decode("utf-8"), data[2 + length :]


def read_text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise CheckpointError(f"{path}: unreadable ({err})") from err


def read_query_id(path: Path) -> str:
    try:
        query_id = json.loads(read_text(path))["id"]
    except (ValueError, KeyError, TypeError) as err:
        raise CheckpointError(
            f'{path}: corrupt query metadata (expected {{"id": ...}}); '
            "restore the checkpoint from a backup"
        ) from err
    return str(query_id)


def parse_versioned_json(path: Path, text: str) -> dict:
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


def parse_commit(path: Path) -> dict:
    return parse_versioned_json(path, read_text(path))


def parse_offsets(path: Path, batch_id: int) -> OffsetEntry:
    text = read_text(path)
    meta = parse_versioned_json(path, text)
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


def schema_file_refs(root: Path, metadata_rel: str, op_id: int) -> set[str]:
    """Checkpoint-relative paths of the schema files a v2 operator metadata file names."""
    meta = parse_versioned_json(root / metadata_rel, read_text(root / metadata_rel))
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


# The operators Spark 4.2's repartition takes (its StatePartitionKeyExtractorFactory; any other
# fails with UNSUPPORTED_STATEFUL_OPERATOR), each with the number of trailing fields of its
# state key (as the statestore reader returns ``key``) that are not part of the key Spark
# partitions the operator's input by: a session window's state key ends in the session's
# start (one row per session of a grouping key), a join's keyWithIndexToValue store in the
# value's index (one row per value of a join key). The reader gives transformWithState's
# variables, map entries and timers, and flatMapGroupsWithState's state, keyed by the grouping
# key alone. Each seen on Spark's own state (tests/spark/test_repartition.py).
EXTRA_KEY_FIELDS: dict[str, dict[str, int]] = {
    "stateStoreSave": {},
    "sessionWindowStateStoreSaveExec": {"default": 1},
    "dedupe": {},
    "dedupeWithinWatermark": {},
    "symmetricHashJoin": {"left-keyWithIndexToValue": 1, "right-keyWithIndexToValue": 1},
    "flatMapGroupsWithState": {},
    "applyInPandasWithState": {},
    "transformWithStateExec": {},
    "transformWithStateInPandasExec": {},
    "transformWithStateInPySparkExec": {},
}


def partitioning_fields(operator_name: str, store: str, key_fields: list[str]) -> list[str]:
    """The fields of the state key of ``store`` (a store name or a transformWithState
    variable) of an ``operator_name`` operator that Spark hash-partitions its input by."""
    extra = EXTRA_KEY_FIELDS[operator_name].get(store, 0)
    return key_fields[: len(key_fields) - extra]
