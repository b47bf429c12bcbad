"""The downtime of a Kafka query's migration to a new topic, against a plain stop and restart.

    .venv/bin/python benchmarks/bench_kafka_migration.py [--events 5000] [--new-events 500]
        [--partitions 2] [--new-source kafka|folder]

page_visits (RocksDB, 4 state partitions, local[2]) reads topic A of the embedded broker
(``stateops.dev.kafka``, started and stopped here) on a 1-second trigger, run as a user runs
it: ``stateops run page_visits --mode continuous`` (spark-submit). Once it has read the
``--events`` on A, timed in one run, each from the moment the running query's process ended:

- baseline: ``stateops stop``, then ``stateops run`` again at once (``--new-events`` more on A
  arrive meanwhile): stopped -> its next committed batch;
- migration: ``stateops migrate page_visits --new-source-format kafka --new-source-topic B
  --new-source-start earliest`` (``--new-events`` on B), which stops the running query itself,
  drains A, backs the checkpoint up (to the embedded S3 endpoint), carries the state over and
  runs the new query's first batch: stopped -> the first batch the new checkpoint commits.

The downtime is what a consumer of the query's output waits, so it ends at the batch's commit
(the commit file's time); the migration's proof and switch after it are reported apart.
``--new-source folder``: the same migration to a folder of JSON files holding the same events
(topic -> folder), where the topic -> topic road is not there. Goal: the migration's downtime at
most 2x the plain restart's.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "include"))

from stateops.dev.kafka import start_broker  # noqa: E402
from stateops.dev.s3server import free_port, start_s3_server  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
KEY, SECRET, BUCKET = "bench", "bench-secret", "bench-backups"
GOAL = 2.0
USERS = 1000


def registry(root: Path, topic: str) -> Path:
    """page_visits reading ``topic`` on a 1-second trigger, backed up to the embedded S3."""
    raw = yaml.safe_load((ROOT / "registry.yaml").read_text())
    spec = raw["queries"]["page_visits"]
    spec["source"] = {
        "format": "kafka",
        "topic": topic,
        "schema": spec["source"]["schema"],
        "options": {"startingOffsets": "earliest"},
    }
    spec.update(trigger={"processing_time": "1 second"}, checkpoint="checkpoints/page_visits")
    raw = {
        "data_dir": str(root / "data"),
        "backups": {"url": f"s3://{BUCKET}", "conn_id": "bench_s3"},
        "queries": {"page_visits": spec},
    }
    path = root / "registry.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


def events(start: int, n: int, stamp_ms: int) -> list[tuple[str, dict, int]]:
    """``n`` page visits of USERS users, one a millisecond from ``stamp_ms``."""
    out = []
    for i in range(start, start + n):
        user = f"u{i % USERS:05d}"
        at = stamp_ms + i
        out.append((user, {"user_id": user, "page": f"/p{i % 50}", "event_time": at // 1000}, at))
    return out


def produce(servers: str, topic: str, records: list[tuple[str, dict, int]]) -> None:
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": servers, "linger.ms": 5})
    for key, value, at in records:
        producer.produce(topic, key=key, value=json.dumps(value), timestamp=at)
        producer.poll(0)
    if producer.flush(60):
        sys.exit(f"records to {topic} not delivered within 60 s")


def create_topics(servers: str, partitions: int, *topics: str) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": servers})
    new = [NewTopic(t, num_partitions=partitions, replication_factor=1) for t in topics]
    for future in admin.create_topics(new).values():
        future.result()


def committed_after(checkpoint: Path, batch: int) -> tuple[int, float] | None:
    """The first batch after ``batch`` that ``checkpoint`` committed, and its commit file's
    time; None before there is one."""
    commits = checkpoint / "commits"
    if not commits.is_dir():
        return None
    later = sorted(
        int(p.name) for p in commits.iterdir() if p.name.isdigit() and int(p.name) > batch
    )
    return (later[0], (commits / str(later[0])).stat().st_mtime) if later else None


def last_commit(checkpoint: Path) -> int:
    commits = checkpoint / "commits"
    found = [int(p.name) for p in commits.iterdir() if p.name.isdigit()] if commits.is_dir() else []
    return max(found, default=-1)


def wait_for(what: str, check, timeout: float = 600, every: float = 0.02):
    deadline = time.time() + timeout
    while (found := check()) in (None, False):
        if time.time() > deadline:
            sys.exit(f"{what}: not within {timeout:.0f} s")
        time.sleep(every)
    return found


class Run:
    """``stateops run page_visits --mode continuous``, the time its process ended kept by a
    thread that waits on it (the moment the query is down)."""

    def __init__(self, registry_file: Path, log: Path) -> None:
        with open(log, "ab") as out:
            self.proc = subprocess.Popen(
                [
                    str(BIN / "stateops"),
                    "--registry",
                    str(registry_file),
                    "run",
                    "page_visits",
                    "--mode",
                    "continuous",
                ],
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        self.ended: float | None = None
        threading.Thread(target=self._wait, daemon=True).start()

    def _wait(self) -> None:
        self.proc.wait()
        self.ended = time.time()

    def ended_at(self) -> float:
        return wait_for("the running query's end", lambda: self.ended)

    def until(self, what: str, check) -> None:
        """Wait until ``check()`` while the query runs; exits if it ended first."""

        def done():
            if self.ended is not None:
                sys.exit(f"the query ended before {what} (exit {self.proc.returncode})")
            return check()

        wait_for(what, done, every=0.5)


def caught_up(checkpoint: Path, servers: str, topic: str) -> bool:
    """Whether the query's last committed batch read ``topic`` to its end."""
    from stateops.core.checkpoint import load_checkpoint
    from stateops.core.kafka import broker_offsets, kafka_settings, topic_partitions

    last = last_commit(checkpoint)
    if last < 0:
        return False
    settings = kafka_settings(servers)
    end = broker_offsets(settings, topic_partitions(settings, [topic]), "latest")[topic]
    read = load_checkpoint(checkpoint).offsets[last].source_offsets[0].get(topic, {})
    return {int(p): o for p, o in read.items()} == end


