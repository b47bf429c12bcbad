"""What a source is, one home per kind: files in a folder, or Kafka topics.

Each kind knows its entry in a checkpoint (``offsets/N`` and ``sources/<i>/0``), the entry a
new checkpoint starts it at (a cutover), whether given offsets can still be read, and how far
behind a checkpoint is. Transplant, rollback, backfill, migration, restore, status and verify
ask this module for those instead of reading offsets entries or a broker themselves; which
kind a source is, they read from the registry (``Source.kafka``).

- **file** (json, parquet, csv): Spark's file source counts its own log entries
  (``{"logOffset": K}``); a new checkpoint starts it at ``-1`` (before the first) and it then
  reads every file the folder holds that its log has not; its files stay readable as long as
  they are in the folder (not tracked here: no broker to ask), and its lag is the unread files
  (the status counts them).
- **kafka**: the entry is ``{"topic": {"partition": next_offset}}``; a new checkpoint starts
  at the offsets of a cutover (a time, the topic's end or its beginning), written into the
  checkpoint itself because Spark starts a topic it has no offsets for at *earliest*, whatever
  ``startingOffsets`` says; offsets are readable while the broker's earliest retained offset
  has not passed them; the lag is the broker's end minus the checkpoint's offsets.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from stateops.core.errors import StateOpsError
from stateops.core.kafka import (
    KafkaSettings,
    Offsets,
    broker_offsets,
    kafka_settings,
    offsets_text,
    parse_offsets,
    topic_partitions,
)
from stateops.core.registry import RETENTION_MARGIN, Query, Source
from stateops.kinds.kafka import records_between, topic_offsets

__all__ = [
    "FILE_START",
    "KAFKA_STARTS",
    "Lag",
    "Missing",
    "cutover_entry",
    "file_log_offset",
    "goes_on",
    "initial_log",
    "kafka_lag",
    "kafka_offsets",
    "missing_ranges",
    "offsets_backwards",
    "require_topics",
    "unread_after_drain",
    "unreadable",
]

# A file source that has read nothing: -1 is "before the first" entry of its (empty) log.
FILE_START = '{"logOffset":-1}'


def require_topics(query: Query) -> None:
    """Every topic the query reads or writes exists, on brokers that answer: refused in one
    line before a job starts (Spark would fail later, and less clearly)."""
    kafka = [s for s in query.inputs.values() if s.kafka]
    for source in kafka:
        topic_partitions(
            kafka_settings(source.bootstrap_servers, source.connection), source.subscribed
        )
    if query.sink.kafka and query.sink.topic:
        topic_partitions(
            kafka_settings(query.sink.bootstrap_servers, query.sink.connection), [query.sink.topic]
        )


def file_log_offset(raw: object) -> int | None:
    """A file source's ``logOffset`` in an offsets entry; None where ``raw`` is not one."""
    if isinstance(raw, dict) and "logOffset" in raw:
        return int(raw["logOffset"])
    return None


def kafka_offsets(raw: object) -> Offsets | None:
    """A Kafka source's offsets in an offsets entry (topic -> partition -> next offset)."""
    return parse_offsets(raw)


def _brokers(source: Source) -> tuple[KafkaSettings, dict[str, list[int]]]:
    """A Kafka source's settings and its topics' partitions (refused in one line: a missing
    topic, a broker that does not answer): what every question to its brokers starts from."""
    settings = kafka_settings(source.bootstrap_servers, source.connection)
    return settings, topic_partitions(settings, source.subscribed)


