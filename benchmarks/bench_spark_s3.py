"""Spark on S3 checkpoints: a batch on S3 against local disk, and what a cleanup saves on S3.

    .venv/bin/python benchmarks/bench_spark_s3.py [--batches 12] [--chunks 4] [--chunk 10]
        [--retain 10] [--turns 3]

page_visits (RocksDB, 4 state partitions, local[2], one landing file a batch) in this
process's Spark session, its checkpoint written by Spark itself: on local disk or through
``s3a://`` on the embedded S3 endpoint (SeaweedFS on loopback, started and stopped here; the
project's checkpoint file manager). One run, each figure against a baseline of the same run:

- **a batch**: the same query over the same ``--batches`` files, once on a local checkpoint
  (the baseline) and once on S3; the time of each batch as Spark reports it
  (``durationMs.triggerExecution``), the median of each. A short warm-up run on local disk
  goes first (the JVM's first batches are slow whatever the storage), then three runs
  (``--turns``) on each storage, taken in turns.
- **cleanup**: the query run ``--chunks`` times, ``--chunk`` files each, on two S3
  checkpoints: one never cleaned (the baseline), one cleaned after each run (``stateops
  cleanup --retain-batches R``, as the scheduled cleanup does). Then the objects each holds
  and the S3 requests (LIST, GET, HEAD) of a later operation on each: ``inspect`` (the
  checkpoint model) and ``verify`` (every checksum read). The requests are the library's own
  (``stateops.core.storage``'s client, counted by operation); Spark's own listing at a
  restart is not counted here.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "include"))

KEY, SECRET, BUCKET = "bench", "bench-secret", "bench-spark"
NAME = "page_visits"
TURNS = 3  # runs per storage for the batch times (--turns)


def median_ms(durations: list[float]) -> float:
    """The median of ``durations`` (ms); 0 when there are none."""
    return statistics.median(durations) if durations else 0.0


def batch_figures(local_ms: list[float], s3_ms: list[float]) -> list[str]:
    """The batch lines: each storage's median and batch count, S3's as a ratio of local's."""
    local, s3 = median_ms(local_ms), median_ms(s3_ms)
    ratio = f"{s3 / local:5.2f}x local" if local else "  n/a"
    return [
        f"  local disk  {local:8.0f} ms  median of {len(local_ms)} batches  (baseline)",
        f"  S3 (s3a://) {s3:8.0f} ms  median of {len(s3_ms)} batches  {ratio}",
    ]


def saving_figures(objects: dict[str, int], requests: dict[str, dict[str, Counter]]) -> list[str]:
    """The cleanup lines: objects left and each later operation's requests, never cleaned
    (``kept``, the baseline) against cleaned after each run (``cleaned``), and what that saves."""

    def saved(before: int, after: int) -> str:
        return f"{before - after:6} fewer ({(before - after) / before:.0%})" if before else ""

    lines = [
        f"  objects left        {objects['kept']:6} never cleaned  {objects['cleaned']:6} "
        f"cleaned  {saved(objects['kept'], objects['cleaned'])}"
    ]
    for op in requests["kept"]:
        kept, cleaned = requests["kept"][op], requests["cleaned"][op]
        total_k, total_c = sum(kept.values()), sum(cleaned.values())
        detail = ", ".join(f"{k} {kept[k]}->{cleaned[k]}" for k in sorted(kept | cleaned))
        lines.append(
            f"  {op + ' requests':<19} {total_k:6} never cleaned  {total_c:6} cleaned  "
            f"{saved(total_k, total_c)}  ({detail})"
        )
    return lines


def _short(op: str) -> str:
    """A request's kind: ListObjectsV2 -> LIST, GetObject -> GET, HeadObject -> HEAD."""
    return {"ListObjectsV2": "LIST", "GetObject": "GET", "HeadObject": "HEAD"}.get(op, op)


class Requests:
    """The library's S3 requests by kind, from its client's own events."""

    def __init__(self) -> None:
        from stateops.core import storage

        self.seen: Counter = Counter()
        client = storage._bucket_client()
        client.s3.meta.events.register("before-call.s3", self._count)

    def _count(self, model: Any, **_: Any) -> None:
        self.seen[_short(model.name)] += 1

    def of(self, work: Callable[[], Any]) -> Counter:
        before = Counter(self.seen)
        work()
        return self.seen - before


def write_registry(root: Path, checkpoints: dict[str, str]) -> Path:
    """page_visits once per checkpoint (``name: checkpoint``), each on ``root/landing``."""
    raw = yaml.safe_load((ROOT / "registry.yaml").read_text())
    spec = raw["queries"][NAME]
    queries = {}
    for name, checkpoint in checkpoints.items():
        queries[name] = spec | {
            "source": spec["source"] | {"path": f"landing/{name}"},
            "sink": {"format": "parquet", "path": f"output/{name}"},
            "checkpoint": checkpoint,
        }
    path = root / "registry.yaml"
    raw.update(data_dir=str(root), queries=queries)
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