def figures(baseline: float, migration: float, goal: float = GOAL) -> list[str]:
    """The two downtimes, the ratio and the verdict, as printed."""
    ratio = migration / baseline
    verdict = "within" if ratio <= goal else "OVER"
    return [
        f"{'plain stop and restart (stopped -> next commit)':<58}{baseline:7.2f} s  (baseline)",
        f"{'migration (stopped -> new checkpoint first commit)':<58}{migration:7.2f} s  "
        f"{ratio:5.2f}x the restart ({verdict} the goal of {goal:g}x)",
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=5_000, help="on topic A before the stop")
    parser.add_argument("--new-events", type=int, default=500, help="arriving during each stop")
    parser.add_argument("--partitions", type=int, default=2, help="of each topic")
    parser.add_argument(
        "--new-source",
        choices=["kafka", "folder"],
        default="kafka",
        help="the migration's new source: topic B, or a folder of JSON files",
    )
    args = parser.parse_args()
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_CONF_DIR", str(ROOT / "conf"))
    os.environ.setdefault("STATEOPS_HOME", str(ROOT))
    root = Path(tempfile.mkdtemp(prefix="bench-kafka-migration-"))
    broker = s3 = None
    try:
        broker = start_broker(root / "kafka")
        port = free_port()
        s3 = start_s3_server(root / "s3", [BUCKET], KEY, SECRET, port)
        os.environ.update(
            STATEOPS_KAFKA_BOOTSTRAP_SERVERS=broker.bootstrap_servers,
            STATEOPS_S3_ENDPOINT_URL=f"http://127.0.0.1:{port}",
            AWS_ACCESS_KEY_ID=KEY,
            AWS_SECRET_ACCESS_KEY=SECRET,
        )
        run(root, broker.bootstrap_servers, args)
        shutil.rmtree(root, ignore_errors=True)
    except SystemExit:
        print(f"kept for a look: {root} (logs/, kafka/broker.log)", file=sys.stderr)
        raise
    finally:
        if broker is not None:
            broker.stop()
        if s3 is not None:
            s3.terminate()
            s3.wait(timeout=20)