def cutover_entry(source: Source, at: str | int | None = None) -> str:
    """The offsets entry a new checkpoint starts ``source`` at (``offsets/0`` of a carried-over
    checkpoint, and its ``sources/<i>/0``): a file source before its first file; a Kafka
    source at ``at``: ``earliest`` (the topic's beginning), ``latest`` (its end now) or an
    epoch-ms time (per partition the first record stamped at or after it). Refused in one
    line: a topic that does not exist, a broker that does not answer, a time the topic no
    longer retains (the first record at or after it is the first the broker holds, and older
    ones were deleted)."""
    if not source.kafka:
        return FILE_START
    if at is None:
        raise StateOpsError(
            f"topic {','.join(source.subscribed)}: say where the new checkpoint starts it: a "
            "cutover time, its end (latest) or its beginning (earliest)"
        )
    settings, partitions = _brokers(source)
    offsets = broker_offsets(settings, partitions, at)
    if isinstance(at, int):
        # The first record at or after the cutover is the first the broker still holds, and
        # older ones were deleted: records stamped after the cutover may be among them.
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
                f"{', '.join(gone)} were deleted, and records stamped after the cutover may "
                "have been among them; choose a later cutover, or the topic's beginning "
                "(earliest)"
            )
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


def unreadable(source: Source, offsets: Offsets) -> str:
    """:func:`missing_ranges` as one line (empty: nothing is missing)."""
    missing = missing_ranges(source, offsets)
    if not missing:
        return ""
    return "; ".join(f"{m} deleted (earliest now {m.earliest})" for m in missing)


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


def kafka_lag(source: Source, committed: Offsets) -> Lag:
    """The lag of a Kafka source whose checkpoint committed ``committed``."""
    settings, partitions = _brokers(source)
    return Lag(
        committed,
        broker_offsets(settings, partitions, "latest"),
        broker_offsets(settings, partitions, "earliest"),
    )


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


# --- A: a Kafka source's initial offsets, file entries, and how close retention is ---


def is_file_entry(raw: object) -> bool:
    """Whether an offsets entry is a file source's (``{"logOffset": K}``)."""
    return file_log_offset(raw) is not None


def kafka_initial_offsets(text: str) -> Offsets | None:
    """The offsets in a Kafka source's ``sources/<i>/0`` (where the query started it): a NUL
    byte (Spark 2.1's compatibility marker, SPARK-19517), ``v1``, then the JSON of
    ``offsets/N``'s entry. None where ``text`` is not one (a file source's log)."""
    header, _, body = text.lstrip("\x00").partition("\n")
    if not header.startswith("v") or not header[1:].isdigit():
        return None
    return kafka_offsets(body.strip())


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


def retention(lag: Lag, share: float = RETENTION_MARGIN) -> Retention:
    """:class:`Retention` of a :func:`kafka_lag` answer (no second question to the broker);
    ``share``: how close to the earliest retained offset is close."""
    lost, close = [], []
    for topic, parts in lag.margin.items():
        for partition, margin in parts.items():
            earliest = lag.earliest[topic][partition]
            retained = lag.end.get(topic, {}).get(partition, earliest) - earliest
            if margin < 0:
                lost.append(Missing(topic, partition, earliest + margin, earliest))
            elif margin < share * retained:
                close.append(
                    f"{topic}[{partition}] committed offset {earliest + margin} is {margin} "
                    f"records ahead of the earliest retained {earliest} ({retained} retained)"
                )
    ahead = [
        f"{topic}[{partition}] committed {lag.committed[topic][partition]}, end {end}"
        for topic, parts in lag.end.items()
        for partition, end in parts.items()
        if lag.committed.get(topic, {}).get(partition, 0) > end
    ]
    return Retention(lost, close, ahead)


__all__ += ["Retention", "is_file_entry", "kafka_initial_offsets", "retention"]


# --- B: rollback and backfill (what a rewind reads again; what a Kafka sink holds since when)

__all__ += [
    "kafka_entries",
    "kafka_offsets_at",
    "kafka_source_of",
    "records_between",
    "topic_offsets",
    "within",
]


def kafka_entries(source_offsets: list[object]) -> dict[int, Offsets]:
    """The Kafka sources of one ``offsets/N`` entry (its ``source_offsets``), by their index in
    the checkpoint: their offsets. File sources and sources without offsets yet are left out."""
    found = {}
    for index, raw in enumerate(source_offsets):
        offsets = kafka_offsets(raw)
        if offsets is not None:
            found[index] = offsets
    return found


