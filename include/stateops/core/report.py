"""`stateops inspect`: a checkpoint as plain data (``--json``) and as a readable table."""

from __future__ import annotations

from typing import Any

from stateops.core.checkpoint import Checkpoint, OperatorState
from stateops.kinds import source_kind

__all__ = ["checkpoint_report", "format_bytes", "format_report", "group_id"]


def group_id(snapshot_version: int, min_deltas_for_snapshot: int) -> int:
    """The snapshot group a store's snapshot belongs to: one group of a checkpoint holds every
    partition's (and store's) snapshot of about the same version, since partitions may
    snapshot at different versions. What `inspect`, `status` and the cleanup plan count."""
    return snapshot_version // min_deltas_for_snapshot


def checkpoint_report(cp: Checkpoint, min_deltas_for_snapshot: int = 10) -> dict[str, Any]:
    """Everything `inspect` shows. Snapshot groups by :func:`group_id` (0 for the versions
    before any snapshot); a group with several snapshot versions means the partitions
    snapshotted at different versions."""
    last = cp.last_committed_batch
    return {
        "checkpoint": str(cp.root),
        "query_id": cp.query_id,
        "format_version": cp.format_version,
        "last_committed_batch": last,
        "latest_offset_batch": cp.latest_offset_batch,
        "uncommitted_batches": cp.uncommitted_batches,
        "offsets": _batch_range(cp.offsets, cp.gaps("offsets")),
        "commits": _batch_range(cp.commits, cp.gaps("commits")),
        "sources": [
            {
                "source": name,
                "entries": len(log),
                "min_entry": min(log),
                "max_entry": max(log),
                "compacted": sorted(i for i, rel in log.items() if rel.endswith(".compact")),
            }
            for name, log in sorted(cp.sources.items())
        ],
        "progress": _progress(cp),
        "operators": [_operator(cp, op, last, min_deltas_for_snapshot) for op in cp.operators],
        "file_count": len(cp.sizes),
        "total_bytes": cp.total_bytes,
    }


def _progress(cp: Checkpoint) -> list[dict[str, Any]]:
    """Per source whose start the checkpoint holds (a topic: :attr:`SourceKind.positioned`):
    the entry it started at and, per batch in the log, the entry the batch read up to."""
    return [
        {
            "source": i,
            "kind": kind.name,
            "initial": cp.started(i),
            "batches": {b: raw for b in sorted(cp.offsets) if kind.claims(raw := cp.entry(b, i))},
        }
        for i, kind in cp.source_kinds().items()
        if kind.positioned
    ]


def _batch_range(batches: dict[int, Any], gaps: list[int]) -> dict[str, Any]:
    return {
        "count": len(batches),
        "min": min(batches) if batches else None,
        "max": max(batches) if batches else None,
        "gaps": gaps,
    }


def _operator(
    cp: Checkpoint, op: OperatorState, last_committed: int | None, min_deltas: int
) -> dict[str, Any]:
    prefix = f"state/{op.operator_id}/"
    files = {rel: size for rel, size in cp.sizes.items() if rel.startswith(prefix)}
    versions = sorted({v for s in op.stores for v in s.versions})
    # Partitions may snapshot at different versions: a row per group id sums them all.
    groups: dict[int, dict[str, Any]] = {}
    stores = []
    for store in op.stores:
        present = store.versions
        view = cp.committed_view(store)  # format v2: the files of the ids the commits name
        stores.append(
            {
                "partition": store.partition,
                "store_name": store.store_name,
                "min_version": present[0] if present else None,
                "max_version": present[-1] if present else None,
                "snapshots": sorted(view.snapshots),
                "missing_versions": sorted(
                    set(range(present[0], present[-1] + 1)) - set(present) if present else []
                ),
            }
        )
        for g in view.snapshot_groups(cp.sizes):
            agg = groups.setdefault(
                group_id(g.snapshot_version, min_deltas),
                {
                    "group_id": group_id(g.snapshot_version, min_deltas),
                    "snapshot_versions": [],
                    "min_version": min(g.versions),
                    "max_version": max(g.versions),
                    "stores": 0,
                    "file_count": 0,
                    "bytes": 0,
                },
            )
            if g.snapshot_version and g.snapshot_version not in agg["snapshot_versions"]:
                agg["snapshot_versions"] = sorted([*agg["snapshot_versions"], g.snapshot_version])
            agg["stores"] += 1
            agg["file_count"] += len(g.files)
            agg["bytes"] += g.bytes
            agg["min_version"] = min(agg["min_version"], min(g.versions))
            agg["max_version"] = max(agg["max_version"], max(g.versions))
    restart_version = None if last_committed is None else last_committed + 1
    sst = [size for rel, size in files.items() if "/SSTs/" in rel and not rel.endswith(".crc")]
    return {
        "operator_id": op.operator_id,
        "operator_name": op.operator_name,
        "provider": op.provider,
        "num_partitions": cp.partitions(last_committed) or op.num_partitions,
        "store_names": op.store_names,
        "min_version": versions[0] if versions else None,
        "max_version": versions[-1] if versions else None,
        # Versions past the last committed batch + 1 belong to a batch that never committed.
        "uncommitted_versions": [
            v for v in versions if restart_version is not None and v > restart_version
        ],
        "snapshot_groups": [groups[k] for k in sorted(groups)],
        "stores": stores,
        "sst_files": len(sst),
        "sst_bytes": sum(sst),
        "file_count": len(files),
        "total_bytes": sum(files.values()),
    }


