"""Kafka topics in and out (Spark's Kafka connector).

In: the offsets entry is ``{"topic": {"partition": next_offset}}``; each record's value is
decoded into the columns of the source's ``schema``. The brokers and their security come from
the source's Airflow connection (:mod:`stateops.core.kafka`), never from the registry.

Out: each row a record of ``topic`` (its ``key`` column as the record's key, every column as
the JSON value): at least once, a batch that runs again writes its records again.
"""

from __future__ import annotations

import functools
import json
import math
import operator
import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from stateops.core.errors import StateOpsError, about
from stateops.core.kafka import (
    KafkaDown,
    KafkaSettings,
    Offsets,
    broker_offsets,
    kafka_settings,
    offsets_text,
    parse_offsets,
    spark_options,
    topic_partitions,
)
from stateops.core.model import schema_fields
from stateops.kinds.base import (
    Checkpoint,
    Sink,
    Source,
    register_sink,
    register_source,
)

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession

__all__ = [
    "KAFKA",
    "KAFKA_SINK",
    "Lag",
    "Missing",
    "Retention",
    "lag",
    "missing_ranges",
    "offsets_backwards",
    "offsets_json",
    "records_between",
    "retention",
    "topic_offsets",
    "within",
]

CONNECTOR = "spark-sql-kafka"
AVRO = "spark-avro"  # Avro's functions (from_avro)
_SECURITY = ("kafka.sasl.", "kafka.security.", "kafka.ssl.")
# The columns of a record as Spark's Kafka source gives it (``encoding: raw``).
RECORD_COLUMNS = (
    "key",
    "value",
    "topic",
    "partition",
    "offset",
    "timestamp",
    "timestampType",
    "headers",
)
# The run's progress counts the values of a ``malformed: count`` source that did not parse,
# under names that start so, one per source (Spark's observed metrics:
# stateops.spark.streaming.progress_summary).
MALFORMED_METRIC = "stateops_malformed"
_MALFORMED_COLUMN = "_stateops_malformed"


