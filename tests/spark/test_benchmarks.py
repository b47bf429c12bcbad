"""The benchmarks that start Spark, Kafka or an S3 server, each once on a tiny input
(tests/benchmark_smokes.py)."""

from __future__ import annotations

import pytest

from tests.benchmark_smokes import SMOKES, run_benchmark

pytestmark = pytest.mark.spark


@pytest.mark.parametrize("name", sorted(SMOKES["spark"]))
def test_the_benchmark_runs_whole_on_a_tiny_input(name):
    run_benchmark(name, SMOKES["spark"][name])
