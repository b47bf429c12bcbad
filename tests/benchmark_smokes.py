"""Each benchmark's smoke: one whole run on a tiny input, as a user runs the script
(``sys.executable benchmarks/<file>``, the test process's environment: the tests' JVM options
and class archive), with the fewest Spark jobs its comparison needs, and the lines its output
must hold (its figures against its baseline). A benchmark that no longer runs (an import
moved, a log line it reads reworded) fails in the suite, not on the day someone measures.
The tier's test module runs its smokes (tests/<tier>/test_benchmarks.py); a benchmark without
a smoke here fails the collection of tests/unit/test_benchmarks.py."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from dataclasses import dataclass

import pytest

from tests.conftest import ROOT

RATIO = r"\d+\.\d+x"  # a ratio as the benchmarks print it: 1.25x
SECONDS = r"\d+\.\d+ s"


@dataclass(frozen=True)
class Smoke:
    """A benchmark's tiny run: its arguments, a time limit (seconds, on a loaded 2-core
    machine), and what its output must hold (regular expressions, each matching a line)."""

    args: tuple[str, ...]
    timeout: int
    expect: tuple[str, ...]


def run_benchmark(name: str, smoke: Smoke) -> str:
    """``benchmarks/<name>`` run once with the smoke's arguments; its output, once it exited 0
    and printed every expected line. Its own process group, killed whole at the time limit
    (its Spark jobs and servers with it)."""
    command = [sys.executable, str(ROOT / "benchmarks" / name), *smoke.args]
    proc = subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        process_group=0,
    )
    try:
        out, err = proc.communicate(timeout=smoke.timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate(timeout=60)
        pytest.fail(f"{name} ran over {smoke.timeout} s:\n{(out + err)[-3000:]}")
    assert proc.returncode == 0, f"{name} exited {proc.returncode}:\n{(out + err)[-3000:]}"
    missing = [e for e in smoke.expect if not re.search(e, out, re.MULTILINE)]
    assert not missing, f"{name} printed no line like {missing}:\n{out[-3000:]}"
    return out


SMOKES: dict[str, dict[str, Smoke]] = {
    "unit": {
        # Its set-up runs the file queries with Spark and migrates an Airflow database (minutes);
        # what it times, the health DAG on real state, tests/dag/test_health_alerts.py runs in
        # every suite, the JVM stand-in too; here, that it still imports what it uses.
        "bench_health.py": Smoke(
            ("--help",), 60, (r"^usage: bench_health\.py \[-h\] \[--runs RUNS\]$",)
        ),
        # Its whole run is make airflow and make fleet, one after the other, each through the
        # stories (20 minutes and more): what it drives is tests/e2e/test_fleet.py's Fleet,
        # which that module runs in every suite; here, that it still imports what it uses.
        "bench_fleet.py": Smoke(
            ("--help",),
            60,
            (r"^usage: bench_fleet\.py \[-h\] \[--only \{single,fleet\}\]$",),
        ),
        "bench_checkpoint_model.py": Smoke(
            ("--files", "2000"),
            60,
            (
                r"^files: \d+, restart set after batch \d+: \d+ files$",
                rf"^find -type f +{SECONDS} +\(baseline\)$",
                rf"^load_checkpoint +{SECONDS} +{RATIO} find$",
                rf"^load \+ restart \+ report +{SECONDS} +{RATIO} find, +{RATIO} find with sizes$",
            ),
        ),
        # --retain 1: the plan deletes something.
        "bench_cleanup.py": Smoke(
            ("--files", "2000", "--retain", "1"),
            60,
            (
                r"^files: \d+; the plan deletes [1-9]\d*, keeps \d+",
                rf"^find -printf '%s %p' +{SECONDS} +\(baseline\)$",
                rf"^  listing \(in the plan\) +{SECONDS} +{RATIO} find$",
                rf"^plan_cleanup +{SECONDS} +{RATIO} find \(goal <= 2\)$",
            ),
        ),
    },
    "dag": {
        # Two fresh processes that import Airflow and parse a folder of DAG files each.
        "bench_dag_parse.py": Smoke(
            ("--runs", "1"),
            120,
            (
                r"^  empty DAG files \(baseline\) +\d+\.\d+ s +1\.0x$",
                r"^  dags/ +\d+\.\d+ s +\d+\.\dx$",
            ),
        ),
    },
    "spark": {
        # The embedded S3 endpoint (rclone serve s3), no JVM.
        "bench_backup.py": Smoke(
            ("--gb", "0.001", "--partitions", "2"),
            120,
            (
                rf"^rclone copy \(baseline\) +{SECONDS}",
                rf"^stateops backup \(full\) +{SECONDS} .* {RATIO} rclone",
                r"^stateops backup \(\+1 batch\) .* \d+ objects, .* reused$",
            ),
        ),
        # SeaweedFS, no JVM.
        "bench_lease.py": Smoke(
            ("--cycles", "3", "--files", "300"),
            120,
            (
                r"^lease, local lock file +\d+\.\d+ ms +1\.0x$",
                rf"^lease, S3 control store +\d+\.\d+ ms +{RATIO} +\d+ requests$",
                r"^records \(\d+ queries\), local +\d+\.\d+ ms +1\.0x$",
                rf"^records \(\d+ queries\), S3 +\d+\.\d+ ms +{RATIO} +\d+ requests$",
                r"^guard, S3, own deadline +\d+\.\d+ us$",
                r"^guard, S3, store asked +\d+\.\d+ us$",
                rf"^deletes, local, guarded +\d+\.\d+ ms +{RATIO}$",
                rf"^deletes, S3, guarded +\d+\.\d+ ms +{RATIO}$",
            ),
        ),
        "bench_s3_cleanup.py": Smoke(
            ("--files", "2000", "--retain", "1", "--runs", "1"),
            120,
            (
                r"^objects: \d+ \(rclone listed \d+\); the plan deletes [1-9]",
                r"^  rclone lsf -R +\d+\.\d+ s +\d+ requests \(baseline\)$",
                rf"^  rclone lsf -R --fast-list .* {RATIO}$",
                rf"^  plan_cleanup on s3:// .* {RATIO} rclone lsf -R \(goal <= 1.5\), +{RATIO}",
            ),
        ),
        # spark-submit jobs: 3 (replay, export, bootstrap).
        "bench_bootstrap.py": Smoke(
            ("--keys", "20", "--events-per-key", "2", "--partitions", "2"),
            600,
            (
                rf"^replay all events +{SECONDS} .*\(baseline\)$",
                r"^export state .* \d+\.\dx faster$",
                r"^bootstrap from export .* \d+\.\dx faster$",
                r"carry-over proof: .* proven: True$",
            ),
        ),
        # 5 jobs and the CLI's transplant; a new partition count, so that the transplant road
        # goes through Spark's repartition too (the script's every branch). Two or three state
        # partitions where the benchmark's default is 8: a partition is a state store to load
        # and commit in every job, a quarter of the smokes' CPU at 8.
        "bench_migration.py": Smoke(
            ("--keys", "20", "--events-per-key", "2", "--new-share", "2")
            + ("--partitions", "3", "--new-partitions", "2"),
            900,
            (
                rf"^replay of every event +{SECONDS} +\(baseline\)$",
                rf"^initialState carry-over \(export \+ bootstrap\) +{SECONDS} +{RATIO} replay's",
                rf"^transplant carry-over \(stateops transplant\) +{SECONDS} +{RATIO} replay's",
                rf"^transplant \+ repartition \+ first batch and its proof +{SECONDS} +{RATIO}",
                r"^  initialState proof: .* proven: True$",
                r"^  transplant proof: .* proven: True$",
                r"^  Spark's repartition 3 -> 2 \(batch \d+\)",
            ),
        ),
        # 2 jobs and stateops repartition.
        "bench_repartition.py": Smoke(
            ("--keys", "20", "--events-per-key", "2", "--from", "2", "--to", "3"),
            600,
            (
                rf"^replay of every event into 3 partitions +{SECONDS} +\(baseline\)$",
                rf"^stateops repartition 2 -> 3 \(with its proof\) +{SECONDS} +{RATIO} replay's",
            ),
        ),
        # 2 jobs, stateops upgrade (3 jobs), the 2 exports that compare the states; its parts are
        # read from the upgrade's log, so each part's line must be found there.
        "bench_upgrade.py": Smoke(
            ("--keys", "20", "--events-per-key", "2", "--partitions", "2"),
            1200,
            (
                rf"^replay of every event with the new code +{SECONDS} +\(baseline\)$",
                rf"^stateops upgrade \(the state rewrite\) +{SECONDS} +{RATIO} replay's speed$",
                rf"^  plan, stop, backup +{SECONDS}$",
                rf"^  export \(export_state.py\) +{SECONDS}$",
                rf"^  rewrite: mapping \+ batch 0 \(bootstrap_state.py\) +{SECONDS}$",
                rf"^  prove +{SECONDS}$",
                rf"^  validate \(validate_state.py\), switch +{SECONDS}$",
                r"^rewrite / replay: \d+\.\d\d$",
                r"^keys in the state: upgraded \{'count': 20\}, .*: the same$",
            ),
        ),
        # 3 spark-submits (one per JVM setting) and the in-session run; no warm-ups.
        "bench_test_jvm.py": Smoke(
            ("--runs", "1", "--no-warm-up"),
            900,
            tuple(
                rf"^{re.escape(label)} +{SECONDS} wall +{RATIO} +{SECONDS} CPU +{RATIO}$"
                for label in (
                    "JVM defaults (baseline)",
                    "C1 + serial GC",
                    "C1 + serial GC + class archive (the tests)",
                    "in the tests' shared session",
                )
            ),
        ),
        # In this script's own session with SeaweedFS: a warm-up, a run on each storage, and two
        # runs of two batches with a cleanup that deletes something.
        "bench_spark_s3.py": Smoke(
            ("--batches", "1", "--turns", "1", "--chunks", "1", "--chunk", "2", "--retain", "1"),
            600,
            (
                r"^  local disk +\d+ ms +median of 1 batches +\(baseline\)$",
                rf"^  S3 \(s3a://\) +\d+ ms +median of 1 batches +{RATIO} local$",
                r"^  objects left +\d+ never cleaned +\d+ cleaned +\d+ fewer",
                r"^  inspect requests +\d+ never cleaned +\d+ cleaned .*\(GET \d+->\d+",
                r"^  verify requests +\d+ never cleaned +\d+ cleaned .*\(GET \d+->\d+",
            ),
        ),
        # The embedded broker and S3 endpoint; two continuous runs and the migration's.
        "bench_kafka_migration.py": Smoke(
            ("--events", "50", "--new-events", "10", "--partitions", "1"),
            900,
            (
                rf"^plain stop and restart \(stopped -> next commit\) +{SECONDS} +\(baseline\)$",
                rf"^migration \(stopped -> new checkpoint first commit\) +{SECONDS} +{RATIO} the "
                r"restart \((within|OVER) the goal of 2x\)$",
            ),
        ),
    },
}


def unsmoked() -> str:
    """What is wrong with the smokes, or '': a benchmark without one, a smoke of a benchmark
    that is not there, a benchmark smoked in two tiers."""
    benchmarks = {p.name for p in (ROOT / "benchmarks").glob("bench_*.py")}
    smoked = [name for smokes in SMOKES.values() for name in smokes]
    twice = {name for name in smoked if smoked.count(name) > 1}
    return "; ".join(
        f"{what}: {', '.join(sorted(names))}"
        for what, names in (
            ("benchmarks without a smoke (tests/benchmark_smokes.py)", benchmarks - set(smoked)),
            ("smokes of benchmarks that are not there", set(smoked) - benchmarks),
            ("benchmarks smoked in two tiers", twice),
        )
        if names
    )
