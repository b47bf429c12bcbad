"""Source and sink kinds: what each kind of input and output *is*, one module per kind.

A registry's ``source`` (or each of ``sources``) and ``sink`` name their kind by ``format``;
the models (:class:`Source`, :class:`Sink`) hold the fields as written, and ``source.kind`` /
``sink.kind`` is the object that knows what to do with them (:class:`SourceKind`,
:class:`SinkKind`). The operations ask the kind and never test for one: adding a kind is its
module here (which registers its spellings), its import below, its tests and its docs.

- :mod:`stateops.kinds.files`: files in a folder (json, parquet, csv) in; a folder of
  ``batch_id=K`` folders (parquet, json) out.
- :mod:`stateops.kinds.kafka`: Kafka topics in and out.
- :mod:`stateops.kinds.delta`: a Delta Lake table out.
- :mod:`stateops.kinds.function`: the user's own function out (and its undo).

Light on import (the DAG files read the spellings at parse time): Spark and the Kafka client
are imported where a kind uses them.
"""

from __future__ import annotations

from collections.abc import Iterable

from stateops.kinds import files, kafka  # isort: split

from stateops.kinds import delta, function  # after them: in the order people meet them
from stateops.kinds.base import SINK_KINDS, SOURCE_KINDS, Sink, SinkKind, Source, SourceKind

__all__ = [
    "SINK_FORMATS",
    "SINK_KINDS",
    "SOURCE_FORMATS",
    "SOURCE_KINDS",
    "Sink",
    "SinkKind",
    "Source",
    "SourceKind",
    "delta",
    "files",
    "function",
    "kafka",
    "kind_at",
    "source_at",
    "source_kind",
]

# The registry's spellings, in the order the kinds registered.
SOURCE_FORMATS = tuple(SOURCE_KINDS)
SINK_FORMATS = tuple(SINK_KINDS)


def kind_at(raw: object) -> SourceKind | None:
    """The kind whose offsets entry ``raw`` is (a checkpoint's entries name no kind: each
    kind knows its own by its shape); None: no kind's ("-", a source without one yet)."""
    return next((k for k in dict.fromkeys(SOURCE_KINDS.values()) if k.claims(raw)), None)


def source_kind(name: str) -> SourceKind:
    """The source kind named ``name`` (:attr:`SourceKind.name`, as the reports keep it)."""
    return next(k for k in SOURCE_KINDS.values() if k.name == name)


def source_at(raw: object, sources: Iterable[Source]) -> Source | None:
    """The source among ``sources`` (a query's inputs) that entry ``raw`` reads, else the
    kind's stand-in for it (:meth:`SourceKind.stand_in`); None: neither says."""
    kind = kind_at(raw)
    if kind is None:
        return None
    found = [s for s in sources if s.kind is kind and kind.matches(s, raw)]
    return found[0] if found else kind.stand_in(raw)
