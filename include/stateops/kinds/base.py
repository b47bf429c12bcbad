"""The registry's ``source`` and ``sink`` as written (:class:`Source`, :class:`Sink`), what a
kind of each must do (:class:`SourceKind`, :class:`SinkKind`), and the tables of kinds by their
spelling (``format``), filled by the kinds' modules as they load (:mod:`stateops.kinds`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol

from pydantic import Field, PrivateAttr, field_validator, model_validator

from stateops.core.model import CONN_ID, DDLSchema, Model

if TYPE_CHECKING:
    from collections.abc import Callable

    from pyspark.sql import DataFrame, SparkSession

__all__ = [
    "SINK_KINDS",
    "SOURCE_KINDS",
    "Sink",
    "SinkKind",
    "Source",
    "SourceKind",
    "register_sink",
    "register_source",
]


class SourceKind(Protocol):
    """What the operations ask of a kind of input."""

    name: str
    """The kind as a person reads it (``files``, ``kafka``)."""
    fields: tuple[str, ...]
    """Its own fields of :class:`Source` (beside ``format``, ``schema`` and ``options``)."""
    connector: str | None
    """The jar Spark needs to read it, by a part of its name (None: Spark's own)."""
    connection_type: str | None
    """The type of Airflow connection it reads through (its ``connection``; None: none)."""
    session_conf: dict[str, str]
    """Settings a Spark session takes only as it starts, which its connector needs (set on
    every session where the connector is on Spark's path)."""

    def check(self, source: Source) -> None:
        """Refuse what this kind cannot read as written: ValueError, one line."""

    def jars(self, source: Source) -> tuple[str, ...]:
        """The jars Spark needs to read it, by a part of their names (its connector and what
        this source's values need)."""

    def where(self, source: Source) -> str:
        """Where it reads, as a person reads it."""

    def brief(self, source: Source) -> dict[str, Any]:
        """Where it reads, as ``stateops queries --json`` and the status show it."""

    def places(self, source: Source) -> list[str]:
        """The storage locations it reads (for Spark to be set to reach them)."""

    def stream(self, spark: SparkSession, source: Source) -> DataFrame:
        """The source as a streaming DataFrame of the columns of its ``schema``."""


class SinkKind(Protocol):
    """What the operations ask of a kind of output."""

    name: str
    fields: tuple[str, ...]
    """Its own fields of :class:`Sink` (beside ``format`` and ``batch_offset``)."""
    connector: str | None
    connection_type: str | None
    session_conf: dict[str, str]
    exclusive: bool
    """Its place is one query's alone to write (a folder's batch ids, a table's writer id): two
    queries of a registry writing one place are refused."""

    def check(self, sink: Sink) -> None: ...

    def where(self, sink: Sink) -> str: ...

    def places(self, sink: Sink) -> list[str]:
        """The storage locations it writes (for Spark to be set to reach them)."""

    def write(self, df: DataFrame, batch_id: int, sink: Sink) -> None:
        """Write batch ``batch_id`` of the checkpoint (from ``foreachBatch``)."""

    # A rollback of the checkpoint to batch N, and the backfill that reprocesses after it.

    def undo_plan(self, sink: Sink, to_batch: int) -> dict[str, Any] | None:
        """What sets the output of the batches after ``to_batch`` aside (JSON, with this
        kind's ``format``; shown in the plan before anything changes). None: this kind's
        output cannot be undone (see :meth:`rewrites`)."""

    def rewrites(self, sink: Sink, first_batch: int, since_ms: int | None) -> dict | None:
        """What reprocessing from ``first_batch`` (whose run started at ``since_ms``; None:
        it never ran) writes again that the sink's readers already got: ``sink`` (as a person
        reads it), ``first_batch``, ``records``. None: nothing is written twice."""

    def set_aside(
        self, plan: dict[str, Any], run_id: str, submit: Callable[[str, list[str]], None]
    ) -> None:
        """Carry out :meth:`undo_plan`'s plan; run again after a kill, it finishes it.
        ``submit(job, args)`` runs a Spark job of the package's ``jobs/`` on this host (for a
        kind whose undo is Spark's work) and raises, one line, if it fails."""

    def plan_lines(self, plan: dict[str, Any]) -> list[str]:
        """The undo plan as the rollback's plan shows it."""

    def undo_hint(self, plan: dict[str, Any]) -> str:
        """How to put the output set aside back."""

    def touches(self, plan: dict[str, Any]) -> dict[str, list[Any]]:
        """What the undo plan moves, deletes and writes (``move``, ``delete``, ``write``), to
        check the process may before anything changes."""

    def mark(self, sink: Sink) -> object:
        """What to remember before a reprocessing, for :meth:`compare` (JSON; None: none)."""

    def compare(
        self,
        sink: Sink,
        *,
        run_id: str,
        after_batch: int,
        key_columns: list[str],
        mark: object,
        before: dict[str, Any] | None,
    ) -> tuple[list[str], dict[str, Any], dict[str, Any]]:
        """The backfill's report of what reprocessing the batches after ``after_batch``
        changed in the output (the rollback's ``run_id``, its :meth:`mark` and its
        :meth:`rewrites`): its lines, its counts (the audit record's) and all it found."""


# Each kind by the registry's spelling of it (``format``), in the order the kinds registered.
SOURCE_KINDS: dict[str, SourceKind] = {}
SINK_KINDS: dict[str, SinkKind] = {}


def register_source(kind: SourceKind, *formats: str) -> SourceKind:
    SOURCE_KINDS.update(dict.fromkeys(formats, kind))
    return kind


def register_sink(kind: SinkKind, *formats: str) -> SinkKind:
    SINK_KINDS.update(dict.fromkeys(formats, kind))
    return kind


def _spelled(kinds: dict[str, Any], value: str) -> str:
    if value not in kinds:
        listed = ", ".join(repr(f) for f in kinds)
        raise ValueError(f"{value!r} is not a format; one of {listed}")
    return value


def _refuse_foreign(model: Source | Sink, kinds: dict[str, Any], what: str) -> None:
    """Fields of another kind than ``model``'s given a value, refused naming whose they are."""
    own = set(kinds[model.format].fields)
    for kind in dict.fromkeys(kinds.values()):
        foreign = [f for f in kind.fields if getattr(model, f) and f not in own]
        if foreign:
            listed = ", ".join(foreign[:-1]) + f" and {foreign[-1]}" if foreign[1:] else foreign[0]
            verb = "are" if foreign[1:] else "is"
            raise ValueError(
                f"{listed} {verb} for {kind.name} {what}, not for a {model.format} one"
            )


class Source(Model):
    """One input, of the kind its ``format`` names (:data:`SOURCE_KINDS`): files in a folder
    (json, parquet, csv; ``path``), or Kafka (``format: kafka``; ``topic`` or ``topics``, its
    records' values encoded as ``encoding`` with the columns of ``schema``;
    ``bootstrap_servers``, default: its Airflow ``connection``'s (default: the registry's
    ``connections.kafka``) or the environment's, :mod:`stateops.core.kafka`). ``options`` go to
    Spark's reader as they are (``startingOffsets``, ``maxFilesPerTrigger``, ...)."""

    format: str
    path: str = ""
    topic: str | None = None
    topics: list[str] = []
    bootstrap_servers: str | None = None
    connection: str | None = Field(None, pattern=CONN_ID)
    """A Kafka source's Airflow connection (type kafka: brokers, TLS, SASL); None: the
    registry's ``connections.kafka``."""
    encoding: Literal["json", "raw", "avro"] = "json"
    """A Kafka source's record values: ``json`` (decoded into the columns of ``schema``),
    ``avro`` (decoded with the writer's ``avro_schema``, ``schema`` choosing the record's
    fields and their types), or ``raw``: the record as Spark's Kafka source gives it,
    ``schema`` choosing its columns (``key``, ``value``, ``topic``, ``partition``,
    ``offset``, ``timestamp``, ``timestampType``, ``headers``) and their types (``value
    STRING`` for text, ``value BINARY`` for bytes)."""
    avro_schema: str | None = None
    """A Kafka source's writer's Avro schema (``encoding: avro``): the ``.avsc`` text, or the
    same as a YAML mapping."""
    malformed: Literal["fail", "count"] | None = None
    """A Kafka source's JSON or Avro value that does not decode (or a tombstone): ``fail`` the
    run (the default), or ``count`` it, skip it and go on (the run's summary and ``stateops
    status`` say how many)."""
    schema_: DDLSchema = Field(alias="schema")
    options: dict[str, str | int | bool] = {}

    @field_validator("format")
    @classmethod
    def _known(cls, value: str) -> str:
        return _spelled(SOURCE_KINDS, value)

    @field_validator("avro_schema", mode="before")
    @classmethod
    def _avro_text(cls, value: Any) -> Any:
        """A schema written as a YAML mapping, as the ``.avsc`` text Spark takes."""
        return json.dumps(value) if isinstance(value, dict) else value

    @property
    def kind(self) -> SourceKind:
        """What this kind of input is and does."""
        return SOURCE_KINDS[self.format]

    @property
    def kafka(self) -> bool:
        return self.format == "kafka"

    @property
    def subscribed(self) -> list[str]:
        """A Kafka source's topics (``topic`` or ``topics``)."""
        return [self.topic] if self.topic else list(self.topics)

    @property
    def where(self) -> str:
        """Where it reads, as a person reads it: the folder, or ``topic a,b``."""
        return self.kind.where(self)

    @property
    def text(self) -> str:
        """The source as a person reads it: ``json /landing/x``, ``kafka topic a,b``."""
        return f"{self.format} {self.where}"

    @property
    def reader_options(self) -> dict[str, str]:
        """``options`` as the strings Spark's readers take (streaming and batch alike)."""
        return {k: str(v) for k, v in self.options.items()}

    @model_validator(mode="after")
    def _one_place(self) -> Source:
        self.kind.check(self)
        _refuse_foreign(self, SOURCE_KINDS, "sources")
        return self


class Sink(Model):
    """The output, of the kind its ``format`` names (:data:`SINK_KINDS`): per batch id in a
    folder (parquet, json; a re-run of a batch replaces that batch's folder), or with ``format:
    kafka`` each row a record of ``topic`` (its ``key`` column as the record's key, every column
    as the JSON value; at least once, a re-run of a batch writes it again), or a Delta table
    (``delta``, ``path``), or the user's own ``function`` (and its ``undo``; ``format:
    function`` may go unsaid)."""

    format: str = "parquet"
    path: str = ""
    topic: str | None = None
    key: str | None = None
    bootstrap_servers: str | None = None
    connection: str | None = Field(None, pattern=CONN_ID)
    """A Kafka sink's Airflow connection; None: the registry's ``connections.kafka``."""
    function: str | None = None
    """A function sink's ``module:function``, called with each batch and its id."""
    undo: str | None = None
    """A function sink's ``module:function`` that removes what the batches after a given one
    wrote (a rollback's); None: operations that must undo output refuse the sink."""
    batch_offset: int = Field(0, ge=0)
    """Batch K of the checkpoint writes ``batch_id=K+batch_offset``: after a migration the new
    checkpoint starts at batch 0, and its output continues the old one's numbering."""

    _code_paths: tuple[Path, ...] = PrivateAttr(default=())

    @model_validator(mode="before")
    @classmethod
    def _function_unsaid(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("function") and "format" not in data:
            return {**data, "format": "function"}
        return data

    @field_validator("format")
    @classmethod
    def _known(cls, value: str) -> str:
        return _spelled(SINK_KINDS, value)

    @property
    def code_paths(self) -> tuple[Path, ...]:
        """Its registry's ``code_paths`` (where a function sink's functions may live)."""
        return self._code_paths

    @property
    def kind(self) -> SinkKind:
        """What this kind of output is and does."""
        return SINK_KINDS[self.format]

    @property
    def kafka(self) -> bool:
        return self.format == "kafka"

    @property
    def where(self) -> str:
        """Where it writes, as a person reads it: the folder, or ``topic T``."""
        return self.kind.where(self)

    @model_validator(mode="after")
    def _one_place(self) -> Sink:
        self.kind.check(self)
        _refuse_foreign(self, SINK_KINDS, "sinks")
        return self

    def folder_batch(self, batch: int) -> int:
        """The ``batch_id=`` folder of the checkpoint's batch ``batch``."""
        return batch + self.batch_offset
