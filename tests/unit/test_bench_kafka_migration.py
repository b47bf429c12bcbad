"""The Kafka migration benchmark's own arithmetic: which commit ends a downtime, and the ratio
and verdict it prints (the runs themselves are the benchmark's, against a real broker)."""

from __future__ import annotations

import importlib.util
import os

import pytest

from tests.conftest import ROOT

pytestmark = pytest.mark.unit

_spec = importlib.util.spec_from_file_location(
    "bench_kafka_migration", ROOT / "benchmarks" / "bench_kafka_migration.py"
)
bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)


def _commit(checkpoint, batch: int, at: float) -> None:
    path = checkpoint / "commits" / str(batch)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("v1\n{}")
    os.utime(path, (at, at))


def test_the_downtime_ends_at_the_first_commit_after_the_batch_the_stop_left(tmp_path):
    ck = tmp_path / "ck"
    assert bench.committed_after(ck, 3) is None  # nothing written yet
    assert bench.last_commit(ck) == -1
    _commit(ck, 2, 100.0)
    _commit(ck, 3, 110.0)
    (ck / "commits" / ".3.crc").write_text("")  # Spark's sidecars are not batches
    assert bench.committed_after(ck, 3) is None
    _commit(ck, 5, 130.0)
    _commit(ck, 4, 120.0)  # batch order, not listing order
    assert bench.committed_after(ck, 3) == (4, 120.0)
    assert bench.last_commit(ck) == 5


def test_figures_give_the_ratio_against_the_restart_and_say_whether_it_meets_the_goal():
    within = bench.figures(4.0, 7.0)
    assert within[0].endswith("4.00 s  (baseline)")
    assert within[1].endswith("7.00 s   1.75x the restart (within the goal of 2x)")
    assert bench.figures(4.0, 9.0)[1].endswith("2.25x the restart (OVER the goal of 2x)")
