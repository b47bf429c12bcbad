"""What a source is, one home per kind: files in a folder, or Kafka topics.

Each kind knows its entry in a checkpoint (``offsets/N`` and ``sources/<i>/0``), the entry a
new checkpoint starts it at (a cutover), whether given offsets can still be read, and how far
behind a checkpoint is. Transplant, rollback, backfill, migration, status and verify ask
:func:`kind_of` instead of knowing file sources or Kafka.

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
from dataclasses import dataclass

from stateops.core.errors import StateOpsError
from stateops.core.kafka import (
    Offsets,
    broker_offsets,
    kafka_settings,
    offsets_text,
    parse_offsets,
    topic_partitions,
)
from stateops.core.registry import Source

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
    "kind_of",
    "missing_ranges",
    "offsets_backwards",
    "read_initial_log",
    "unread_after_drain",
    "unreadable",
]

# A file source that has read nothing: -1 is "before the first" entry of its (empty) log.
FILE_START = '{"logOffset":-1}'


def kind_of(source: Source) -> str:
    """``kafka`` or ``file``."""
    return "kafka" if source.kafka else "file"


def file_log_offset(raw: object) -> int | None:
    """A file source's ``logOffset`` in an offsets entry; None where ``raw`` is not one."""
    if isinstance(raw, dict) and "logOffset" in raw:
        return int(raw["logOffset"])
    return None


def kafka_offsets(raw: object) -> Offsets | None:
    """A Kafka source's offsets in an offsets entry (topic -> partition -> next offset)."""
    return parse_offsets(raw)


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
    settings = kafka_settings(source.bootstrap_servers)
    partitions = topic_partitions(settings, source.subscribed)
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
    settings = kafka_settings(source.bootstrap_servers)
    partitions = topic_partitions(settings, source.subscribed)
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
    settings = kafka_settings(source.bootstrap_servers)
    partitions = topic_partitions(settings, source.subscribed)
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


def read_initial_log(text: str) -> Offsets | None:
    """The offsets in a Kafka source's ``sources/<i>/0`` (None: not one)."""
    header, _, body = text.lstrip("\x00").partition("\n")
    return parse_offsets(body) if header == "v1" else None


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
