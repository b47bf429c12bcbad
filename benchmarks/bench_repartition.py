"""Repartitioning the state of N keys against the only alternative a user has without it:
replaying every event into a new checkpoint with the new partition count.

    .venv/bin/python benchmarks/bench_repartition.py [--keys 1000000] [--events-per-key 5]
        [--from 4] [--to 8]

local[2], RocksDB, the visit counter (one value per key: stateops.pipelines.visit_counter),
through the project's CLI and spark-submit jobs (every figure includes a JVM start). The old
query is built over every event with ``--from`` partitions (not timed). Timed, in one run:

- replay: ``run_query.py`` over every event into a new checkpoint with ``--to`` partitions
  (the baseline);
- ``stateops repartition --partitions TO --no-backup``: plan, Spark's repartition, its proof
  (a full read of the state before and after, with each row's partition checked), verify.

Both end with the same state (the repartition's proof says so per store); the ratio is
printed against the replay.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

import yaml
from bench_bootstrap import BIN, job, write_events
from bench_migration import registry, timed

ROOT = Path(__file__).resolve().parents[1]


def with_partitions(path: Path, partitions: int) -> Path:
    raw = yaml.safe_load(path.read_text())
    raw["queries"]["page_visits"]["shuffle_partitions"] = partitions
    path.write_text(yaml.safe_dump(raw))
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", type=int, default=1_000_000)
    parser.add_argument("--events-per-key", type=int, default=5)
    parser.add_argument("--from", dest="before", type=int, default=4)
    parser.add_argument("--to", dest="after", type=int, default=8)
    args = parser.parse_args()
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_CONF_DIR", str(ROOT / "conf"))
    root = Path(tempfile.mkdtemp(prefix="bench-repartition-"))
    try:
        run(root, args.keys, args.events_per_key, args.before, args.after)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def run(root: Path, keys: int, per_key: int, before: int, after: int) -> None:
    landing = root / "landing"
    events = write_events(landing, keys, per_key, files=4)
    old = with_partitions(registry(root, "counter", "old.yaml", "old", landing), before)
    built, _ = job("run_query.py", "--registry", str(old), "--query", "page_visits")
    print(
        f"{keys} keys, {events} events (visit counter, local[2], RocksDB); the query with "
        f"{before} partitions was built in {built:.1f} s",
        flush=True,
    )

    new = with_partitions(registry(root, "counter", "new.yaml", "replayed", landing), after)
    replay, _ = job("run_query.py", "--registry", str(new), "--query", "page_visits")
    print(f"replay: {replay:.1f} s", flush=True)
    cli = [str(BIN / "stateops"), "--registry", str(old), "repartition", "page_visits"]
    seconds, _ = timed(*cli, "--partitions", str(after), "--no-backup", "--json")
    audit = [json.loads(line) for line in (root / "old.audit" / "audit.jsonl").open()]
    done = next(r for r in audit if r["operation"] == "repartition")
    assert done["result"] == "succeeded", done
    for label, s in (
        (f"replay of every event into {after} partitions", replay),
        (f"stateops repartition {before} -> {after} (with its proof)", seconds),
    ):
        ratio = "(baseline)" if s is replay else f"{replay / s:6.2f}x replay's speed"
        print(f"{label:<52}{s:8.1f} s  {ratio}")


if __name__ == "__main__":
    main()
