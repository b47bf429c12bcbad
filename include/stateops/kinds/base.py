"""The registry's ``source`` and ``sink`` as written (:class:`Source`, :class:`Sink`), what a
kind of each must do (:class:`SourceKind`, :class:`SinkKind`), and the tables of kinds by their
spelling (``format``), filled by the kinds' modules as they load (:mod:`stateops.kinds`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol

from pydantic import Field, PrivateAttr, field_validator, model_validator

from stateops.core.errors import StateOpsError, about
from stateops.core.model import CONN_ID, DDLSchema, Model
from stateops.core.times import parse_past_time

if TYPE_CHECKING:
    from collections.abc import Callable

    from pyspark.sql import DataFrame, SparkSession

__all__ = [
    "Checkpoint",
    "SINK_KINDS",
    "SOURCE_KINDS",
    "Sink",
    "SinkKind",
    "Source",
    "SourceKind",
    "check_start",
    "register_sink",
    "register_source",
    "start_at",
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

    # What it is to the operations.
    positioned: bool
    """A new checkpoint must be told where it starts (:meth:`start_entry`, written into the
    checkpoint by :meth:`initial_log`)."""
    logs_start: bool
    """Its start is written into ``sources/<i>/0`` (:meth:`initial_log`; a topic's)."""
    cuts_at_time: bool
    """A migration's cutover run stops it at a time (else it reads it to its end)."""
    expires: bool
    """Its input can be deleted under a checkpoint (:meth:`unreadable` asks)."""
    starts: tuple[str, ...]
    """Where a migration may start a new source of this kind (empty: at its beginning)."""
    kept: tuple[str, ...]
    """The fields a new place of this kind keeps from the old one of the same kind."""
    replay: tuple[str, str, str]
    """How a query rebuilds its state from its first input: what must still hold it, the
    option to give, what it reads first."""

    # What it reads of a checkpoint: its entries in ``offsets/N`` (``raw``, JSON), by their
    # shape, which names no kind.

    def claims(self, raw: object) -> bool:
        """Whether an offsets entry is this kind's."""

    def matches(self, source: Source, raw: object) -> bool | None:
        """Whether the registered ``source`` (of this kind) is what the entry reads (the
        checkpoint's sources follow Spark's plan, not the registry's order); None: the entry
        does not say where it reads (a folder's)."""

    def goes_on(self, source: Source, cp: Checkpoint, batch: int, index: int) -> bool:
        """Whether the registered ``source`` (of this kind) reads on from source ``index`` of
        ``cp`` as of ``batch`` (a carried-over checkpoint keeps its entry)."""

    def stand_in(self, raw: object) -> Source | None:
        """The source an entry reads when no registered one matches it (a checkpoint named
        by its path); None: the entry does not say."""

    def initial(self, text: str) -> object | None:
        """The entry a source's ``sources/<i>/0`` holds where this kind writes its start
        there; None: not one."""

    def initial_log(self, entry: str) -> str | None:
        """``sources/<i>/0`` of a new checkpoint that starts it at ``entry``; None: none."""

    def start_entry(self, source: Source, at: str | int | None) -> str:
        """The entry a new checkpoint starts ``source`` at: one of :attr:`starts` or an
        epoch-ms time (a cutover). Refused in one line where that input is gone."""

    def start_of(self, source: Source, query: str) -> str:
        """The entry where Spark would start ``source`` on a new checkpoint, by its options."""

    def unreadable(self, source: Source, raw: object) -> str:
        """What a restart from the entry would no longer find, one line (empty: all there)."""

    def rewind(self, source: Source, raw: object, newest: object) -> dict[str, Any] | None:
        """A rollback to the batch of entry ``raw`` (the newest batch's: ``newest``): its
        ``where``, its plan's ``line`` and what is read again; None: nothing to say."""

    def older(
        self,
        cp: Checkpoint,
        batch: int,
        index: int,
        source: Source | None,
        limit_ms: float,
        memo: dict[str, Any],
    ) -> bool:
        """Whether all that source ``index`` read up to ``batch`` is older than ``limit_ms``
        (a backfill's ``--input-before``; ``memo`` keeps answers across batches)."""

    def unread(self, source: Source, raw: object) -> str:
        """Why a drained source is not at its end, one line (empty: it is)."""

    def goes_back(self, before: object, after: object) -> list[str]:
        """What goes wrong from one batch's entry to the next's (empty: sound)."""

    def entry_text(self, raw: object) -> str:
        """An entry as a person reads it (``stateops inspect``)."""

    def require(self, source: Source) -> None:
        """Refuse, in one line, a source a run cannot read (a topic that does not exist)."""

    def batch_read(
        self, spark: SparkSession, source: Source, cp: Checkpoint, batch: int, index: int
    ) -> tuple[DataFrame, list[str]]:
        """What batch ``batch`` read from source ``index`` of ``cp``, read again as the query
        read it (the carry-over's proof), and where it came from, as a person reads it
        (empty: nothing)."""

    # A migration to a new place of this kind (the form's new_source_<place>).
    place: str
    """The :class:`Source` field that names its place (``path``, ``topic``)."""
    noun: str
    """Its place as a person says it (``folder``, ``topic``)."""
    carried: tuple[str, ...]
    """The options a source of another format of this kind keeps as they are."""

    def same_place(self, a: Source, b: Source) -> bool:
        """Whether two sources of this kind read one place (a migration to it moves nothing)."""

    def recognizes(self, source: dict[str, Any]) -> bool:
        """Whether a new place given without a format is of this kind (a folder that holds a
        Delta table); the first kind whose place is given otherwise."""

    def inputs(self, source: dict[str, Any], options: dict[str, Any]) -> list[Any]:
        """What the new place holds now, read once for :meth:`auto_format`,
        :meth:`check_new` and :meth:`check_input` (a folder's files)."""

    def auto_format(self, source: dict[str, Any], inputs: list[Any]) -> str:
        """The format of a new place given without one."""

    def check_new(
        self, source: Source, *, query: str, others: dict[str, Source], inputs: list[Any]
    ) -> int:
        """Refuse, in one line, a new place the query cannot run on (the current one and a
        start are the migration's to check); how much it holds."""

    def check_input(self, source: Source, inputs: list[Any]) -> None:
        """Refuse input that is not of the new source's schema, after its schema's check."""

    def starting(self, source: Source, entry: str) -> Source:
        """``source`` set to start at ``entry`` by its own option, for a road where Spark
        starts it on a new checkpoint."""

    # Its part of `stateops status`.

    def position(self, source: Source, raw: object, close: float) -> dict[str, Any] | None:
        """Where the checkpoint's entry (None: none yet) stands against the input: ``kind``,
        ``where``, ``lag_total`` and ``lag_unit``, ``said`` (a line), ``table``
        (``columns``, ``rows``: None) and what :meth:`findings` reads. None: nothing to show."""

    def findings(self, query: str, part: dict[str, Any], limits: Any) -> list[tuple[str, str]]:
        """The health findings (rule, reason) of :meth:`position`'s part."""

    def waiting(self, source: Source, cp: Checkpoint, index: int) -> list[float] | None:
        """The times input landed that the checkpoint (its source ``index``) has not read;
        None: not known this way."""


class Checkpoint(Protocol):
    """What a kind reads of a checkpoint (:class:`stateops.core.checkpoint.Checkpoint`)."""

    root: Any
    offsets: dict[int, Any]

    def entry(self, batch: int, source: int) -> object | None: ...

    def started(self, source: int) -> object | None: ...

    def input_files(self, batch: int, source: int = 0) -> list[dict]: ...

    def seen_files(self, source: int = 0) -> set[str]: ...


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

    def require(self, sink: Sink) -> None:
        """Refuse, in one line, a sink a run cannot write (a topic that does not exist)."""

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


def start_at(source: Source, start: str | None, cutover: str | None) -> str | int:
    """Where a new source that is told where it starts (:attr:`SourceKind.positioned`) begins,
    as its kind's :meth:`SourceKind.start_entry` takes it: one of its
    :attr:`SourceKind.starts` (``cutover`` by default), the cutover as epoch ms (``cutover``:
    a past time)."""
    start = start or "cutover"
    starts = source.kind.starts
    if start not in starts:
        raise StateOpsError(f"source start {start!r}: choose one of {', '.join(starts)}")
    if start != "cutover":
        return start
    if not cutover or cutover == "drain":
        raise StateOpsError(
            f"{source.where} starting at the cutover needs the cutover's time (--cutover "
            "TIME); or start it at " + " or ".join(x for x in starts if x != "cutover")
        )
    return int(parse_past_time(cutover, "cutover").timestamp() * 1000)


def check_start(source: Source, start: str, cutover: str) -> None:
    """A migration's ``new_source_start`` for a new source told where it starts: one of its
    kind's starts, and one its input still holds (with ``cutover`` drain, the start at the
    cutover is the drain's end, checked then)."""
    with about("new_source_start"):
        if start not in source.kind.starts:
            raise StateOpsError(f"{start!r}: choose one of {', '.join(source.kind.starts)}")
        if start != "cutover" or cutover != "drain":  # refuses what is no longer held
            source.kind.start_entry(source, start_at(source, start, cutover))


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