class Kafka:
    name = "kafka"
    fields = ("topic", "topics", "bootstrap_servers", "connection", "avro_schema", "malformed")
    connector = CONNECTOR
    connection_type = "kafka"
    session_conf: dict[str, str] = {}
    # A new checkpoint starts a topic where it is told: Spark starts a topic it has no offsets
    # for at its beginning, whatever startingOffsets says, so the start is written into the
    # checkpoint (its initial offsets file).
    positioned = True
    logs_start = True
    cuts_at_time = False  # no files to pick by time: a cutover run reads a topic to its end
    expires = True  # retention deletes records under a checkpoint's offsets
    starts = ("cutover", "earliest", "latest")  # where a new topic starts in a migration
    place = "topic"  # the migration form's new_source_topic
    noun = "topic"
    kept = ("encoding", "avro_schema", "malformed")  # a new topic's values read as the old's
    carried = ()  # another format's options mean nothing to it
    replay = (
        "with its topics still holding every record from the first (a record that retention "
        "deleted is not replayed, and the rebuilt state would differ)",
        ", `startingOffsets: earliest`",
        "record",
    )

    def check(self, source: Source) -> None:
        self._check_place(source)
        columns = [name for name, _ in schema_fields(source.schema_)]
        if source.avro_schema and source.encoding != "avro":
            raise ValueError("avro_schema is for Avro values: give encoding: avro with it")
        if source.encoding == "raw":
            if source.malformed:
                raise ValueError(
                    "malformed is for json and avro values: a raw record is never decoded"
                )
            unknown = [c for c in columns if c not in RECORD_COLUMNS]
            if unknown:
                raise ValueError(
                    f"schema {', '.join(unknown)}: a raw record's columns are "
                    f"{', '.join(RECORD_COLUMNS)} (encoding: json decodes the value instead)"
                )
        elif source.encoding == "avro":
            _check_avro(source)
        elif _MALFORMED_COLUMN in columns:
            raise ValueError(f"schema {_MALFORMED_COLUMN}: the name is stateops' own")

    def jars(self, source: Source) -> tuple[str, ...]:
        """The connector, and Avro's functions for Avro values."""
        return (CONNECTOR, AVRO) if source.encoding == "avro" else (CONNECTOR,)

    def _check_place(self, source: Source) -> None:
        if source.path:
            raise ValueError("a kafka source reads topics: give topic or topics, not path")
        if bool(source.topic) == bool(source.topics):
            raise ValueError("a kafka source names topic (one) or topics (several)")
        if {"subscribe", "subscribePattern", "assign"} & set(source.options):
            raise ValueError("give a kafka source's topics as topic or topics, not options")
        if "kafka.bootstrap.servers" in source.options:
            raise ValueError("give a kafka source's brokers as bootstrap_servers, not options")
        secret = [k for k in source.options if k.startswith(_SECURITY)]
        if secret:
            # The registry is shown in plans, logs and XCom; credentials are not.
            raise ValueError(
                f"options {', '.join(secret)}: security settings come from the source's "
                "Airflow connection (connection, else connections.kafka) or STATEOPS_KAFKA_* "
                "variables, never the registry"
            )

    def where(self, source: Source) -> str:
        return f"topic {','.join(source.subscribed)}"

    def brief(self, source: Source) -> dict[str, Any]:
        return {"topics": source.subscribed}

    # --- its entry in a checkpoint: {"topic": {"partition": next offset}}

    def claims(self, raw: object) -> bool:
        return parse_offsets(raw) is not None

    def matches(self, source: Source, raw: object) -> bool:
        """The registered ``source`` reads exactly the entry's topics."""
        offsets = parse_offsets(raw)
        return offsets is not None and set(offsets) == set(source.subscribed)

    def goes_on(self, source: Source, cp: Checkpoint, batch: int, index: int) -> bool:
        """``source`` reads on from source ``index`` of ``cp``: it subscribes exactly the
        topics of its entry in ``batch``."""
        return self.matches(source, cp.entry(batch, index))

    def stand_in(self, raw: object) -> Source:
        """The entry's topics on the default brokers (the connection or the environment)."""
        topics = sorted(parse_offsets(raw) or {})
        return Source.model_validate(
            {"format": "kafka", "topics": topics, "schema": "value STRING"}
        )

    def initial(self, text: str) -> Offsets | None:
        """The offsets in a topic's ``sources/<i>/0`` (where the query started it): a NUL byte
        (Spark 2.1's compatibility marker, SPARK-19517), ``v1``, then the JSON of the offsets
        entry. None where ``text`` is not one."""
        header, _, body = text.lstrip("\x00").partition("\n")
        if not header.startswith("v") or not header[1:].isdigit():
            return None
        return parse_offsets(body.strip())

    def initial_log(self, entry: str) -> str | None:
        """``sources/<i>/0`` of a checkpoint that starts the topic at ``entry``, as the
        connector writes it, so that Spark never falls back to ``startingOffsets``."""
        return "\x00v1\n" + entry

    def start_entry(self, source: Source, at: str | int | None) -> str:
        """The entry a new checkpoint starts the topics at: ``earliest``, ``latest`` (the end
        now) or an epoch-ms time (per partition the first record stamped at or after it).
        Refused in one line: a topic that does not exist, brokers that do not answer, a time
        the topic no longer retains."""
        if at is None:
            raise StateOpsError(
                f"topic {','.join(source.subscribed)}: say where the new checkpoint starts it: "
                "a cutover time, its end (latest) or its beginning (earliest)"
            )
        settings, partitions = _brokers(source)
        offsets = broker_offsets(settings, partitions, at)
        if isinstance(at, int):
            # The first record at or after the cutover is the first the broker still holds,
            # and older ones were deleted: records stamped after it may be among them.
            earliest = broker_offsets(settings, partitions, "earliest")
            gone = [
                f"{t}[{p}] offsets 0..{o - 1}"
                for t, ps in offsets.items()
                for p, o in ps.items()
                if o == earliest[t][p] > 0
            ]
            if gone:
                raise StateOpsError(
                    f"the cutover is no longer retained on {settings.bootstrap_servers}: "
                    f"{', '.join(gone)} were deleted, and records stamped after the cutover "
                    "may have been among them; choose a later cutover, or the topic's "
                    "beginning (earliest)"
                )
        return offsets_json(offsets)

    def start_of(self, source: Source, query: str) -> str:
        """Where Spark would start the topics on a new checkpoint: the registered
        ``startingOffsets`` (``earliest``, ``latest``, Spark's default, or offsets as JSON)."""
        given = next(
            (str(v) for k, v in source.options.items() if k.lower() == "startingoffsets"),
            "latest",
        )
        if given in ("earliest", "latest"):
            return self.start_entry(source, given)
        if parse_offsets(given) is None:
            raise StateOpsError(
                f"query {query}: startingOffsets {given!r} is not earliest, latest or offsets "
                'as JSON ({"topic": {"0": 12}})'
            )
        return given

    def unreadable(self, source: Source, raw: object) -> str:
        """What the brokers no longer hold from the entry on, one line (empty: all there).
        Raises KafkaDown when they do not answer."""
        missing = missing_ranges(source, parse_offsets(raw) or {})
        return "; ".join(f"{m} deleted (earliest now {m.earliest})" for m in missing)

    def rewind(self, source: Source, raw: object, newest: object) -> dict[str, Any]:
        """A rollback to the batch of entry ``raw``, the newest batch's being ``newest``: the
        offsets it rewinds to and the records read again."""
        offsets = parse_offsets(raw) or {}
        again = records_between(offsets, parse_offsets(newest) or offsets)
        return {
            "where": self.where(source),
            "line": f"rewinds to {offsets_text(offsets)}; {again} records read again",
            "reads_again": again,
            "offsets": offsets,
        }

    def older(
        self,
        cp: Checkpoint,
        batch: int,
        index: int,
        source: Source | None,
        limit_ms: float,
        memo: dict[str, Any],
    ) -> bool:
        """Whether every record batch ``batch`` and those before it read from ``source``
        (source ``index`` of ``cp``) is stamped before ``limit_ms``: its offsets are at or
        before the first stamped at or after it (``memo``: that answer, asked of the brokers
        once)."""
        raw = cp.offsets[batch].source_offsets[index]
        source = source or self.stand_in(raw)
        if "limit" not in memo:
            memo["limit"] = topic_offsets(source.subscribed, source, math.ceil(limit_ms))
        return within(parse_offsets(raw) or {}, memo["limit"])

    def unread(self, source: Source, raw: object) -> str:
        """Why a drained topic is not at its end: the partitions with records the checkpoint
        has not read, one line (empty: none)."""
        found = lag(source, parse_offsets(raw) or {})
        behind = {
            t: {p: n for p, n in ps.items() if n > 0} for t, ps in found.per_partition.items()
        }
        behind = {t: ps for t, ps in behind.items() if ps}
        if not behind:
            return ""
        return (
            f"{found.total} records left unread on the old topic after the drain "
            f"({offsets_text(behind)} records behind); stop its producers (or let them switch "
            "to the new source), then migrate again"
        )

    def goes_back(self, before: object, after: object) -> list[str]:
        """What goes wrong from one batch's entry to the next's (empty: sound)."""
        return offsets_backwards(parse_offsets(before) or {}, parse_offsets(after) or {})

    def entry_text(self, raw: object) -> str:
        return offsets_text(parse_offsets(raw) or {})

    def require(self, source: Source) -> None:
        """The topics exist, on brokers that answer: refused in one line before a job starts."""
        _brokers(source)

    def batch_read(
        self, spark: SparkSession, source: Source, cp: Checkpoint, batch: int, index: int
    ) -> tuple[DataFrame, list[str]]:
        """The records batch ``batch`` read from source ``index``, decoded as the query read
        them, and their ranges per partition (``topic[p] a..b``; empty: none)."""
        end = parse_offsets(cp.entry(batch, index)) or {}
        # Where the batch started: the last earlier batch with offsets (a bootstrap's batch 0
        # reads no input and has none), else the offsets the source started at.
        earlier = (
            parse_offsets(cp.entry(b, index)) for b in range(batch - 1, -1, -1) if b in cp.offsets
        )
        start = next((o for o in earlier if o is not None), None)
        if start is None:
            start = parse_offsets(cp.started(index)) or {}
        ranges = [
            f"{t}[{p}] {start.get(t, {}).get(p, 0)}..{o - 1}"
            for t, ps in end.items()
            for p, o in ps.items()
            if o > start.get(t, {}).get(p, 0)
        ]
        if not ranges:
            return spark.createDataFrame([], source.schema_), []

        def spec(offsets: Offsets) -> str:
            # -2: the partition's earliest (Spark's JSON offsets)
            return json.dumps(
                {t: {str(p): offsets.get(t, {}).get(p, -2) for p in ps} for t, ps in end.items()}
            )

        records = (
            spark.read.format("kafka")
            .options(**read_options(source))
            .option("startingOffsets", spec(start))
            .option("endingOffsets", spec(end))
            .load()
        )
        return decode(records, source), ranges

    # --- a migration to a new topic

    def same_place(self, a: Source, b: Source) -> bool:
        return (set(a.subscribed), a.bootstrap_servers) == (set(b.subscribed), b.bootstrap_servers)

    def recognizes(self, source: dict[str, Any]) -> bool:
        return bool(source.get("topic"))

    def inputs(self, source: dict[str, Any], options: dict[str, Any]) -> list[Any]:
        return []

    def auto_format(self, source: dict[str, Any], inputs: list[Any]) -> str:
        return "kafka"

    def check_new(
        self, source: Source, *, query: str, others: dict[str, Source], inputs: list[Any]
    ) -> int:
        """Refuse a new topic the query cannot run on: a topic that does not exist, brokers
        that do not answer; the number of its partitions."""
        with about("new_source_topic"):
            _, partitions = _brokers(source)
        return sum(len(ps) for ps in partitions.values())

    def check_input(self, source: Source, inputs: list[Any]) -> None:
        return None

    def starting(self, source: Source, entry: str) -> Source:
        """``source`` set to start at ``entry`` by its own option (``startingOffsets``, which
        Spark reads on a checkpoint's first start where it has no entry)."""
        return source.model_copy(update={"options": {**source.options, "startingOffsets": entry}})

    # --- its part of `stateops status`

    def position(self, source: Source, raw: object, close: float) -> dict[str, Any]:
        """Where the checkpoint's entry ``raw`` (None: none yet) stands on the brokers: per
        partition the committed, end and earliest offsets, the lag and the retention margin
        (``close``: the share of the retained records that is close to their earliest).
        Raises a StateOpsError (KafkaDown) when the brokers do not answer."""
        committed = parse_offsets(raw)
        part: dict[str, Any] = {
            "kind": self.name,
            "where": self.where(source),
            "topics": source.subscribed,
            "committed": committed,
            "lag_unit": "records",
            "lag_total": None,
            "said": "no offsets yet"
            if committed is None
            else "lag unknown (see the status's errors)",
            "table": None,
            "lost": [],
            "close": [],
            "ahead": [],
        }
        if committed is None:
            return part
        found = lag(source, committed)
        kept = retention(found, close)
        part.update(
            end=found.end,
            earliest=found.earliest,
            lag=found.per_partition,
            lag_total=found.total,
            margin=found.margin,
            lost=[f"{m}" for m in kept.lost],
            close=kept.close,
            ahead=kept.ahead,
            said=f"lag {found.total} records",
            table={
                "columns": ["partition", "committed", "end", "lag", "earliest", "margin"],
                "rows": [
                    [
                        f"{topic}[{p}]",
                        committed.get(topic, {}).get(p, 0),
                        found.end[topic][p],
                        n,
                        found.earliest[topic][p],
                        found.margin[topic][p],
                    ]
                    for topic, parts in found.per_partition.items()
                    for p, n in parts.items()
                ],
            },
        )
        return part

    def findings(self, query: str, part: dict[str, Any], limits: Any) -> list[tuple[str, str]]:
        """The health findings of :meth:`position`'s ``part``, each with its rule: retention
        passed, or is about to pass, the committed offsets; they are past the topic's end; the
        query is further behind than ``limits.lag_records``."""
        found = []
        head = f"kafka {part['source']}"
        if part["lost"]:
            found.append(
                (
                    "retention_passed",
                    f"{head}: retention passed the offsets committed by batch "
                    f"{part['committed_batch']}: {', '.join(part['lost'])} were deleted unread; "
                    "a restart loses them (Spark stops on them unless failOnDataLoss is false, "
                    "then skips them)",
                )
            )
        if part["ahead"]:
            found.append(
                (
                    "offsets_ahead",
                    f"{head}: the offsets committed by batch {part['committed_batch']} are past "
                    f"the broker's end ({', '.join(part['ahead'])}): the topic was recreated or "
                    "truncated; a restart fails, or skips records; restore a backup or migrate "
                    "to the topic as it is",
                )
            )
        if part["close"]:
            found.append(
                (
                    "retention_close",
                    f"{head}: the broker's earliest retained offset is close to the committed "
                    f"one (within {limits.retention_margin:.0%} of the records it retains; the "
                    "next deleted segment may pass it): " + "; ".join(part["close"]),
                )
            )
        if limits.lag_records and (part["lag_total"] or 0) > limits.lag_records:
            found.append(
                (
                    "lag",
                    f"{head}: {part['lag_total']} records behind the end of "
                    f"{', '.join(part['topics'])}, more than health.lag_records "
                    f"({limits.lag_records}): the query does not keep up or is not run; "
                    f"stateops status {query} shows each partition, stateops run {query} "
                    "reads them",
                )
            )
        return found

    def waiting(self, source: Source, cp: Checkpoint, index: int) -> list[float] | None:
        """Files landed and not read: none for a topic (its lag says what waits)."""
        return None

    def places(self, source: Source) -> list[str]:
        return []

    def stream(self, spark: SparkSession, source: Source) -> DataFrame:
        reader = spark.readStream.format("kafka").options(**read_options(source))
        return decode(reader.options(**source.reader_options).load(), source, streaming=True)


