"""The benchmarks that start Spark, Kafka or an S3 server, each once on a tiny input
(tests/benchmark_smokes.py). Together they are about 25 minutes of test time on 2 cores under
the suite's load, which took CI past its limit: `make test-benchmarks` runs them (the unit
tier still checks that each benchmark has its smoke)."""

from __future__ import annotations

import os

import pytest

from tests.benchmark_smokes import SMOKES, run_benchmark

pytestmark = [
    pytest.mark.spark,
    pytest.mark.skipif(
        os.environ.get("STATEOPS_BENCHMARK_RUNS") != "1",
        reason="a benchmark's whole run with Spark: `make test-benchmarks` runs it (in make "
        "test they take CI past its limit)",
    ),
]


@pytest.mark.parametrize("name", sorted(SMOKES["spark"]))
def test_the_benchmark_runs_whole_on_a_tiny_input(name):
    run_benchmark(name, SMOKES["spark"][name])
