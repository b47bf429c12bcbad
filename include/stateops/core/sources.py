"""What the operations ask of a query's sources as a whole; each source's own questions go to
its kind (:mod:`stateops.kinds`: its entry in a checkpoint, its start, whether what it read
can be read again, its lag).

A checkpoint's entries (``offsets/N``, one per source in Spark's plan order) name no kind and
no source: :func:`stateops.kinds.kind_at` finds the kind by the entry's shape and
:func:`stateops.kinds.source_at` the registered source it reads.
"""

from __future__ import annotations

import json

from stateops.core.registry import Query, Source
from stateops.kinds import source_at

__all__ = ["offsets_entry_sources", "require_inputs", "unreadable_from"]


def require_inputs(query: Query) -> None:
    """Every source and the sink can be reached as the registry names them (a topic exists,
    on brokers that answer): refused in one line before a job starts (Spark would fail
    later, and less clearly)."""
    for source in query.inputs.values():
        source.kind.require(source)
    query.sink.kind.require(query.sink)


def offsets_entry_sources(text: str) -> list[object]:
    """The per-source entries of an ``offsets/N`` file's text (``v1``, the batch's metadata,
    then one line per source in plan order; ``-`` for none), as JSON where they are."""
    entries: list[object] = []
    for line in text.split("\n")[2:]:
        line = line.strip()
        if line:
            try:
                entries.append(json.loads(line))
            except ValueError:
                entries.append(None)
    return entries


def unreadable_from(sources: list[Source], entries: list[object]) -> str:
    """What a restart from ``entries`` (an offsets file's per-source entries) would no longer
    find, as one line (empty: all of it is still there): each entry's kind asked about the
    registered source it reads (else the kind's stand-in). Raises
    :class:`~stateops.core.errors.Unreachable` where the input's servers do not answer."""
    gone = []
    for raw in entries:
        source = source_at(raw, sources)
        if source is not None and (line := source.kind.unreadable(source, raw)):
            gone.append(line)
    return "; ".join(gone)