class KafkaSink:
    name = "kafka"
    fields = ("topic", "key", "bootstrap_servers", "connection")
    connector = CONNECTOR
    connection_type = "kafka"
    session_conf: dict[str, str] = {}
    exclusive = False  # a topic takes many writers

    def check(self, sink: Sink) -> None:
        if sink.path or not sink.topic:
            raise ValueError("a kafka sink writes a topic: give topic, not path")

    def require(self, sink: Sink) -> None:
        """Its topic exists, on brokers that answer (no operation creates it)."""
        settings = kafka_settings(sink.bootstrap_servers, sink.connection)
        topic_partitions(settings, [sink.topic or ""])

    def where(self, sink: Sink) -> str:
        return f"topic {sink.topic}"

    def places(self, sink: Sink) -> list[str]:
        return []

    def write(self, df: DataFrame, batch_id: int, sink: Sink) -> None:
        from pyspark.sql import functions as F

        record = [F.to_json(F.struct(*df.columns)).alias("value")]
        if sink.key:
            record.insert(0, F.col(sink.key).cast("string").alias("key"))
        df.select(*record).write.format("kafka").options(
            **spark_options(kafka_settings(sink.bootstrap_servers, sink.connection))
        ).option("topic", sink.topic).save()

    def undo_plan(self, sink: Sink, to_batch: int) -> None:
        """Nothing to undo: the topic keeps what a batch wrote (see :meth:`rewrites`)."""
        return None

    def rewrites(self, sink: Sink, first_batch: int, since_ms: int | None) -> dict[str, Any]:
        """How many records the batches from ``first_batch`` on wrote to the topic, which a
        reprocessing writes again: those stamped at or after ``since_ms``, the first of those
        batches' start (None: none of them ran), the query being the topic's only writer.
        Raises KafkaDown where the brokers do not answer."""
        found = {
            "sink": f"Kafka topic {sink.topic}",
            "topic": sink.topic,
            "first_batch": first_batch,
            "since_ms": None,
            "records": 0,
        }
        if since_ms is None:  # nothing after it: nothing is written again
            return found
        at = topic_offsets([sink.topic or ""], sink, since_ms)
        end = topic_offsets([sink.topic or ""], sink, "latest")
        found.update(since_ms=since_ms, records=records_between(at, end))
        return found

    def set_aside(self, plan: dict[str, Any], run_id: str, submit: object) -> None:
        raise AssertionError("a kafka sink has no undo plan")  # undo_plan is None

    def plan_lines(self, plan: dict[str, Any]) -> list[str]:
        return []

    def undo_hint(self, plan: dict[str, Any]) -> str:
        return ""

    def touches(self, plan: dict[str, Any]) -> dict[str, list[Any]]:
        return {"move": [], "delete": [], "write": []}

    def mark(self, sink: Sink) -> dict[str, dict[str, int]] | None:
        """The topic's end offsets now, as JSON keeps them: where a reprocessing's records
        start (None: the broker does not answer; the reprocessing then fails and says so)."""
        try:
            end = topic_offsets([sink.topic or ""], sink, "latest")
        except KafkaDown:
            return None
        return {t: {str(p): o for p, o in ps.items()} for t, ps in end.items()}

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
        """How many records the reprocessing wrote (from ``mark``), against the count the
        rolled-back batches had written (``before``, their :meth:`rewrites`): the topic keeps
        both, rows are not compared."""
        end = topic_offsets([sink.topic or ""], sink, "latest")
        start = parse_offsets(mark)
        written = records_between(start, end) if start is not None else None
        was = (before or {}).get("records", 0)
        lines = [
            f"the reprocessing of the batches after {after_batch} wrote "
            f"{'an unknown number of' if written is None else written} records to Kafka topic "
            f"{sink.topic}; the rolled-back batches had written {was}, which the topic keeps "
            "(at least once)"
        ]
        output = {"records_written": written, "records_written_before": was}
        return lines, output, output


