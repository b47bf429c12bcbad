"""A code upgrade's state rewrite of N keys against the only alternative a user has without it:
replaying every event with the new code into a new checkpoint.

    .venv/bin/python benchmarks/bench_upgrade.py [--keys 1000000] [--events-per-key 10]
        [--partitions 8]

local[2], RocksDB, 8 state partitions (``--partitions``), through the project's CLI and
spark-submit jobs (every figure includes a JVM or Python start; every Spark job gets a 4 GB
driver). The old code: the visit
counter (value state ``count``, ``visits LONG`` per user: stateops.pipelines.visit_counter, as
bench_migration's ``counter``), built over every event (JSON; not timed). The new code
(benchmarks/user_code/counter_upgrade.py, on the registry's ``code_paths``): ``count`` gains a
``first_page`` field, which Spark refuses on this checkpoint, so the state must be rewritten;
its mapping keeps each user's visits (the first page is unknown before the upgrade). Timed, in
one run:

- replay: ``run_query.py`` with the new code over every event into a new checkpoint (the
  baseline);
- ``stateops upgrade page_visits``: plan, backup (to the embedded S3 endpoint, rclone on
  loopback), export, rewrite (the mapping and the new checkpoint's batch 0), prove, validate,
  switch; with its parts as its log shows them.

Then both new checkpoints are exported (not timed): the upgraded state must hold as many keys
as the replay's.
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
from pathlib import Path

import yaml
from bench_bootstrap import BIN, job, write_events
from bench_migration import registry

from stateops.core.registry import load_registry
from stateops.dev.s3server import free_port, start_s3_server, stop_server

ROOT = Path(__file__).resolve().parents[1]
KEY, SECRET = "bench", "bench-secret"

NEW_CODE = {
    "processor": {
        "class": "counter_upgrade:FirstPageCounter",
        "time_mode": "None",
        "output_mode": "Update",
    },
    "initial_state": {
        "schema": "user_id STRING, visits BIGINT, first_page STRING",
        "unique_keys": True,
        "mapping": "counter_upgrade:with_first_page",
    },
    "output_schema": "user_id STRING, visits LONG, first_page STRING",
}


# The upgrade's steps and the line of its log (the CLI's and its jobs') each ends with.
PARTS = [
    ("plan, stop, backup", " uploaded ("),
    ("export (export_state.py)", '"entries": ['),
    ("rewrite: mapping + batch 0 (bootstrap_state.py)", '"operation": "bootstrap"'),
    ("prove", ": carry-over proven"),
    ("validate (validate_state.py), switch", " upgraded: it runs its new code on "),
]


def with_new_code(path: Path, backups: str) -> Path:
    """The registry at ``path`` with the new code deployed (the checkpoint stays)."""
    raw = yaml.safe_load(path.read_text())
    raw["queries"]["page_visits"].update(NEW_CODE)
    raw["code_paths"] = [str(ROOT / "benchmarks" / "user_code")]
    raw["backups"] = {"url": backups}
    path.write_text(yaml.safe_dump(raw))
    return path


def logged(env: dict[str, str], *cmd: str) -> tuple[float, list[tuple[float, str]]]:
    """(seconds, each line of output with the second it came at) of a command; exits on
    failure."""
    start = time.perf_counter()
    lines: list[tuple[float, str]] = []
    with subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env
    ) as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append((time.perf_counter() - start, line.rstrip("\n")))
    seconds = time.perf_counter() - start
    if proc.returncode != 0:
        said = "\n".join(line for _, line in lines)[-3000:]
        sys.exit(f"{' '.join(cmd)} failed:\n{said}")
    return seconds, lines


def state_of(root: Path, checkpoint: str, name: str) -> dict:
    """The job's summary of an export of ``checkpoint``'s state (rows per variable)."""
    (root / "exports").mkdir(exist_ok=True)
    out = str(root / "exports" / name)
    _, summary = job("export_state.py", "--checkpoint", checkpoint, "--out", out)
    return {e["variable"]: e["rows"] for e in json.loads(summary)["entries"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", type=int, default=1_000_000)
    parser.add_argument("--events-per-key", type=int, default=10)
    parser.add_argument("--partitions", type=int, default=8, help="the query's state partitions")
    args = parser.parse_args()
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_CONF_DIR", str(ROOT / "conf"))
    root = Path(tempfile.mkdtemp(prefix="bench-upgrade-"))
    server = None
    try:
        port = free_port()
        server = start_s3_server(root / "s3", ["bench"], KEY, SECRET, port)
        run(root, args.keys, args.events_per_key, args.partitions, f"http://127.0.0.1:{port}")
    finally:
        if server is not None:
            stop_server(server)
        shutil.rmtree(root, ignore_errors=True)


def run(root: Path, keys: int, per_key: int, partitions: int, endpoint: str) -> None:
    load = os.getloadavg()[0]
    landing = root / "landing"
    events = write_events(landing, keys, per_key, files=4)
    old = registry(root, "counter", "old.yaml", "old", landing, partitions=partitions)
    built, _ = job("run_query.py", "--registry", str(old), "--query", "page_visits")
    print(
        f"{keys} keys, {events} events (visit counter, local[2], RocksDB, {partitions} "
        f"partitions); the old code's query was built in {built:.1f} s",
        flush=True,
    )

    new = registry(root, "counter", "new.yaml", "replayed", landing, partitions=partitions)
    new = with_new_code(new, "s3://bench")
    replay, _ = job("run_query.py", "--registry", str(new), "--query", "page_visits")
    print(f"replay: {replay:.1f} s", flush=True)

    with_new_code(old, "s3://bench/backups")
    env = {
        **os.environ,
        "STATEOPS_S3_ENDPOINT_URL": endpoint,
        "AWS_ACCESS_KEY_ID": KEY,
        "AWS_SECRET_ACCESS_KEY": SECRET,
        "SPARK_DRIVER_MEMORY": "4g",  # as job() gives the replay
    }
    cli = [str(BIN / "stateops"), "--registry", str(old), "upgrade", "page_visits"]
    seconds, lines = logged(env, *cli)
    upgraded = load_registry(old).query("page_visits").checkpoint
    ours = state_of(root, upgraded, "upgraded")
    theirs = state_of(root, str(root / "replayed"), "replayed")
    for label, s in (
        ("replay of every event with the new code", replay),
        ("stateops upgrade (the state rewrite)", seconds),
    ):
        ratio = "(baseline)" if s is replay else f"{replay / s:6.2f}x replay's speed"
        print(f"{label:<52}{s:8.1f} s  {ratio}")
    for label, s in parts(lines):
        print(f"  {label:<50}{s:8.1f} s")
    print(f"rewrite / replay: {seconds / replay:.2f}")
    same = "the same" if ours == theirs else "NOT THE SAME"
    print(f"keys in the state: upgraded {ours}, replayed {theirs}: {same}")
    print(f"load average (1 min) before and after: {load:.2f}, {os.getloadavg()[0]:.2f}")


def parts(lines: list[tuple[float, str]]) -> list[tuple[str, float]]:
    """The upgrade's steps, each up to the first line of its log that says it is done."""
    found, since = [], 0.0
    for label, done in PARTS:
        at = next((t for t, line in lines if done in line and t >= since), None)
        if at is None:
            break
        found.append((label, at - since))
        since = at
    return found


if __name__ == "__main__":
    main()
