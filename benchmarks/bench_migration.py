"""Carrying the state of N keys to a new source, by both roads, against replaying every event.

    .venv/bin/python benchmarks/bench_migration.py [--keys 1000000] [--events-per-key 10]
        [--new-share 100] [--pipeline counter|page_visits] [--partitions 8] [--new-partitions N]

local[2], RocksDB, 8 state partitions (``--partitions``), through the project's spark-submit
jobs and CLI (every figure includes a JVM or Python start). The pipeline: ``counter`` (default;
a visit count per user, one value per key: stateops.pipelines.visit_counter) or ``page_visits``
(a list of pages and a count per user; about 3 times the per-key work). The old query is built
over all but the last event of each key (JSON; not timed). The new source (Parquet) holds the
last event of 1 in ``--new-share`` keys: what arrives after the cutover. Timed, in one run:

- replay: ``run_query.py`` over every event (old and new) into a new checkpoint (the baseline);
- initialState road: ``export_state.py`` + ``bootstrap_state.py`` (which runs batch 0 on the
  new source and proves it);
- transplant road: ``stateops transplant`` (the carry-over: checks and a file copy), then
  ``run_query.py`` on the new source (its first batch, proven against the old state).

``--new-partitions N`` (other than the old query's): the new query wants N state partitions. The
replay and the initialState road write N from the start; the transplant keeps the old count and
``run_query.py`` first has Spark repartition the new checkpoint (batch N + 1, proven), then runs
the first batch.

Each road's carry-over is printed with its ratio against the replay, and so is each road up to
a proven first batch on the new source.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import yaml
from bench_bootstrap import BIN, job, write_events

ROOT = Path(__file__).resolve().parents[1]


COUNTER = {
    "processor": {
        "class": "stateops.pipelines.visit_counter:VisitCounter",
        "time_mode": "None",
        "output_mode": "Update",
    },
    "initial_state": {
        "schema": "user_id STRING, visits BIGINT",
        "unique_keys": True,
        "from_export": {"variable": "count", "user_id": "key.user_id", "visits": "value.visits"},
    },
    "expectations": {"non_negative": ["count.value_visits"]},
    "output_schema": "user_id STRING, visits LONG",
}
PIPELINE = {"counter": COUNTER, "page_visits": {}}


def registry(
    root: Path,
    pipeline: str,
    name: str,
    checkpoint: str,
    landing: Path,
    fmt: str = "json",
    partitions: int = 8,
) -> Path:
    raw = yaml.safe_load((ROOT / "registry.yaml").read_text())
    spec = raw["queries"]["page_visits"] | PIPELINE[pipeline]
    spec.update(checkpoint=checkpoint, shuffle_partitions=partitions)
    spec["source"] = {**spec["source"], "format": fmt, "path": str(landing), "options": {}}
    spec["sink"] = {**spec["sink"], "path": f"output/{checkpoint}"}
    path = root / name
    path.write_text(yaml.safe_dump({"data_dir": str(root), "queries": {"page_visits": spec}}))
    return path


def new_events(keys: int, per_key: int, share: int) -> list[dict]:
    """The last event of 1 in ``share`` keys (the one the old source does not hold)."""
    e = per_key - 1
    at = datetime(2026, 1, 1, 1, e % 60, tzinfo=UTC)
    return [
        {"user_id": f"u{k:08d}", "page": f"p{k % 50}", "event_time": at}
        for k in range(0, keys, share)
    ]


def timed(*cmd: str) -> tuple[float, str]:
    """(seconds, last line of output) of a command; exits on failure."""
    start = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed:\n{(proc.stdout + proc.stderr)[-3000:]}")
    return time.perf_counter() - start, (proc.stdout.strip().splitlines() or [""])[-1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", type=int, default=1_000_000)
    parser.add_argument("--events-per-key", type=int, default=10)
    parser.add_argument(
        "--new-share",
        type=int,
        default=100,
        metavar="M",
        help="the new source holds new events of 1 in M keys",
    )
    parser.add_argument("--pipeline", choices=sorted(PIPELINE), default="counter")
    parser.add_argument(
        "--partitions", type=int, default=8, metavar="N", help="the old query's state partitions"
    )
    parser.add_argument(
        "--new-partitions",
        type=int,
        metavar="N",
        help="the new query's state partitions (default: the old query's)",
    )
    args = parser.parse_args()
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_CONF_DIR", str(ROOT / "conf"))
    root = Path(tempfile.mkdtemp(prefix="bench-migration-"))
    try:
        run(
            root,
            args.pipeline,
            args.keys,
            args.events_per_key,
            args.new_share,
            args.partitions,
            args.new_partitions or args.partitions,
        )
    finally:
        shutil.rmtree(root, ignore_errors=True)


def run(root: Path, pipeline: str, keys: int, per_key: int, share: int, old_n: int, n: int) -> None:
    landing = root / "landing"
    old_events = write_events(landing / "old", keys, per_key - 1, files=4)
    rows = new_events(keys, per_key, share)
    (landing / "new").mkdir()
    table = pa.Table.from_pylist(
        rows,
        schema=pa.schema(
            [
                ("user_id", pa.string()),
                ("page", pa.string()),
                ("event_time", pa.timestamp("us", "UTC")),
            ]
        ),
    )
    pq.write_table(table, landing / "new" / "part-0.parquet")
    shutil.copytree(landing / "old", landing / "all")  # the replay reads every event
    with open(landing / "all" / "part-new.json", "w") as out:
        for row in rows:
            out.write(json.dumps({**row, "event_time": row["event_time"].isoformat()}) + "\n")

    old = registry(root, pipeline, "old.yaml", "old", landing / "old", partitions=old_n)
    built, _ = job("run_query.py", "--registry", str(old), "--query", "page_visits")
    print(
        f"{keys} keys, {old_events} events in the old source, {len(rows)} in the new one "
        f"({pipeline}, local[2], RocksDB, {old_n} partitions; the new query {n}); the old query "
        f"was built in {built:.1f} s",
        flush=True,
    )

    all_reg = registry(root, pipeline, "all.yaml", "replayed", landing / "all", partitions=n)
    replay, _ = job("run_query.py", "--registry", str(all_reg), "--query", "page_visits")
    print(f"replay: {replay:.1f} s", flush=True)

    export, _ = job(
        "export_state.py", "--checkpoint", str(root / "old"), "--out", str(root / "export")
    )
    boot_reg = registry(root, pipeline, "boot.yaml", "bootstrapped", landing / "new", "parquet", n)
    boot, boot_summary = job(
        "bootstrap_state.py",
        "--registry",
        str(boot_reg),
        "--query",
        "page_visits",
        "--initial-state",
        str(root / "export"),
    )
    print(f"initialState road: export {export:.1f} s, bootstrap {boot:.1f} s", flush=True)

    tp_reg = registry(root, pipeline, "tp.yaml", "transplanted", landing / "new", "parquet", n)
    copy, _ = timed(
        str(BIN / "stateops"),
        "--registry",
        str(tp_reg),
        "transplant",
        str(root / "old"),
        str(root / "transplanted"),
        "--query",
        "page_visits",
    )
    first, tp_summary = job("run_query.py", "--registry", str(tp_reg), "--query", "page_visits")

    proofs = {
        name: json.loads(s)["proof"]
        for name, s in (("initialState", boot_summary), ("transplant", tp_summary))
    }
    repartitioned = json.loads(tp_summary)["repartitioned"]
    if (repartitioned is None) != (n == old_n):
        sys.exit(f"the transplanted query's repartition: {repartitioned}, expected one to {n}")
    then = "" if repartitioned is None else " + repartition"
    figures = [
        ("replay of every event", replay),
        ("initialState carry-over (export + bootstrap)", export + boot),
        ("transplant carry-over (stateops transplant)", copy),
        (f"transplant{then} + first batch and its proof", copy + first),
    ]
    for label, seconds in figures:
        ratio = "(baseline)" if seconds is replay else f"{replay / seconds:6.2f}x replay's speed"
        print(f"{label:<54}{seconds:8.1f} s  {ratio}")
    for name, proof in proofs.items():
        print(f"  {name} proof: {proof['seconds']} s, {proof['sample']}, proven: {proof['ok']}")
    if repartitioned:
        print(
            f"  Spark's repartition {repartitioned['partitions'][0]} -> "
            f"{repartitioned['partitions'][1]} (batch {repartitioned['batch']}): "
            f"{repartitioned['seconds']} s, proven: {repartitioned['proof']}"
        )


if __name__ == "__main__":
    main()