def read_options(source: Source) -> dict[str, str]:
    """Spark's Kafka reader's options for the source's brokers, topics and record columns
    (streaming and batch alike; the registry's ``options`` go after them)."""
    options = spark_options(kafka_settings(source.bootstrap_servers, source.connection))
    options["subscribe"] = ",".join(source.subscribed)
    columns = [name for name, _ in schema_fields(source.schema_)]
    if source.encoding == "raw" and "headers" in columns:
        options["includeHeaders"] = "true"
    return options


def decode(records: DataFrame, source: Source, *, streaming: bool = False) -> DataFrame:
    """Kafka records (Spark's Kafka source's columns) as the source's columns: ``raw``, the
    record's columns cast to the schema's types; ``json``, the value decoded into the schema.
    A value that does not parse, is empty or is null (a tombstone) is malformed: it fails the
    batch, or with ``malformed: count`` it is skipped, and a stream counts it in its progress
    (a metric per source: Spark refuses one name for two). The carry-over proof decodes a
    batch's records here too, as the query read them."""
    from pyspark.sql import functions as F

    columns = schema_fields(source.schema_)
    if source.encoding == "raw":
        record = F.struct(*[name for name, _ in columns])
        return records.select(record.cast(f"STRUCT<{source.schema_}>").alias("r")).select("r.*")
    counting = source.malformed == "count"
    if source.encoding == "avro":
        value, bad = _from_avro(source, counting)
        picked = [F.col(f"v.{name}").cast(kind).alias(name) for name, kind in columns]
    elif counting:
        value = F.from_json(
            F.col("value").cast("string"),
            f"{source.schema_}, {_MALFORMED_COLUMN} STRING",
            {"mode": "PERMISSIVE", "columnNameOfCorruptRecord": _MALFORMED_COLUMN},
        )
        bad = F.col("v").isNull() | F.col(f"v.{_MALFORMED_COLUMN}").isNotNull()
        picked = [F.col(f"v.{name}") for name, _ in columns]
    else:
        value = F.from_json(F.col("value").cast("string"), source.schema_, {"mode": "FAILFAST"})
        bad = F.col("v").isNull()
        picked = [F.col(f"v.{name}") for name, _ in columns]
    parsed = records.select(value.alias("v"))
    topics = ",".join(source.subscribed)
    if not counting:  # a value that does not decode fails the batch; an empty one too
        said = f"[MALFORMED_RECORD_IN_PARSING] an empty or null value of topic {topics}"
        guarded = F.when(bad, F.raise_error(F.lit(said))).otherwise(F.col("v"))
        return parsed.select(guarded.alias("v")).select(*picked)
    if streaming:
        name = f"{MALFORMED_METRIC}:{topics}:{uuid.uuid4().hex[:8]}"
        parsed = parsed.observe(name, F.count(F.when(bad, 1)).alias("records"))
    return parsed.where(~bad).select(*picked)


