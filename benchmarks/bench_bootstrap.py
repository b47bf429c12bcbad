"""Export and bootstrap of N keys against replaying the events that built the same state.

    .venv/bin/python benchmarks/bench_bootstrap.py [--keys 100000] [--events-per-key 10]
        [--partitions 8]

page_visits, local[2], RocksDB, 8 state partitions (``--partitions``), through the project's
spark-submit jobs (so every figure includes a JVM start of a few seconds). Replay: run_query.py
over all events into a new checkpoint. Export: export_state.py of that state. Bootstrap:
bootstrap_state.py from the export into a new checkpoint, with one small file so that batch 0
commits."""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from stateops.spark.jobs import spark_submit_command

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent  # the venv's scripts (stateops)


def job(name: str, *args: str) -> tuple[float, str]:
    """(seconds, the job's last line of output: its JSON summary where it prints one)."""
    start = time.perf_counter()
    command = spark_submit_command(name, "local[2]", args, ["--driver-memory", "4g"])
    proc = subprocess.run(command, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"{name} failed:\n{(proc.stdout + proc.stderr)[-3000:]}")
    return time.perf_counter() - start, (proc.stdout.strip().splitlines() or [""])[-1]


def registry(root: Path, checkpoint: str, landing: str, partitions: int) -> Path:
    raw = yaml.safe_load((ROOT / "registry.yaml").read_text())
    spec = raw["queries"]["page_visits"]
    spec.update(checkpoint=checkpoint, shuffle_partitions=partitions)
    spec["source"] = {**spec["source"], "path": landing, "options": {}}
    raw = {"data_dir": str(root), "queries": {"page_visits": spec}}
    path = root / f"{checkpoint.replace('/', '_')}.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def write_events(folder: Path, keys: int, per_key: int, files: int, seed: int = 1) -> int:
    rng = random.Random(seed)
    folder.mkdir(parents=True)
    handles = [open(folder / f"part-{i:03d}.json", "w") for i in range(files)]
    for k in range(keys):
        for e in range(per_key):
            row = {
                "user_id": f"u{k:08d}",
                "page": f"p{rng.randrange(50)}",
                "event_time": f"2026-01-01T00:{e % 60:02d}:00Z",
            }
            handles[(k + e) % files].write(json.dumps(row) + "\n")
    for h in handles:
        h.close()
    return keys * per_key


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", type=int, default=100_000)
    parser.add_argument("--events-per-key", type=int, default=10)
    parser.add_argument("--partitions", type=int, default=8, help="the query's state partitions")
    args = parser.parse_args()
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_CONF_DIR", str(ROOT / "conf"))
    root = Path(tempfile.mkdtemp(prefix="bench-bootstrap-"))
    try:
        run(root, args.keys, args.events_per_key, args.partitions)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def run(root: Path, keys: int, per_key: int, partitions: int) -> None:
    events = write_events(root / "landing" / "all", keys, per_key, files=4)
    (root / "landing" / "new").mkdir(parents=True)
    (root / "landing" / "new" / "one.json").write_text(
        json.dumps({"user_id": "u00000000", "page": "p1", "event_time": "2026-01-02T00:00:00Z"})
        + "\n"
    )
    replay_reg = registry(root, "replayed", str(root / "landing" / "all"), partitions)
    replay, _ = job("run_query.py", "--registry", str(replay_reg), "--query", "page_visits")
    export, _ = job(
        "export_state.py", "--checkpoint", str(root / "replayed"), "--out", str(root / "export")
    )
    boot_reg = registry(root, "bootstrapped", str(root / "landing" / "new"), partitions)
    boot, summary = job(
        "bootstrap_state.py",
        "--registry",
        str(boot_reg),
        "--query",
        "page_visits",
        "--initial-state",
        str(root / "export"),
    )
    n = keys
    print(f"{n} keys, {events} events (page_visits, local[2], RocksDB, {partitions} partitions)")
    rows = [
        ("replay all events", replay),
        ("export state", export),
        ("bootstrap from export", boot),
    ]
    for label, seconds in rows:
        ratio = "(baseline)" if seconds is replay else f"{replay / seconds:6.1f}x faster"
        print(f"{label:<22}{seconds:8.1f} s  {n / seconds:9.0f} keys/s  {ratio}")
    proof = json.loads(summary)["proof"]
    print(
        f"  bootstrap includes validation and the carry-over proof: {proof['seconds']} s, "
        f"{proof['sample']}, proven: {proof['ok']}"
    )


if __name__ == "__main__":
    main()