def format_bytes(n: int) -> str:
    size = float(n)
    for unit in ("B", "KB", "MB", "GB"):
        if size < 1024 or unit == "GB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{n} B"


def _table(headers: list[str], rows: list[list[Any]]) -> list[str]:
    cells = [[str(c) for c in headers]] + [
        [("-" if c is None else str(c)) for c in r] for r in rows
    ]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(cells[0], widths, strict=True)).rstrip()]
    lines.append("  ".join("-" * w for w in widths))
    lines += [
        "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip()
        for row in cells[1:]
    ]
    return ["  " + line for line in lines]


def _progress_lines(src: dict[str, Any]) -> list[str]:
    kind = source_kind(src["kind"])
    initial = src["initial"]
    lines = [f"{kind.name} {src['source']}"]
    if kind.logs_start:  # its start is in sources/<i>/0
        lines[0] += "     started at " + (
            kind.entry_text(initial) if initial else f"? (sources/{src['source']}/0 is gone)"
        )
    width = max((len(str(b)) for b in src["batches"]), default=1)
    lines += [f"  batch {b:>{width}}  {kind.entry_text(raw)}" for b, raw in src["batches"].items()]
    return lines


def format_report(report: dict[str, Any]) -> str:
    off, com = report["offsets"], report["commits"]
    lines = [
        f"checkpoint  {report['checkpoint']}",
        f"query id    {report['query_id']}",
        f"format      v{report['format_version']}"
        + (
            ""
            if report["format_version"] == 1
            else " (every operation reads it but repartition: Spark 4.2's reads v1 only)"
        ),
        f"batches     last committed {report['last_committed_batch']}, "
        f"latest planned {report['latest_offset_batch']}"
        + (
            f", NOT committed: {report['uncommitted_batches']}"
            if report["uncommitted_batches"]
            else ""
        ),
        f"offsets     {off['count']} entries ({off['min']}..{off['max']})"
        + (f", GAPS at {off['gaps']}" if off["gaps"] else ""),
        f"commits     {com['count']} entries ({com['min']}..{com['max']})"
        + (f", GAPS at {com['gaps']}" if com["gaps"] else ""),
    ]
    for src in report["sources"]:
        lines.append(
            f"source {src['source']}    {src['entries']} log entries "
            f"({src['min_entry']}..{src['max_entry']}), compacted at {src['compacted'] or 'none'}"
        )
    for src in report.get("progress", []):
        lines += _progress_lines(src)
    lines.append(f"files       {report['file_count']} files, {format_bytes(report['total_bytes'])}")
    lines.append("")
    if not report["operators"]:
        lines.append("no stateful operators")
    for op in report["operators"]:
        lines += _table(
            ["operator", "name", "provider", "partitions", "stores", "versions", "files", "size"],
            [
                [
                    op["operator_id"],
                    op["operator_name"],
                    op["provider"],
                    op["num_partitions"],
                    ",".join(op["store_names"]),
                    f"{op['min_version']}..{op['max_version']}",
                    op["file_count"],
                    format_bytes(op["total_bytes"]),
                ]
            ],
        )
        for st in op["stores"]:
            if st["missing_versions"]:
                lines.append(
                    f"  partition {st['partition']} store {st['store_name']}: "
                    f"versions MISSING {st['missing_versions']}"
                )
        if op["uncommitted_versions"]:
            lines.append(f"  versions of uncommitted batches: {op['uncommitted_versions']}")
        if op["sst_files"]:
            lines.append(
                f"  RocksDB SST files (shared by groups): {op['sst_files']}, "
                f"{format_bytes(op['sst_bytes'])}"
            )
        lines.append("")
        lines += _table(
            ["group", "snapshot", "versions", "stores", "files", "size"],
            [
                [
                    g["group_id"],
                    ",".join(map(str, g["snapshot_versions"])) or "(empty base)",
                    f"{g['min_version']}..{g['max_version']}",
                    g["stores"],
                    g["file_count"],
                    format_bytes(g["bytes"]),
                ]
                for g in op["snapshot_groups"]
            ],
        )
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"