def _from_avro(source: Source, counting: bool) -> tuple[Column, Column]:
    """The value decoded with the writer's schema (Spark's ``from_avro``), and what makes a
    record malformed: a null value (a tombstone) and, when counting, a value Spark could not
    decode, which its PERMISSIVE mode gives as a record of nulls (not as null), so a record
    whose every field is null counts as malformed then."""
    from pyspark.sql import functions as F
    from pyspark.sql.avro.functions import from_avro

    mode = "PERMISSIVE" if counting else "FAILFAST"
    value = from_avro(F.col("value"), source.avro_schema or "", {"mode": mode})
    bad = F.col("v").isNull()
    if counting:
        fields = [F.col(f"v.{name}").isNull() for name in avro_fields(source.avro_schema or "")]
        bad = bad | functools.reduce(operator.and_, fields)
    return value, bad


# Spark's type of each Avro type (by its logicalType where it has one) and the types a
# ``schema`` may declare it as beside that: widenings and text.
_AVRO_TYPES: dict[str, tuple[str, ...]] = {
    "boolean": ("BOOLEAN",),
    "int": ("INT", "BIGINT", "DOUBLE"),
    "long": ("BIGINT",),
    "float": ("FLOAT", "DOUBLE"),
    "double": ("DOUBLE",),
    "string": ("STRING",),
    "enum": ("STRING",),
    "bytes": ("BINARY",),
    "fixed": ("BINARY",),
    "date": ("DATE",),
    "timestamp-millis": ("TIMESTAMP",),
    "timestamp-micros": ("TIMESTAMP",),
    "local-timestamp-millis": ("TIMESTAMP_NTZ",),
    "local-timestamp-micros": ("TIMESTAMP_NTZ",),
}


