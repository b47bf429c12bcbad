"""The benchmarks that need no JVM, no server and no Airflow, each once on a tiny input
(tests/benchmark_smokes.py); a benchmark without a smoke in any tier fails this module's
collection, whichever tier is selected."""

from __future__ import annotations

import pytest

from tests.benchmark_smokes import SMOKES, run_benchmark, unsmoked

if unsmoked():
    raise pytest.UsageError(unsmoked())

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("name", sorted(SMOKES["unit"]))
def test_the_benchmark_runs_whole_on_a_tiny_input(name):
    run_benchmark(name, SMOKES["unit"][name])
