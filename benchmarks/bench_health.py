"""The health DAG's cost (issue 57): stream_health's check of every registered query against
``stateops status`` of the same queries, in one run on one machine, and neither starting a JVM.

    source scripts/env.sh && .venv/bin/python benchmarks/bench_health.py [--runs 3]

The project's file queries (registry.yaml) each run once by ``stateops run`` on sample input
(Spark: the set-up, not measured), with more input landed after and not read. Then, with every
JVM start recorded instead of made (``java`` on PATH and ``$JAVA_HOME/bin/java`` a stand-in
that fails), the median of ``--runs`` of:

- ``stateops status --json --no-backups`` of every query: the baseline;
- the checks' own work in one process: what each ``health_<query>`` task does but send its
  gauges (its status after the readiness watch, :func:`stateops.alerts.watch_readiness`, the
  point it records in the query's history, and the rules that fire);
- ``airflow dags test stream_health``: the DAG run whole, Airflow's start and task overhead
  included (its backup listing finds no connection, said as a finding, as status skips it).

Prints the seconds of each, the ratios against the baseline, and the JVM starts (0).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # tests.conftest: the tests' registry and java stand-in

from tests.conftest import java_stand_in, write_registry  # noqa: E402

CHECKS = """
import json, sys, time
from stateops.alerts import firing, watch_readiness
from stateops.control.history import check_point, record
from stateops.core.registry import load_registry
start = time.perf_counter()
registry = load_registry()
fired = {}
for n in registry.names:
    status = watch_readiness(registry, n)
    if n in registry.queries:
        record(registry, n, check_point(status))
    fired[n] = firing(status["health"])
print(json.dumps({"seconds": time.perf_counter() - start, "fired": fired}))
"""


def _shell(command: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    """``command`` in bash with scripts/env.sh sourced (as the README runs things)."""
    return subprocess.run(
        ["bash", "-c", f"source scripts/env.sh && {command}"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )


def _timed(command: str, env: dict[str, str], ok: tuple[int, ...] = (0,)) -> float:
    start = time.perf_counter()
    proc = _shell(command, env)
    seconds = time.perf_counter() - start
    if proc.returncode not in ok:
        raise SystemExit(
            f"{command} exited {proc.returncode}:\n{(proc.stdout + proc.stderr)[-3000:]}"
        )
    return seconds


def _set_up(root: Path, env: dict[str, str]) -> list[str]:
    """The file queries (the tests' registry), each run once by Spark, then more input
    landed: their names."""
    from stateops.dev.sampledata import generate_events

    queries = list(yaml.safe_load(write_registry(root).read_text())["queries"])
    landing = {d: root / "landing" / d for d in ("user_sessions", "page_visits")}
    generate_events(landing, files=2, round_=0)
    for name in queries:
        print(f"set-up: stateops run {name}", file=sys.stderr)
        _timed(f"stateops run {name}", env)
    generate_events(landing, files=1, round_=1)
    print("set-up: airflow db migrate", file=sys.stderr)
    _timed("airflow db migrate", env)
    return queries


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="stateops-bench-health-"))
    try:
        env = {
            **os.environ,
            "STATEOPS_REGISTRY": str(root / "registry.yaml"),
            "STATEOPS_DATA_DIR": str(root),
            "AIRFLOW_HOME": str(root / "airflow"),
        }
        queries = _set_up(root, env)
        stand_in, recorded = java_stand_in(root / "no-jvm")
        env |= stand_in
        status, checks, dag = [], [], []
        for _ in range(args.runs):
            status.append(_timed("stateops status --json --no-backups", env, ok=(0, 1)))
            proc = _shell('exec python -c "$CHECKS"', {**env, "CHECKS": CHECKS})
            if proc.returncode != 0:
                raise SystemExit(f"the checks failed:\n{proc.stderr[-3000:]}")
            checks.append(json.loads(proc.stdout.splitlines()[-1])["seconds"])
            dag.append(_timed("airflow dags test stream_health", env, ok=(0, 1)))
        base = statistics.median(status)
        jvm = recorded()
        print(f"queries: {len(queries)} ({', '.join(queries)}), runs: {args.runs}")
        for what, runs in (
            ("stateops status (baseline)", status),
            ("the checks' own work", checks),
            ("airflow dags test stream_health", dag),
        ):
            seconds = statistics.median(runs)
            print(f"  {what:<34} {seconds:7.2f} s  {seconds / base:5.2f}x")
        print(f"JVM starts: {len(jvm)}")
        if jvm:
            raise SystemExit(f"a JVM was started: {jvm[:3]}")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