# Spark's other spellings of a type, as schema_fields keeps them (upper case).
_SPARK_ALIASES = {
    "LONG": "BIGINT",
    "INTEGER": "INT",
    "SHORT": "SMALLINT",
    "BYTE": "TINYINT",
    "REAL": "FLOAT",
    "DEC": "DECIMAL",
}


def avro_fields(text: str) -> dict[str, Any]:
    """The fields of an Avro record schema (the ``.avsc`` text) by name, each its type as
    written; ValueError, one line, for text that is not a record schema."""
    try:
        schema = json.loads(text)
    except json.JSONDecodeError as err:
        raise ValueError(
            f"avro_schema is not JSON ({err.msg}, line {err.lineno} column {err.colno}): give "
            "the writer's .avsc text, or the same as a mapping"
        ) from None
    fields = schema.get("fields") if isinstance(schema, dict) else None
    if not isinstance(schema, dict) or schema.get("type") != "record" or not fields:
        raise ValueError(
            'avro_schema is not a record schema ({"type": "record", "name": ..., "fields": '
            "[...]}): a value's columns are its record's fields"
        )
    return {f["name"]: f.get("type") for f in fields if isinstance(f, dict) and "name" in f}


def avro_type(written: Any) -> str | None:
    """An Avro field's type as :data:`_AVRO_TYPES` names it (its logicalType where it has
    one; a union with null, its other member); None: a type Spark reads as a struct, array
    or map, or a union of several, which Spark's cast checks at run time."""
    if isinstance(written, list):
        others = [t for t in written if t != "null"]
        return avro_type(others[0]) if len(others) == 1 else None
    if isinstance(written, dict):
        return written.get("logicalType") or avro_type(written.get("type"))
    return written if isinstance(written, str) else None


