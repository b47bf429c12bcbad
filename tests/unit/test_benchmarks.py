"""Every benchmark runs once, whole, on a tiny input (benchmarks/bench_cleanup.py stopped
importing and nothing noticed: nothing ran the benchmarks). Here: those that need no JVM and
no server, each in a second or a few; tests/spark/test_benchmarks.py runs the others. A
benchmark without a smoke in either module fails the collection of this one."""

from __future__ import annotations

import pytest

from tests.conftest import ROOT
from tests.spark.test_benchmarks import RATIO, SECONDS, Smoke, run_benchmark
from tests.spark.test_benchmarks import SMOKES as SPARK_SMOKES

pytestmark = pytest.mark.unit

SMOKES = {
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
    # Two fresh processes that import Airflow and parse a folder of DAG files each.
    "bench_dag_parse.py": Smoke(
        ("--runs", "1"),
        120,
        (
            r"^  empty DAG files \(baseline\) +\d+\.\d+ s +1\.0x$",
            r"^  dags/ +\d+\.\d+ s +\d+\.\dx$",
        ),
    ),
}


def _unsmoked() -> str:
    """What is wrong with the two modules' smokes, or ''."""
    benchmarks = {p.name for p in (ROOT / "benchmarks").glob("bench_*.py")}
    both = set(SMOKES) & set(SPARK_SMOKES)
    missing = benchmarks - set(SMOKES) - set(SPARK_SMOKES)
    gone = (set(SMOKES) | set(SPARK_SMOKES)) - benchmarks
    return "; ".join(
        f"{what}: {', '.join(sorted(names))}"
        for what, names in (
            ("benchmarks without a smoke (tests/unit or tests/spark test_benchmarks.py)", missing),
            ("smokes of benchmarks that are not there", gone),
            ("smokes in both modules", both),
        )
        if names
    )


# At collection: a new benchmark without a smoke fails the suite, whichever tier is selected.
if _unsmoked():
    raise pytest.UsageError(_unsmoked())


@pytest.mark.parametrize("name", sorted(SMOKES))
def test_the_benchmark_runs_whole_on_a_tiny_input(name):
    run_benchmark(name, SMOKES[name])