def land(root: Path, name: str, files: int, round_: int) -> None:
    from stateops.dev.sampledata import generate_events

    generate_events(
        {NAME: root / "landing" / name}, events_per_file=200, users=200, files=files, round_=round_
    )


def run(spark: Any, registry: Path, name: str) -> list[float]:
    """One available-now run of ``name``: each batch's triggerExecution (ms)."""
    from stateops.core.registry import load_registry
    from stateops.spark.streaming import apply_query_conf, start_query

    query = load_registry(registry).query(name)
    apply_query_conf(spark, query)
    streaming = start_query(spark, query, available_now=True)
    streaming.awaitTermination()
    progress = streaming.recentProgress
    return [float(p["durationMs"]["triggerExecution"]) for p in progress if p["numInputRows"]]


def objects(url: str) -> int:
    """Objects under the checkpoint's prefix (S3A's directory markers left out), as the
    library lists a checkpoint."""
    from stateops.core.storage import list_files, location

    return len(list_files(location(url)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, default=12, help="batches timed per storage")
    parser.add_argument("--chunks", type=int, default=4, help="runs of the cleanup comparison")
    parser.add_argument("--chunk", type=int, default=10, help="batches a run")
    parser.add_argument("--retain", type=int, default=10, help="cleanup's --retain-batches")
    parser.add_argument("--turns", type=int, default=TURNS, help="runs per storage, in turns")
    args = parser.parse_args()

    from stateops.control.target import Target
    from stateops.core.checkpoint import load_checkpoint
    from stateops.core.registry import load_registry
    from stateops.core.verify import verify_checkpoint
    from stateops.dev.s3server import free_port, start_seaweedfs, stop_server
    from stateops.ops.cleanup import run_cleanup
    from stateops.spark.streaming import spark_session

    work = Path(tempfile.mkdtemp(prefix="bench-spark-s3-"))
    port = free_port()
    os.environ.update(
        STATEOPS_S3_ENDPOINT_URL=f"http://127.0.0.1:{port}",
        AWS_ACCESS_KEY_ID=KEY,
        AWS_SECRET_ACCESS_KEY=SECRET,
        STATEOPS_DATA_DIR=str(work),
    )
    os.environ.pop("STATEOPS_CHECKPOINT_CONN_ID", None)
    server, spark = None, None
    try:
        server = start_seaweedfs(work / "seaweedfs", [BUCKET], KEY, SECRET, port)
        s3 = f"s3://{BUCKET}"
        registry = write_registry(
            work,
            {
                "warmup": "checkpoints/warmup",
                "local": "checkpoints/local",
                "s3": f"{s3}/s3",
                "kept": f"{s3}/kept",
                "cleaned": f"{s3}/cleaned",
            },
        )
        started = time.time()
        spark = spark_session("bench-spark-s3", "local[2]")
        spark.sparkContext.setLogLevel("ERROR")

        land(work, "warmup", 3, 0)
        run(spark, registry, "warmup")
        # In turns, a run on each storage at a time: whatever else the machine does weighs on
        # both alike.
        timed: dict[str, list[float]] = {"local": [], "s3": []}
        for turn in range(args.turns):
            for where in timed:
                land(work, where, max(1, args.batches // args.turns), turn)
                timed[where] += run(spark, registry, where)
        print(
            f"A batch ({len(timed['s3'])} batches each in {args.turns} runs taken in turns, the "
            "same files; page_visits, RocksDB):"
        )
        print("\n".join(batch_figures(timed["local"], timed["s3"])))

        reg = load_registry(registry)
        for round_ in range(args.chunks):
            for name in ("kept", "cleaned"):
                land(work, name, args.chunk, round_)
                run(spark, registry, name)
            query = reg.query("cleaned")
            target = Target(query.checkpoint, reg, query)
            run_cleanup(target, args.retain, run_id=f"bench-{round_}", log=lambda _: None)
        counter = Requests()
        left, requests = {}, {}
        for name in ("kept", "cleaned"):
            url = reg.query(name).checkpoint
            left[name] = objects(url)
            requests[name] = {
                "inspect": counter.of(lambda url=url: load_checkpoint(url)),
                "verify": counter.of(lambda url=url: verify_checkpoint(url)),
            }
        batches = args.chunks * args.chunk
        print(
            f"Cleanup on S3 ({batches} batches in {args.chunks} runs; one checkpoint cleaned "
            f"after each run with --retain-batches {args.retain}, one never):"
        )
        print("\n".join(saving_figures(left, requests)))
        print(f"({time.time() - started:.0f} s in all)")
    finally:
        if spark is not None:
            spark.stop()
        if server is not None:
            stop_server(server)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