def _check_avro(source: Source) -> None:
    """An Avro source's columns are fields of its writer's record, declared as types Spark's
    cast reads them as (a widening or text)."""
    if not source.avro_schema:
        raise ValueError("encoding: avro needs avro_schema: the writer's schema (.avsc)")
    fields = avro_fields(source.avro_schema)
    for name, written_as in schema_fields(source.schema_):
        declared = _SPARK_ALIASES.get(written_as, written_as)
        if name not in fields:
            raise ValueError(
                f"schema {name}: not a field of avro_schema's record (its fields: "
                f"{', '.join(fields)})"
            )
        written = avro_type(fields[name])
        allowed = _AVRO_TYPES.get(written or "")
        if allowed is None or declared == "STRING" or declared in allowed:
            continue
        if written in ("long", "int") and declared in ("TIMESTAMP", "TIMESTAMP_NTZ"):
            raise ValueError(
                f"schema {name} {declared}: the Avro field is a {written}; declare it with "
                "logicalType timestamp-millis in avro_schema, or as BIGINT (Spark would read "
                "the number as seconds)"
            )
        if written in ("long", "int") and declared == "DATE":
            raise ValueError(
                f"schema {name} DATE: the Avro field is a {written}; declare it with "
                "logicalType date in avro_schema, or as a number"
            )
        raise ValueError(
            f"schema {name} {declared}: the Avro field is {written}, which reads as "
            f"{' or '.join(allowed)} (or STRING)"
        )


def _brokers(source: Source) -> tuple[KafkaSettings, dict[str, list[int]]]:
    """A Kafka source's settings and its topics' partitions (refused in one line: a missing
    topic, a broker that does not answer): what every question to its brokers starts from."""
    settings = kafka_settings(source.bootstrap_servers, source.connection)
    return settings, topic_partitions(settings, source.subscribed)


def offsets_json(offsets: Offsets) -> str:
    """Offsets as a checkpoint's entry holds them."""
    return json.dumps({t: {str(p): o for p, o in ps.items()} for t, ps in offsets.items()})


@dataclass(frozen=True)
class Missing:
    topic: str
    partition: int
    wanted: int  # the offset the checkpoint reads next
    earliest: int  # the first the broker still holds

    def __str__(self) -> str:
        return f"{self.topic}[{self.partition}] offsets {self.wanted}..{self.earliest - 1}"


def missing_ranges(source: Source, offsets: Offsets) -> list[Missing]:
    """The records from ``offsets`` on that the broker no longer holds, per partition (empty:
    every one is still there). A partition of a subscribed topic missing from ``offsets``
    counts from 0."""
    settings, partitions = _brokers(source)
    earliest = broker_offsets(settings, partitions, "earliest")
    found = []
    for topic, parts in earliest.items():
        for partition, first in parts.items():
            wanted = offsets.get(topic, {}).get(partition, 0)
            if wanted < first:
                found.append(Missing(topic, partition, wanted, first))
    return found


