"""File-level integrity of a checkpoint, without Spark: each finding names a file and a fault.

Checks: the offsets/commits chains (no gaps, every commit planned, at most one batch in
flight); ``metadata`` present and readable; every file a restart after the last committed batch
needs is present, including the SST files each needed RocksDB ``N.zip`` lists; every ``.crc``
sidecar matches its file (Hadoop's checksum file format), but that of a temporary file an
interrupted write left (a warning: Spark ignores it); no state version beyond the last
committed batch + 1, except that of the one batch in flight; a Kafka source's offsets never go
back nor lose a partition from one batch to the next.
"""

from __future__ import annotations

import os
import struct
import zlib
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from stateops.core.checkpoint import Checkpoint, load_checkpoint
from stateops.core.errors import CheckpointError, NotACheckpointError
from stateops.core.formats import crc_sidecar, hadoop_crc, spark_temp_file
from stateops.core.storage import S3Path, location

__all__ = [
    "Finding",
    "format_findings",
    "refuse_damaged",
    "require_sound",
    "verify_checkpoint",
    "verify_crc",
]


@dataclass(frozen=True)
class Finding:
    severity: str  # "error": a restart or a later operation can fail; "warning": worth a look
    path: str  # relative to the checkpoint ("" for the checkpoint as a whole)
    problem: str


def verify_crc(data: bytes, sidecar: bytes) -> str | None:
    """Why ``sidecar`` (a Hadoop ``.crc`` file) does not match ``data``, or None when it does."""
    if len(sidecar) < 8 or sidecar[:4] != b"crc\x00":
        return "checksum sidecar has no 'crc' header"
    (chunk,) = struct.unpack(">i", sidecar[4:8])
    if chunk <= 0:
        return f"checksum sidecar declares {chunk} bytes per checksum"
    if hadoop_crc(data, chunk) == sidecar:
        return None
    expected = [struct.unpack(">I", sidecar[i : i + 4])[0] for i in range(8, len(sidecar) - 3, 4)]
    actual = [zlib.crc32(data[i : i + chunk]) for i in range(0, len(data), chunk)]
    if len(expected) != len(actual):
        return (
            f"checksum mismatch: sidecar covers {len(expected)} chunks of {chunk} bytes, "
            f"file has {len(data)} bytes (truncated or extended)"
        )
    for n, (want, got) in enumerate(zip(expected, actual, strict=True)):
        if want != got:
            return f"checksum mismatch in bytes {n * chunk}..{min(len(data), (n + 1) * chunk) - 1}"
    return "checksum sidecar is malformed (trailing bytes)"


def verify_checkpoint(path: str | os.PathLike[str]) -> dict[str, Any]:
    """All findings for a checkpoint, as plain data (``ok`` is True when there are no errors).

    Raises :class:`NotACheckpointError` when the path holds no checkpoint at all.
    """
    root = location(path)
    try:
        cp = load_checkpoint(root)
    except NotACheckpointError:
        raise
    except CheckpointError as err:
        # The model cannot be built: that fault is the finding (named by the error).
        findings = [Finding("error", "", str(err))]
        return _result(root, None, findings)
    findings = _chain_findings(cp) + _restart_findings(cp) + _version_findings(cp)
    findings += _progress_findings(cp) + _checksum_findings(cp)
    return _result(root, cp.last_committed_batch, findings)


def require_sound(
    checkpoint: str | os.PathLike[str], log: Callable[[str], None] = print
) -> dict[str, Any]:
    """File-level integrity of ``checkpoint``, printed; raises when it has errors."""
    result = verify_checkpoint(checkpoint)
    log(format_findings(result).rstrip("\n"))
    if not result["ok"]:
        raise CheckpointError(
            f"checkpoint {result['checkpoint']} failed verification: {error_summary(result)}"
        )
    return result


def error_summary(result: dict[str, Any]) -> str:
    """``N errors; first: PATH: PROBLEM`` for a failed :func:`verify_checkpoint` result."""
    first = next(f for f in result["findings"] if f["severity"] == "error")
    return f"{result['errors']} errors; first: {first['path']}: {first['problem']}"


def _result(root: Path | S3Path, last: int | None, findings: list[Finding]) -> dict[str, Any]:
    return {
        "checkpoint": str(root),
        "last_committed_batch": last,
        "ok": not any(f.severity == "error" for f in findings),
        "errors": sum(f.severity == "error" for f in findings),
        "warnings": sum(f.severity == "warning" for f in findings),
        "findings": [asdict(f) for f in sorted(findings, key=lambda f: (f.path, f.problem))],
    }


def _chain_findings(cp: Checkpoint) -> list[Finding]:
    findings = [
        Finding("error", f"offsets/{b}", "missing: a gap in the offsets log")
        for b in cp.gaps("offsets")
    ]
    findings += [
        Finding("error", f"commits/{b}", "missing: a gap in the commits log")
        for b in cp.gaps("commits")
    ]
    findings += [
        Finding("error", f"commits/{b}", "batch committed but never planned (no offsets entry)")
        for b in sorted(set(cp.commits) - set(cp.offsets))
    ]
    in_flight = cp.uncommitted_batches
    if len(in_flight) > 1:
        findings.append(
            Finding(
                "error",
                f"offsets/{in_flight[1]}",
                f"batches {in_flight} are planned but not committed; Spark plans one at a time",
            )
        )
    return findings


