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
]

# The registry's spellings, in the order the kinds registered.
SOURCE_FORMATS = tuple(SOURCE_KINDS)
SINK_FORMATS = tuple(SINK_KINDS)