@dataclass(frozen=True)
class Lag:
    """How far a checkpoint's offsets are behind the broker, per partition and in total, and
    how many records each committed offset is ahead of the broker's earliest (the retention
    margin: negative when retention passed it, records were lost)."""

    committed: Offsets
    end: Offsets
    earliest: Offsets

    @property
    def per_partition(self) -> Offsets:
        return {
            t: {p: end - self.committed.get(t, {}).get(p, 0) for p, end in ps.items()}
            for t, ps in self.end.items()
        }

    @property
    def total(self) -> int:
        return sum(n for ps in self.per_partition.values() for n in ps.values())

    @property
    def margin(self) -> Offsets:
        return {
            t: {p: self.committed.get(t, {}).get(p, 0) - first for p, first in ps.items()}
            for t, ps in self.earliest.items()
        }

    def __str__(self) -> str:
        return f"lag {self.total} records ({offsets_text(self.per_partition)})"


def lag(source: Source, committed: Offsets) -> Lag:
    """The lag of a Kafka source whose checkpoint committed ``committed``."""
    settings, partitions = _brokers(source)
    return Lag(
        committed,
        broker_offsets(settings, partitions, "latest"),
        broker_offsets(settings, partitions, "earliest"),
    )


@dataclass(frozen=True)
class Retention:
    """Where retention stands against a checkpoint's committed offsets: ``lost`` (the broker
    deleted records the checkpoint has not read: a restart loses them) and ``close`` (the
    committed offset is within a share (the query's ``health.retention_margin``) of the
    records the partition retains, and there are unread records: the next deleted segment
    may pass it)."""

    lost: list[Missing]
    close: list[str]
    ahead: list[str] = field(default_factory=list)
    """Partitions whose committed offset is past the broker's end (the topic was recreated or
    truncated): a restart fails, or reads from the new end and skips whatever comes before."""


def retention(found: Lag, share: float) -> Retention:
    """:class:`Retention` of a :func:`lag` answer (no second question to the broker);
    ``share``: how close to the earliest retained offset is close."""
    lost, close = [], []
    for topic, parts in found.margin.items():
        for partition, margin in parts.items():
            earliest = found.earliest[topic][partition]
            retained = found.end.get(topic, {}).get(partition, earliest) - earliest
            if margin < 0:
                lost.append(Missing(topic, partition, earliest + margin, earliest))
            elif margin < share * retained:
                close.append(
                    f"{topic}[{partition}] committed offset {earliest + margin} is {margin} "
                    f"records ahead of the earliest retained {earliest} ({retained} retained)"
                )
    ahead = [
        f"{topic}[{partition}] committed {found.committed[topic][partition]}, end {end}"
        for topic, parts in found.end.items()
        for partition, end in parts.items()
        if found.committed.get(topic, {}).get(partition, 0) > end
    ]
    return Retention(lost, close, ahead)


def offsets_backwards(before: Offsets, after: Offsets) -> list[str]:
    """What goes wrong from one batch's Kafka offsets to the next's: a partition whose offset
    goes back, a partition (or topic) that is gone; each as a phrase (empty: sound)."""
    wrong = []
    for topic, parts in before.items():
        for partition, offset in parts.items():
            now = after.get(topic, {}).get(partition)
            if now is None:
                wrong.append(f"{topic}[{partition}] is gone")
            elif now < offset:
                wrong.append(f"{topic}[{partition}] goes back from {offset} to {now}")
    return wrong


def within(offsets: Offsets, limit: Offsets) -> bool:
    """Whether every partition of ``offsets`` is at or before ``limit``'s (a partition
    ``limit`` lacks: only when it is at 0)."""
    return all(
        offset <= limit.get(topic, {}).get(partition, 0)
        for topic, parts in offsets.items()
        for partition, offset in parts.items()
    )


def records_between(before: Offsets | None, after: Offsets) -> int:
    """How many records lie from ``before`` to ``after`` (two offsets of one source: what the
    batches between them read); a partition ``before`` lacks counts from 0 (Spark reads a new
    partition from its beginning)."""
    before = before or {}
    return sum(
        max(0, offset - before.get(topic, {}).get(partition, 0))
        for topic, parts in after.items()
        for partition, offset in parts.items()
    )


def topic_offsets(topics: list[str], place: Source | Sink, at: str | int) -> Offsets:
    """Topics' offsets on the brokers of ``place`` (a Kafka source or sink: its
    ``bootstrap_servers`` and ``connection``): ``earliest``, ``latest``, or per partition the
    first record stamped at or after an epoch-ms time."""
    settings = kafka_settings(place.bootstrap_servers, place.connection)
    return broker_offsets(settings, topic_partitions(settings, topics), at)


KAFKA = register_source(Kafka(), "kafka")
KAFKA_SINK = register_sink(KafkaSink(), "kafka")
