"""The benchmarks that start Spark, Kafka or an S3 server, each once on a tiny input
(tests/benchmark_smokes.py). Together they are about 25 minutes of test time on 2 cores: they
are in the whole proof (`make test-all`), and the unit tier checks that each benchmark has its
smoke."""

from __future__ import annotations

import pytest

from tests.benchmark_smokes import SMOKES, run_benchmark

pytestmark = [pytest.mark.spark, pytest.mark.whole]


@pytest.mark.parametrize("name", sorted(SMOKES["spark"]))
def test_the_benchmark_runs_whole_on_a_tiny_input(name):
    run_benchmark(name, SMOKES["spark"][name])