def kafka_source_of(offsets: Offsets, sources: list[Source]) -> Source:
    """The Kafka source among ``sources`` (a query's inputs) whose topics a checkpoint's entry
    names: the checkpoint's source indexes follow Spark's plan, not the registry's order, and
    the topics are what both say. None of them (a checkpoint named by its path, no registered
    query): the same topics on the default brokers (the connection or the environment)."""
    topics = sorted(offsets)
    for source in sources:
        if source.kafka and sorted(source.subscribed) == topics:
            return source
    return Source.model_validate({"format": "kafka", "topics": topics, "schema": "value STRING"})


def kafka_offsets_at(source: Source, at: str | int) -> Offsets:
    """A Kafka source's offsets on the broker: ``earliest``, ``latest``, or at an epoch-ms time
    (per partition the first record stamped at or after it: every record before it is older)."""
    return topic_offsets(source.subscribed, source, at)


def within(offsets: Offsets, limit: Offsets) -> bool:
    """Whether every partition of ``offsets`` is at or before ``limit``'s (a partition
    ``limit`` lacks: only when it is at 0)."""
    return all(
        offset <= limit.get(topic, {}).get(partition, 0)
        for topic, parts in offsets.items()
        for partition, offset in parts.items()
    )


# --- D: whether a checkpoint's saved offsets (a backup's) can still be read, from its text


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


def kafka_unreadable(sources: list[Source], entries: list[object]) -> str:
    """What a restart from ``entries`` (an offsets file's per-source entries) would no longer
    find on the broker, as one line (empty: every record from them on is still there): per
    Kafka entry, the brokers of the registered source of its topics (:func:`kafka_source_of`:
    else the default brokers) are asked (:func:`unreadable`). Raises
    :class:`~stateops.core.kafka.KafkaDown` when a broker does not answer."""
    gone = []
    for raw in entries:
        offsets = kafka_offsets(raw)
        if offsets and (line := unreadable(kafka_source_of(offsets, sources), offsets)):
            gone.append(line)
    return "; ".join(gone)


__all__ += ["kafka_unreadable", "offsets_entry_sources"]


# --- C: a moved source's start in a carried-over checkpoint, and an old topic read to its end

# Where a new Kafka source starts (a migration's form, the transplant's option): the offsets at
# the cutover time, the topic's end, or its beginning.
KAFKA_STARTS = ("cutover", "earliest", "latest")


def initial_log(entry: str) -> str | None:
    """``sources/<i>/0`` of a checkpoint that starts a source at offsets ``entry``
    (:func:`cutover_entry`): a Kafka source's initial offsets as its connector writes them (a
    NUL byte, ``v1``, the offsets), so that Spark never falls back to ``startingOffsets``;
    None for a file source (its log starts empty)."""
    return "\x00v1\n" + entry if kafka_offsets(entry) is not None else None


def goes_on(source: Source, raw: object) -> bool:
    """Whether ``source`` goes on from an old checkpoint's offsets entry ``raw`` (a Kafka
    source that subscribes exactly the entry's topics); a file source is matched by the files
    its log names instead (:mod:`stateops.ops.transplant`)."""
    offsets = kafka_offsets(raw)
    return bool(source.kafka and offsets is not None and set(offsets) == set(source.subscribed))


def unread_after_drain(source: Source, committed: Offsets) -> str:
    """Why a drained Kafka source is not at its end: one line naming the partitions with
    records the checkpoint has not read (empty: none). A migration switches only once the old
    topic is read to its end, or those records would be lost."""
    lag = kafka_lag(source, committed)
    behind = {t: {p: n for p, n in ps.items() if n > 0} for t, ps in lag.per_partition.items()}
    behind = {t: ps for t, ps in behind.items() if ps}
    if not behind:
        return ""
    return (
        f"{lag.total} records left unread on the old topic after the drain "
        f"({offsets_text(behind)} records behind); stop its producers (or let them switch "
        "to the new source), then migrate again"
    )
