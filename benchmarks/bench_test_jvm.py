"""A test's Spark run: the tests' JVM settings and their shared session against a plain
spark-submit, on the job the tests run most.

    .venv/bin/python benchmarks/bench_test_jvm.py [--runs 5] [--no-warm-up]

``spark-submit run_query.py`` of page_visits on a test-sized input (2 files of 40 events,
2 partitions, a new checkpoint each run), in turn with ``SPARK_SUBMIT_OPTS`` empty (the
baseline), with ``tests.conftest.TEST_JVM_OPTIONS`` (C1, serial collector), and with those
and the class archive (``tests.conftest.jvm_env``: what the tests' spark-submit runs use; the
archive is dumped first if build/ has none), and in one long-lived session started with those
settings (``tests.spark.harness.run_in_session``: what library-level tests use). Prints the
median wall and CPU seconds (user + system of the job's processes: the spark-submit and its
children, or the session's JVM, its Python workers and this process) of each, and their
ratios: CPU is what a 2-core machine running two test workers side by side runs out of.
A warm-up run of the baseline and one in the session go first (``--no-warm-up``: none, for a
smoke run of the script; the first figures then include what a warm-up would have taken).
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.conftest import (  # noqa: E402
    jvm_env,
    run_query_command,
    spark_class_archive,
    write_registry,
)
from tests.spark.harness import land, run_in_session  # noqa: E402


def one_run(root: Path, registry: Path, env: dict[str, str]) -> tuple[float, float]:
    """(wall seconds, CPU seconds of the job's processes) of one run on a new checkpoint."""
    for name in ("checkpoints", "output", "_stateops"):
        shutil.rmtree(root / name, ignore_errors=True)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    proc = subprocess.run(
        run_query_command(registry, "page_visits"),
        env={**os.environ, **env},
        capture_output=True,
        text=True,
    )
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        raise SystemExit(f"run_query.py failed with {env!r}:\n{proc.stderr[-3000:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu


class InSession:
    """The same run in one session that outlives it, as a test worker's session does."""

    def __init__(self, env: dict[str, str]) -> None:
        import psutil
        from pyspark.sql import SparkSession

        os.environ.update(env)  # the session's JVM starts with the tests' settings
        self.spark = (
            SparkSession.builder.master("local[2]")
            .config("spark.ui.enabled", "false")
            .config("spark.sql.shuffle.partitions", "2")
            .config("spark.ui.showConsoleProgress", "false")
            .getOrCreate()
        )
        self.tree = psutil.Process()

    def cpu(self) -> float:
        """CPU seconds of this process and every process under it, finished children included."""
        total = 0.0
        for proc in [self.tree, *self.tree.children(recursive=True)]:
            times = proc.cpu_times()
            total += times.user + times.system + times.children_user + times.children_system
        return total

    def run(self, root: Path, registry: Path) -> tuple[float, float]:
        for name in ("checkpoints", "output", "_stateops"):
            shutil.rmtree(root / name, ignore_errors=True)
        before, start = self.cpu(), time.perf_counter()
        run_in_session(self.spark, registry, "page_visits")
        return time.perf_counter() - start, self.cpu() - before


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5, help="runs of each, in turn")
    parser.add_argument(
        "--no-warm-up", dest="warm_up", action="store_false", help="no warm-up runs first"
    )
    args = parser.parse_args()
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_CONF_DIR", str(ROOT / "conf"))
    settings = {
        "JVM defaults (baseline)": {"SPARK_SUBMIT_OPTS": ""},
        "C1 + serial GC": jvm_env(None),
        "C1 + serial GC + class archive (the tests)": jvm_env(spark_class_archive()),
    }
    shared = "in the tests' shared session"
    root = Path(tempfile.mkdtemp(prefix="bench-test-jvm-"))
    results: dict[str, list[tuple[float, float]]] = {label: [] for label in [*settings, shared]}
    try:
        registry = write_registry(root)
        land(root / "landing", round_=0, files=2)
        if args.warm_up:  # the page cache
            one_run(root, registry, settings["JVM defaults (baseline)"])
        session = InSession(settings["C1 + serial GC + class archive (the tests)"])
        if args.warm_up:  # a worker's session has run queries before
            session.run(root, registry)
        for i in range(args.runs):
            for label, runs in results.items():
                if label == shared:
                    runs.append(session.run(root, registry))
                else:
                    runs.append(one_run(root, registry, settings[label]))
                print(
                    f"run {i + 1}/{args.runs} {label}: "
                    f"{runs[-1][0]:.1f} s wall, {runs[-1][1]:.1f} s CPU",
                    flush=True,
                )
    finally:
        shutil.rmtree(root, ignore_errors=True)
    base_wall = statistics.median(w for w, _ in results["JVM defaults (baseline)"])
    base_cpu = statistics.median(c for _, c in results["JVM defaults (baseline)"])
    print(f"\nrun_query.py's run of page_visits, test-sized input; median of {args.runs}")
    for label, runs in results.items():
        wall = statistics.median(w for w, _ in runs)
        cpu = statistics.median(c for _, c in runs)
        print(
            f"{label:<44}{wall:7.1f} s wall {wall / base_wall:5.2f}x"
            f"{cpu:9.1f} s CPU {cpu / base_cpu:5.2f}x"
        )


if __name__ == "__main__":
    main()
