"""The benchmarks that start Airflow, each once on a tiny input (tests/benchmark_smokes.py)."""

from __future__ import annotations

import pytest

from tests.benchmark_smokes import SMOKES, run_benchmark

pytestmark = [pytest.mark.dag, pytest.mark.whole]


@pytest.mark.parametrize("name", sorted(SMOKES["dag"]))
def test_the_benchmark_runs_whole_on_a_tiny_input(name):
    run_benchmark(name, SMOKES["dag"][name])