def _progress_findings(cp: Checkpoint) -> list[Finding]:
    """A source's entries that go back from one batch to the next (and from where it started
    to batch 0), as its kind says (a topic's offsets that go back, or lose a partition): a
    restart would read input again, or skip some for good. Spark never writes either."""
    findings = []
    try:
        kinds = cp.source_kinds()
        started = {i: cp.started(i) for i in kinds}
    except CheckpointError as err:  # an unreadable initial offsets file
        return [Finding("error", "", str(err))]
    for i, kind in kinds.items():
        before, previous = started[i], f"its initial offsets (sources/{i}/0)"
        for batch in sorted(cp.offsets):
            after = cp.entry(batch, i)
            if not kind.claims(after):
                continue
            if before is not None:  # across a gap too: input is only read forward
                findings += [
                    Finding(
                        "error",
                        f"offsets/{batch}",
                        f"{kind.name.capitalize()} source {i}: {wrong} since {previous}",
                    )
                    for wrong in kind.goes_back(before, after)
                ]
            before, previous = after, f"batch {batch}"
    return findings


def _restart_findings(cp: Checkpoint) -> list[Finding]:
    last = cp.last_committed_batch
    if last is None:
        return []
    try:
        _, missing = cp.restart_requirements(last)
    except CheckpointError as err:  # a needed zip or metadata file is unreadable
        return [Finding("error", "", str(err))]
    return [
        Finding("error", rel, f"missing: a restart after batch {last} needs it") for rel in missing
    ]


def _version_findings(cp: Checkpoint) -> list[Finding]:
    last = cp.last_committed_batch
    allowed = (last + 1 if last is not None else 0) + (1 if cp.uncommitted_batches else 0)
    findings = []
    for op in cp.operators:
        for store in op.stores:
            for v in store.versions:
                if v > allowed:
                    rel = store.version_files(v)[0]
                    findings.append(
                        Finding(
                            "error",
                            rel,
                            f"state version {v} is beyond the last committed batch {last} + 1 "
                            "and no batch is in flight for it: left by a crashed batch",
                        )
                    )
    return findings


def _checksum_findings(cp: Checkpoint) -> list[Finding]:
    findings = [
        Finding("warning", rel, "temporary file of an interrupted write (Spark ignores it)")
        for rel in cp.sizes
        if spark_temp_file(rel)
    ]
    pairs = []
    for rel in cp.sizes:
        parent, _, name = rel.rpartition("/")
        if not (name.startswith(".") and name.endswith(".crc")):
            continue
        data_rel = f"{parent}/{name[1:-4]}" if parent else name[1:-4]
        if data_rel not in cp.sizes:
            findings.append(
                Finding("warning", rel, f"checksum sidecar of a missing file {data_rel}")
            )
            continue
        if spark_temp_file(data_rel):  # its sidecar is as partial as it is
            continue
        pairs.append((data_rel, rel))
    findings += [Finding("error", rel, problem) for rel, problem in _crc_problems(cp, pairs)]
    return findings


def _crc_problems(cp: Checkpoint, pairs: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """``(file, problem)`` for each ``(file, its .crc sidecar)`` of ``cp`` that do not match."""

    def check(pair: tuple[str, str]) -> str | None:  # reads overlap: S3 answers slowly
        try:
            return verify_crc((cp.root / pair[0]).read_bytes(), (cp.root / pair[1]).read_bytes())
        except OSError as err:  # a finding, as an unreadable metadata file is one
            return f"unreadable ({err})"

    with ThreadPoolExecutor(8) as pool:
        found = zip(pairs, pool.map(check, pairs), strict=True)
        return [(data_rel, problem) for (data_rel, _), problem in found if problem]


def refuse_damaged(cp: Checkpoint, rels: list[str], what: str) -> None:
    """Refuse ``what`` where one of ``cp``'s files ``rels`` does not match its checksum
    sidecar (a flipped byte, a truncated file): one line naming it and what to do."""
    pairs = [(rel, crc_sidecar(rel)) for rel in rels if crc_sidecar(rel) in cp.sizes]
    problems = _crc_problems(cp, pairs)
    if problems:
        rel, problem = problems[0]
        raise CheckpointError(
            f"{what}: {rel} is damaged ({problem}; {len(problems)} damaged files in all); "
            f"nothing was done: `stateops verify {cp.root}` lists them; restore a backup "
            "taken before the damage"
        )


def format_findings(result: dict[str, Any]) -> str:
    lines = [
        f"{f['severity'].upper():<8} {f['path'] or '.'}: {f['problem']}" for f in result["findings"]
    ]
    verdict = "OK" if result["ok"] else "FAILED"
    lines.append(
        f"{verdict}: {result['checkpoint']} (last committed batch "
        f"{result['last_committed_batch']}): {result['errors']} errors, "
        f"{result['warnings']} warnings"
    )
    return "\n".join(lines) + "\n"
