"""The Spark-on-S3 benchmark's own arithmetic: the medians and ratios it prints, and what it
says a cleanup saves (the runs themselves are the benchmark's, Spark against SeaweedFS)."""

from __future__ import annotations

import importlib.util
from collections import Counter

import pytest

from tests.conftest import ROOT

pytestmark = pytest.mark.unit

_spec = importlib.util.spec_from_file_location(
    "bench_spark_s3", ROOT / "benchmarks" / "bench_spark_s3.py"
)
bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)


def test_a_batch_is_the_median_of_each_storage_and_s3_a_ratio_of_local():
    local, s3 = bench.batch_figures([900.0, 100.0, 120.0], [300.0, 260.0, 5000.0, 280.0])
    assert local.split() == [
        "local",
        "disk",
        "120",
        "ms",
        "median",
        "of",
        "3",
        "batches",
        "(baseline)",
    ]
    assert s3.split()[2:] == ["290", "ms", "median", "of", "4", "batches", "2.42x", "local"]
    assert bench.batch_figures([], [10.0])[1].endswith("n/a")  # no baseline, no ratio


def test_what_a_cleanup_saves_is_against_the_checkpoint_never_cleaned():
    requests = {
        "kept": {"inspect": Counter(LIST=40, GET=60), "verify": Counter(LIST=40, GET=300)},
        "cleaned": {"inspect": Counter(LIST=10, GET=15), "verify": Counter(LIST=10, GET=75)},
    }
    objects, inspect, verify = bench.saving_figures({"kept": 400, "cleaned": 100}, requests)
    assert " ".join(objects.split()) == "objects left 400 never cleaned 100 cleaned 300 fewer (75%)"
    assert "100 never cleaned" in inspect and "25 cleaned" in inspect and "(75%)" in inspect
    assert inspect.endswith("(GET 60->15, LIST 40->10)")
    assert "340 never cleaned" in verify and "85 cleaned" in verify
    # Nothing to save: no ratio of nothing.
    none = bench.saving_figures({"kept": 0, "cleaned": 0}, {"kept": {}, "cleaned": {}})
    assert none[0].rstrip().endswith("0 cleaned")


def test_requests_are_named_by_their_kind():
    assert [bench._short(op) for op in ("ListObjectsV2", "GetObject", "HeadObject", "X")] == [
        "LIST",
        "GET",
        "HEAD",
        "X",
    ]
