"""Rows of output compared: what a backfill's reprocessing changed in a sink, whatever its
kind (the rows the rollback set aside against the rows the reprocessing wrote)."""

from __future__ import annotations

from collections import Counter
from typing import Any

__all__ = ["COUNTS", "diff_rows", "frozen"]

# The counts a backfill's audit record keeps (stateops.ops.backfill.report_backfill).
COUNTS = ("rows_before", "rows_after", "unchanged", "added", "removed", "changed_keys")


def diff_rows(before: Counter, after: Counter, key_columns: list[str]) -> dict[str, Any]:
    """``before`` against ``after`` (rows as :func:`frozen` keeps them, counted).

    Rows are compared as multisets (batch ids may differ between the runs). A key with rows
    removed and rows added is *changed* (keys: ``key_columns``; without them a row is its own
    key, so nothing is changed, only added or removed); other rows are *added* or *removed*.
    """
    added, removed = after - before, before - after

    def key(row: tuple) -> tuple:
        if not key_columns:  # a query without keys: a row is its own key
            return row
        values = dict(row)
        return tuple(values.get(c) for c in key_columns)

    changed = {key(r) for r in added} & {key(r) for r in removed}
    examples = []
    for k in sorted(changed, key=repr)[:3]:
        was = [_text(r) for r in removed if key(r) == k]
        now = [_text(r) for r in added if key(r) == k]
        examples.append(f"{dict(zip(key_columns, k, strict=True))}: {was} -> {now}")
    return {
        "rows_before": before.total(),
        "rows_after": after.total(),
        "unchanged": (before & after).total(),
        "added": sum(n for r, n in added.items() if key(r) not in changed),
        "removed": sum(n for r, n in removed.items() if key(r) not in changed),
        "changed_keys": len(changed),
        "examples": examples,
    }


def _text(row: tuple) -> str:
    return ", ".join(f"{k}={v}" for k, v in row)


def frozen(value: Any) -> Any:
    """A hashable copy of a row (dicts as sorted item tuples, lists as tuples)."""
    if isinstance(value, dict):
        return tuple(sorted((k, frozen(v)) for k, v in value.items()))
    if isinstance(value, list):
        return tuple(frozen(v) for v in value)
    return value