def run(root: Path, servers: str, args: argparse.Namespace) -> None:
    create_topics(servers, args.partitions, "A", "B")
    now = int(time.time() * 1000) - 3_600_000  # an hour ago: in the past, well within retention
    produce(servers, "A", events(0, args.events, now))
    reg = registry(root, "A")
    checkpoint = root / "data" / "checkpoints" / "page_visits"
    logs = root / "logs"
    logs.mkdir()

    started = time.time()
    old = Run(reg, logs / "run-1.log")
    old.until("the first run reading A", lambda: caught_up(checkpoint, servers, "A"))
    print(
        f"page_visits read {args.events} events of topic A ({args.partitions} partitions) in "
        f"{time.time() - started:.1f} s (a continuous run, 1-second trigger, local[2], RocksDB)",
        flush=True,
    )

    # Baseline: stop, and start again at once; new events arrive while it is down.
    before = last_commit(checkpoint)
    subprocess.run(
        [str(BIN / "stateops"), "--registry", str(reg), "stop", "page_visits"],
        check=True,
        capture_output=True,
    )
    stopped = old.ended_at()
    old = Run(reg, logs / "run-2.log")
    produce(servers, "A", events(args.events, args.new_events, now))
    batch, committed = wait_for("the restart's commit", lambda: committed_after(checkpoint, before))
    baseline = committed - stopped
    print(f"plain restart: batch {batch} committed {baseline:.2f} s after the stop", flush=True)
    old.until("the restart reading A", lambda: caught_up(checkpoint, servers, "A"))

    # The migration, which stops the running query itself.
    new_checkpoint = root / "data" / "checkpoints" / "page_visits.v2"
    new_source = new_source_args(root, servers, args, now)
    command = [
        str(BIN / "stateops"),
        "--registry",
        str(reg),
        "migrate",
        "page_visits",
        *new_source,
        "--new-checkpoint",
        str(new_checkpoint),
    ]
    begun = time.time()
    proc = subprocess.run(command, capture_output=True, text=True)
    finished = time.time()
    if proc.returncode != 0:
        sys.exit(f"{' '.join(command[3:])} failed:\n{proc.stderr[-3000:]}")
    stopped = old.ended_at()
    lineage = json.loads(proc.stdout.strip().splitlines()[-1])
    road = lineage["carry_over"]
    # A transplant copies the old checkpoint's last commits, and the new query goes on after
    # them; the initialState road's first batch is the new checkpoint's batch 0.
    after = lineage["from"]["last_committed_batch"] if road == "transplant" else -1
    first = committed_after(new_checkpoint, after)
    if first is None:
        sys.exit(f"the migration committed no batch after {after} in {new_checkpoint}")
    batch, committed = first
    migration = committed - stopped
    print(
        f"migration ({' '.join(new_source)}): the old query stopped {stopped - begun:.2f} s "
        f"after the command began; batch {batch} committed on the new checkpoint "
        f"{migration:.2f} s after the stop; the command ended {finished - committed:.2f} s "
        f"later (proof, validation, switch); road {road}",
        flush=True,
    )
    for line in figures(baseline, migration):
        print(line)


def new_source_args(root: Path, servers: str, args: argparse.Namespace, now: int) -> list[str]:
    """The new source holding ``--new-events`` (what arrived after the cutover), as
    ``stateops migrate`` options."""
    records = events(args.events + args.new_events, args.new_events, now)
    if args.new_source == "kafka":
        produce(servers, "B", records)
        return [
            "--new-source-format",
            "kafka",
            "--new-source-topic",
            "B",
            "--new-source-start",
            "earliest",
        ]
    folder = root / "data" / "landing" / "B"
    folder.mkdir(parents=True)
    with open(folder / "part-0.json", "w") as out:
        for _, value, _ in records:
            out.write(json.dumps(value) + "\n")
    return ["--new-source-format", "json", "--new-source-path", "landing/B"]


if __name__ == "__main__":
    main()
