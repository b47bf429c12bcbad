"""Deterministic sample events for the reference pipelines: JSON landing folders, or the
records of a Kafka topic (``python -m stateops.dev.sampledata --topic T``; the same events)."""

from __future__ import annotations

import concurrent.futures
import json
import random
import sys
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from pathlib import Path

from stateops.core.errors import StateOpsError
from stateops.core.kafka import (
    TIMEOUT,
    KafkaDown,
    KafkaSettings,
    _admin,
    broker_offsets,
    kafka_settings,
    offsets_text,
    topic_partitions,
)

__all__ = ["DATASETS", "generate_events", "generate_initial_pages", "produce_events"]

DATASETS = ("user_sessions", "page_visits")

EPOCH = datetime(2026, 1, 1, tzinfo=UTC)
PAGES = ["home", "search", "product", "cart", "checkout", "help", "account", "blog"]


def _ts(t: datetime) -> str:
    return t.strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def generate_events(
    landing: Mapping[str, str | Path],
    *,
    events_per_file: int = 250,
    users: int = 50,
    files: int = 4,
    seed: int = 7,
    round_: int = 0,
    minutes_per_round: int = 120,
) -> dict[str, list[Path]]:
    """Write ``files`` JSON files of ``events_per_file`` events each into the landing folders.

    ``landing`` maps ``user_sessions`` and/or ``page_visits`` to a folder (a query's
    ``source.path``); both datasets come from the same users and times. Same arguments, same
    bytes. Round ``r`` covers event times ``[r, r + 1) * minutes_per_round``
    after 2026-01-01, so later rounds move event time (and the watermark) forward. Returns the
    written paths per landing folder (``user_sessions``, ``page_visits``).
    """
    unknown = set(landing) - set(DATASETS)
    if unknown:
        raise ValueError(f"no sample data for {sorted(unknown)}; known: {list(DATASETS)}")
    if events_per_file < 1 or users < 1 or files < 1:
        raise ValueError("events_per_file, users and files must be at least 1")
    written: dict[str, list[Path]] = {name: [] for name in landing}
    for folder in landing.values():
        Path(folder).mkdir(parents=True, exist_ok=True)
    batches = _sample_files(events_per_file, users, files, seed, round_, minutes_per_round)
    for f, datasets in enumerate(batches):
        for name, records in datasets.items():
            if name not in landing:
                continue
            path = Path(landing[name]) / f"events-r{round_:03d}-{f:04d}.json"
            path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
            written[name].append(path)
    return written


def _sample_files(
    events_per_file: int, users: int, files: int, seed: int, round_: int, minutes_per_round: int
) -> list[dict[str, list[dict[str, object]]]]:
    """Per file of a round: its ``user_sessions`` and ``page_visits`` records, in time order."""
    rng = random.Random(f"{seed}-{round_}")
    start = EPOCH + timedelta(minutes=round_ * minutes_per_round)
    span_ms = minutes_per_round * 60_000
    out = []
    for f in range(files):
        lo = span_ms * f // files
        hi = span_ms * (f + 1) // files
        rows = sorted(
            (start + timedelta(milliseconds=rng.randrange(lo, hi)), f"u{rng.randrange(users):05d}")
            for _ in range(events_per_file)
        )
        sessions = [
            {
                "user_id": user,
                "data": f"e{round_}-{f}-{i}",
                "is_last": rng.random() < 0.15,
                "event_time": _ts(t),
            }
            for i, (t, user) in enumerate(rows)
        ]
        visits = [
            {"user_id": user, "page": rng.choice(PAGES), "event_time": _ts(t)} for t, user in rows
        ]
        out.append({"user_sessions": sessions, "page_visits": visits})
    return out


