from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

pytestmark = pytest.mark.unit

# Reaches point "delete" five times and "audit" once, then says it finished.
RUN = """
from stateops.core import faults
for _ in range(5):
    faults.point("delete")
faults.point("audit")
print("finished", flush=True)
"""


def _run(tmp_path, **env: str) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("STATEOPS_FAULT")}
    clean.pop("STATEOPS_KILL_AT", None)
    clean.pop("STATEOPS_PAUSE_AT", None)
    return subprocess.run(
        [sys.executable, "-c", RUN],
        capture_output=True,
        text=True,
        env={**clean, **env},
        cwd=tmp_path,
        timeout=60,
    )


def test_without_the_environment_points_do_nothing(tmp_path):
    proc = _run(tmp_path)
    assert proc.returncode == 0 and proc.stdout == "finished\n"
    assert list(tmp_path.iterdir()) == []


def test_the_kth_time_a_point_is_reached_kills_the_process_and_the_trace_says_how_far(tmp_path):
    trace = tmp_path / "trace"
    proc = _run(tmp_path, STATEOPS_KILL_AT="delete:3", STATEOPS_FAULT_TRACE=str(trace))
    assert proc.returncode == -signal.SIGKILL and proc.stdout == ""
    lines = [line.split()[:2] for line in trace.read_text().splitlines()]
    assert lines == [["delete", "1"], ["delete", "2"], ["delete", "3"]]


def test_a_point_never_reached_k_times_lets_the_run_finish_and_traces_every_point(tmp_path):
    trace = tmp_path / "trace"
    proc = _run(tmp_path, STATEOPS_KILL_AT="delete:6", STATEOPS_FAULT_TRACE=str(trace))
    assert proc.returncode == 0 and proc.stdout == "finished\n"
    names = [line.split()[0] for line in trace.read_text().splitlines()]
    assert names == ["delete"] * 5 + ["audit"]


@pytest.mark.parametrize("spec", ["delete", "delete:0", ":3", "delete:x"])
def test_a_malformed_kill_point_is_refused_naming_the_form(tmp_path, spec):
    proc = _run(tmp_path, STATEOPS_KILL_AT=spec)
    assert proc.returncode == 1 and "expected NAME:K with K >= 1" in proc.stderr, proc.stderr


def test_a_pause_point_stops_the_whole_process_for_its_seconds_then_it_goes_on(tmp_path):
    """SIGSTOP, not a sleep: every thread stands still (a lease's renewer too), as in a
    paused VM; the trace shows the gap between the pause point and the next."""
    trace = tmp_path / "trace"
    began = time.monotonic()
    proc = _run(tmp_path, STATEOPS_PAUSE_AT="delete:2:1.5", STATEOPS_FAULT_TRACE=str(trace))
    assert proc.returncode == 0 and proc.stdout == "finished\n", proc.stderr
    assert time.monotonic() - began >= 1.5
    times = {
        tuple(line.split()[:2]): float(line.split()[2]) for line in trace.read_text().splitlines()
    }
    assert times[("delete", "3")] - times[("delete", "2")] >= 1.4


@pytest.mark.parametrize("spec", ["delete:1", "delete:0:5", "delete:1:x", "delete:1:0"])
def test_a_malformed_pause_point_is_refused_naming_the_form(tmp_path, spec):
    proc = _run(tmp_path, STATEOPS_PAUSE_AT=spec)
    assert proc.returncode == 1 and "expected NAME:K:SECONDS" in proc.stderr, proc.stderr
