"""The whole source migration of N keys against replaying every event into a new query.

    .venv/bin/python benchmarks/bench_migration.py [--keys 100000] [--events-per-key 10]

page_visits, local[2], RocksDB. The old source (JSON) holds all but the last event of each key;
the old query is run over it first (not timed). Then, in one run: the migration DAG through
``airflow dags test`` (SQLite, local Spark, the embedded S3 endpoint for its backup) moves the
query to a Parquet source holding each key's last event; and a replay runs ``run_query.py`` over
every event into a new checkpoint, which builds the same state. Printed: each task's time (where
the time goes), the carry-over part (export + bootstrap) and the whole migration, with the
replay as the baseline.
"""

from __future__ import annotations

import argparse
import json
import os
import re
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
from bench_bootstrap import job, write_events

from stateops.s3server import free_port, start_s3_server

ROOT = Path(__file__).resolve().parents[1]
KEY, SECRET = "bench", "bench-secret"


def registry(root: Path, name: str, checkpoint: str, landing: str, fmt: str = "json") -> Path:
    raw = yaml.safe_load((ROOT / "registry.yaml").read_text())
    spec = raw["queries"]["page_visits"]
    spec.update(checkpoint=checkpoint, shuffle_partitions=8)
    spec["source"] = {**spec["source"], "format": fmt, "path": landing, "options": {}}
    spec["sink"] = {**spec["sink"], "path": f"output/{checkpoint}"}
    raw = {"data_dir": str(root), "backups": {"url": "s3://backups", "conn_id": "aws_default"},
           "queries": {"page_visits": spec}}  # fmt: skip
    path = root / name
    path.write_text(yaml.safe_dump(raw))
    return path


def last_events(folder: Path, keys: int, per_key: int) -> None:
    """Each key's last event (the one write_events leaves out of the old source), as Parquet."""
    folder.mkdir(parents=True)
    e = per_key - 1
    table = pa.table({
        "user_id": [f"u{k:08d}" for k in range(keys)],
        "page": [f"p{k % 50}" for k in range(keys)],
        "event_time": pa.array([datetime(2026, 1, 1, 1, e % 60, tzinfo=UTC)] * keys,
                               pa.timestamp("us", "UTC")),
    })  # fmt: skip
    pq.write_table(table, folder / "part-0.parquet")


def airflow(root: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", "-c", 'source scripts/env.sh && exec airflow "$@"', "airflow", *args],
        cwd=ROOT, env=env, capture_output=True, text=True,
    )  # fmt: skip


def task_seconds(log: str) -> dict[str, float]:
    """Per task, seconds between its ``[DAG TEST] starting`` and ``end task`` log lines."""
    started, seconds = {}, {}
    pattern = r"^(\S+) .*\[DAG TEST\] (starting|end task) task_id=(\w+)"
    for m in re.finditer(pattern, log, re.M):
        at = datetime.fromisoformat(m.group(1).replace("Z", "+00:00")).timestamp()
        if m.group(2) == "starting":
            started[m.group(3)] = at
        elif m.group(3) in started:
            seconds[m.group(3)] = at - started[m.group(3)]
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", type=int, default=100_000)
    parser.add_argument("--events-per-key", type=int, default=10)
    args = parser.parse_args()
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_CONF_DIR", str(ROOT / "conf"))
    root = Path(tempfile.mkdtemp(prefix="bench-migration-"))
    s3 = start_s3_server(root / "s3", ["backups"], KEY, SECRET, port := free_port())
    try:
        run(root, args.keys, args.events_per_key, f"http://127.0.0.1:{port}")
    finally:
        s3.terminate()
        s3.wait()
        shutil.rmtree(root, ignore_errors=True)


def run(root: Path, keys: int, per_key: int, endpoint: str) -> None:
    old_events = write_events(root / "landing" / "old", keys, per_key - 1, files=4)
    last_events(root / "landing" / "new", keys, per_key)
    all_events = root / "landing" / "all"
    shutil.copytree(root / "landing" / "old", all_events)
    with open(all_events / "part-999.json", "w") as out:  # the replay reads the last events too
        for k in range(keys):
            out.write(json.dumps({"user_id": f"u{k:08d}", "page": f"p{k % 50}",
                                  "event_time": f"2026-01-01T01:{(per_key - 1) % 60:02d}:00Z"})
                      + "\n")  # fmt: skip

    path = registry(root, "registry.yaml", "old", str(root / "landing" / "old"))
    built, _ = job("run_query.py", "--registry", str(path), "--query", "page_visits")
    conn = {"conn_type": "aws", "login": KEY, "password": SECRET,
            "extra": {"endpoint_url": endpoint}}  # fmt: skip
    env = {
        **os.environ,
        "AIRFLOW_HOME": str(root / "airflow"),
        "STATEOPS_REGISTRY": str(path),
        "STATEOPS_DATA_DIR": str(root),
        "AIRFLOW_CONN_AWS_DEFAULT": json.dumps(conn),
    }
    if airflow(root, env, "db", "migrate").returncode != 0:
        sys.exit("airflow db migrate failed")
    conf = {"query": "page_visits", "new_source_format": "parquet",
            "new_source_path": str(root / "landing" / "new"), "dry_run": False}  # fmt: skip
    start = time.perf_counter()
    proc = airflow(root, env, "dags", "test", "stream_source_migration", "--conf", json.dumps(conf))
    migration = time.perf_counter() - start
    log = proc.stdout + proc.stderr
    if proc.returncode != 0 or "switched to" not in log:
        sys.exit(f"the migration failed:\n{log[-5000:]}")

    replay_path = registry(root, "replay.yaml", "replayed", str(all_events))
    replay, _ = job("run_query.py", "--registry", str(replay_path), "--query", "page_visits")

    tasks = task_seconds(log)
    carry = tasks.get("export", 0) + tasks.get("bootstrap", 0)
    print(
        f"{keys} keys, {old_events} events in the old source, {keys} in the new (page_visits, "
        f"local[2], RocksDB, 8 partitions); the old query was built in {built:.1f} s"
    )
    for label, seconds in [("replay of every event", replay),
                           ("carry-over (export + bootstrap)", carry),
                           ("whole migration (airflow dags test)", migration)]:  # fmt: skip
        ratio = "(baseline)" if seconds is replay else f"{replay / seconds:5.2f}x replay's speed"
        print(f"{label:<38}{seconds:8.1f} s  {ratio}")
    print("where the migration's time goes (seconds per task):")
    for task, seconds in sorted(tasks.items(), key=lambda t: -t[1]):
        print(f"  {task:<22}{seconds:7.1f}")
    print(f"  {'airflow and the rest':<22}{migration - sum(tasks.values()):7.1f}")


if __name__ == "__main__":
    main()