def generate_initial_pages(path: str | Path, *, users: int = 50, seed: int = 7) -> Path:
    """A page_visits initial state (JSON lines): pages each user visited before 2026."""
    rng = random.Random(f"{seed}-initial")
    rows = []
    for u in range(users):
        for i in range(rng.randrange(1, 4)):
            visited = EPOCH - timedelta(days=1, minutes=rng.randrange(24 * 60) - i)
            rows.append(
                {"user_id": f"u{u:05d}", "page": rng.choice(PAGES), "visited_at": _ts(visited)}
            )
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def produce_events(
    settings: KafkaSettings,
    topic: str,
    dataset: str = "page_visits",
    *,
    partitions: int = 2,
    events_per_file: int = 250,
    users: int = 50,
    files: int = 4,
    seed: int = 7,
    round_: int = 0,
    minutes_per_round: int = 120,
) -> int:
    """Produce the events :func:`generate_events` writes for ``dataset`` to ``topic`` (created
    with ``partitions`` if missing): JSON values, the user as the key (a user's events stay in
    order on one partition), the event time as the record's timestamp (a cutover time finds
    them). Returns how many records the broker acknowledged."""
    from confluent_kafka import KafkaException, Producer
    from confluent_kafka.admin import NewTopic

    if dataset not in DATASETS:
        raise ValueError(f"no sample data for {dataset!r}; known: {list(DATASETS)}")
    if not _topic_exists(settings, topic):
        # retention.ms -1: the samples' event times (2026) are older than the default 7 days.
        new = NewTopic(topic, partitions, 1, config={"retention.ms": "-1"})
        admin = _admin(settings)  # held until the answer is in: its futures die with it
        try:
            admin.create_topics([new])[topic].result(TIMEOUT)
        except KafkaException as err:
            raise StateOpsError(f"creating topic {topic} failed: {err.args[0].str()}") from None
        except concurrent.futures.TimeoutError:
            raise StateOpsError(
                f"creating topic {topic} on {settings.bootstrap_servers} took over "
                f"{TIMEOUT:.0f} s; is the broker up?"
            ) from None
    producer = Producer(settings.client_config() | {"log_level": 0, "linger.ms": 20})
    failed: list[str] = []
    count = 0
    for datasets in _sample_files(events_per_file, users, files, seed, round_, minutes_per_round):
        for record in datasets[dataset]:
            stamp = datetime.fromisoformat(str(record["event_time"]).replace("Z", "+00:00"))
            producer.produce(
                topic,
                json.dumps(record).encode(),
                key=str(record["user_id"]).encode(),
                timestamp=int(stamp.timestamp() * 1000),
                on_delivery=lambda err, _: failed.append(str(err)) if err else None,
            )
            count += 1
            producer.poll(0)
    if producer.flush(TIMEOUT * 4) or failed:
        raise StateOpsError(
            f"{len(failed) or 'some'} of {count} records to {topic} on "
            f"{settings.bootstrap_servers} were not acknowledged ({(failed or ['timeout'])[0]})"
        )
    return count


def _topic_exists(settings: KafkaSettings, topic: str) -> bool:
    try:
        topic_partitions(settings, [topic])
    except KafkaDown:
        raise
    except StateOpsError:  # no such topic
        return False
    return True


def main(argv: list[str] | None = None) -> int:
    """``python -m stateops.dev.sampledata --topic T [--dataset D] [--round R] ...``: produce a
    round of sample events to a topic of the configured broker (:func:`kafka_settings`)."""
    import argparse

    from stateops.core.errors import one_line

    parser = argparse.ArgumentParser(
        prog="python -m stateops.dev.sampledata", description=main.__doc__
    )
    parser.add_argument("--topic", required=True)
    parser.add_argument("--dataset", choices=DATASETS, default="page_visits")
    parser.add_argument("--partitions", type=int, default=2, help="of a new topic (default 2)")
    parser.add_argument("--events", type=int, default=250, help="events per file of a round")
    parser.add_argument("--files", type=int, default=4)
    parser.add_argument("--users", type=int, default=50)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--round", type=int, default=0, help="later rounds hold later times")
    parser.add_argument(
        "--if-missing", action="store_true", help="only into a topic that does not exist yet"
    )
    args = parser.parse_args(argv)
    try:
        settings = kafka_settings()
        if args.if_missing and _topic_exists(settings, args.topic):
            return 0
        count = produce_events(
            settings,
            args.topic,
            args.dataset,
            partitions=args.partitions,
            events_per_file=args.events,
            users=args.users,
            files=args.files,
            seed=args.seed,
            round_=args.round,
        )
        end = broker_offsets(settings, topic_partitions(settings, [args.topic]), "latest")
    except StateOpsError as err:
        print(f"error: {one_line(err)}", file=sys.stderr)
        return 2
    print(
        f"{count} {args.dataset} events (round {args.round}) to {args.topic}: end offsets "
        f"{offsets_text(end)}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
