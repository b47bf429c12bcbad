"""The suite report's own arithmetic (benchmarks/suite_report.py): which test each JVM and
Python start belongs to, and the figures per tier, module and shared fixture."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from datetime import datetime
from types import SimpleNamespace

import pytest

from tests.conftest import ROOT

pytestmark = pytest.mark.unit

_spec = importlib.util.spec_from_file_location(
    "suite_report", ROOT / "benchmarks" / "suite_report.py"
)
report = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(report)

A, B = "tests/spark/test_a.py::test_one", "tests/unit/test_b.py::test_two"


def _record(folder) -> None:
    events = [
        {"kind": "test", "worker": "gw0", "test": A, "start": 100.0, "end": 130.0, "cpu": 40.0},
        {"kind": "test", "worker": "gw1", "test": B, "start": 100.0, "end": 101.0, "cpu": 0.5},
        {"kind": "phase", "worker": "gw0", "test": A, "when": "setup", "seconds": 20.0},
        {"kind": "phase", "worker": "gw0", "test": A, "when": "call", "seconds": 10.0},
        {"kind": "phase", "worker": "gw1", "test": B, "when": "call", "seconds": 1.0},
        {
            "kind": "fixture",
            "worker": "gw0",
            "name": "written",
            "scope": "module",
            "where": "tests/spark/test_a.py",
            "test": A,
            "seconds": 19.0,
        },
        {"kind": "session", "worker": "main", "start": 90.0, "end": 140.0, "workers": 2},
    ]
    (folder / "events-gw0.jsonl").write_text("\n".join(json.dumps(e) for e in events) + "\n")
    spark_submit = "-Xmx1g org.apache.spark.deploy.SparkSubmit --master local[2] job.py"
    (folder / "spawns.log").write_text(
        "".join(
            f"{t}\t{w}\t{program}\t{args}\n"
            for t, w, program, args in [
                (101.0, "gw0", "java", "org.apache.spark.launcher.Main x"),
                (102.0, "gw0", "java", spark_submit),
                (103.0, "gw0", "python", "/x/stateops/jobs/run_query.py --query q"),
                (104.0, "gw0", "python", "-m pyspark.daemon"),
                (105.0, "gw0", "python", "-m pyspark.sql.streaming.transform_with_state_x"),
                (100.5, "gw1", "java", "-Xmx512m kafka.Kafka server.properties"),
                (135.0, "gw0", "java", "org.apache.spark.launcher.Main y"),  # after A ended
            ]
        )
    )


def test_each_start_goes_to_the_test_running_on_its_worker_then(tmp_path):
    _record(tmp_path)
    summary = report.summarise(*report.load(tmp_path))
    a, b = summary["tests"][A], summary["tests"][B]
    assert (a["seconds"], a["cpu"], a["jvms"], a["jobs"], a["py_workers"]) == (30.0, 40.0, 2, 1, 2)
    assert (b["jvms"], b["jobs"], b["py_workers"]) == (1, 0, 0)
    assert summary["outside_tests"]["jvms"] == 1
    assert summary["wall"] == 50.0 and summary["workers"] == 2
    assert summary["worlds"]["written (tests/spark/test_a.py)"]["builds"] == 1
    assert summary["starts"]["kafka broker"] == 1


def test_a_damaged_spawn_line_and_a_bare_python_are_no_crash(tmp_path):
    _record(tmp_path)
    with (tmp_path / "spawns.log").open("a") as log:
        log.write("101.5\tgw0\tpy")  # two appends interleaved: a line cut short
        log.write("\n101.6\tgw0\tpython\t\n")
    summary = report.summarise(*report.load(tmp_path))
    assert summary["starts"]["python"] == 1 and summary["tests"][A]["py_workers"] == 3


def test_the_report_holds_a_run_against_an_earlier_one(tmp_path):
    _record(tmp_path)
    summary = report.summarise(*report.load(tmp_path))
    earlier = json.loads(json.dumps(summary))
    earlier["wall"] = 100.0
    earlier["tests"][A]["seconds"] = 60.0
    earlier["tests"][A]["cpu"] = 20.0
    lines = report.report(summary, earlier)
    assert lines[0].startswith("suite wall 0m50.0s on 2 worker(s), 2 tests  x0.50")
    spark = next(line for line in lines if line.startswith("spark "))
    assert spark.split()[1] == "1" and spark.endswith("x0.50  x2.00"), spark
    # A run that did not finish has no wall time, and says so.
    assert report.report({**summary, "wall": None}, None)[0].startswith("suite wall unknown")


def test_a_tier_over_its_budget_names_the_module_that_costs_most():
    from tests.conftest import GATE_BUDGET, _TimeGuard

    guard = _TimeGuard()
    budget = GATE_BUDGET.tiers["unit"]
    for nodeid, seconds in [("tests/unit/a.py::t1", 10.0), ("tests/unit/b.py::t2", budget)]:
        guard.add(SimpleNamespace(nodeid=nodeid, duration=seconds, keywords={"unit": 1}))
    [line] = [text for text, over in guard.lines(2) if over and "unit" in text]
    assert line.endswith(
        "OVER BUDGET, make its proofs cheaper; most: tests/unit/b.py 1m00.0s (86%)"
    )
    guard = _TimeGuard()
    guard.add(SimpleNamespace(nodeid="tests/unit/a.py::t", duration=1.0, keywords={"unit": 1}))
    assert not any(over for _, over in guard.lines(2)[1:])


@pytest.mark.parametrize("template", ["_JAVA_STANDIN", "_PYTHON_STANDIN"])
def test_a_standin_records_the_start_and_runs_the_real_program_with_its_arguments(
    tmp_path, template
):
    import subprocess

    from tests import suite_record

    got = tmp_path / "got"
    real = tmp_path / "real program"  # a space in its path
    real.write_text(f'#!/bin/sh\nprintf "%s\\n" "$@" > "{got}"\nexit 7\n')
    real.chmod(0o755)
    spawns = tmp_path / "spawns 'log'"
    program = "java" if template == "_JAVA_STANDIN" else "python"
    standin = suite_record.standin(
        tmp_path / "bin" / program, getattr(suite_record, template), spawns, str(real)
    )
    args = ["-cp", "/jars/*", "a b", "it's", "$HOME", "tab\there", "Main"]
    proc = subprocess.run(
        [standin, *args], env={"PATH": "/usr/bin:/bin", "PYTEST_XDIST_WORKER": "gw1"}
    )
    assert proc.returncode == 7  # the real program's
    assert got.read_text().split("\n")[:-1] == args  # passed on as they were
    when, worker, kind, logged = spawns.read_text().rstrip("\n").split("\t")
    assert float(when) > 0 and (worker, kind) == ("gw1", program)
    shown = "a b it's $HOME tab here Main"
    assert logged == (shown if program == "java" else f"-cp /jars/* {shown}")  # java: no class path


def test_the_deployments_are_said_apart_in_the_time_guard():
    from tests.conftest import _TimeGuard

    guard = _TimeGuard()
    for nodeid, seconds in [("tests/e2e/a.py::t@deployments", 90.0), ("tests/e2e/b.py::t", 30.0)]:
        guard.add(SimpleNamespace(nodeid=nodeid, duration=seconds, keywords={"e2e": 1}))
    lines = [text for text, _ in guard.lines(3)]
    assert "  the deployments, in a row on a worker of their own: 1m30.0s" in lines, lines


class _Worker:
    """What xdist's scheduler asks of a worker: the tests it is sent, its shutdown."""

    def __init__(self, name: str) -> None:
        self.name, self.sent, self.shutting_down = name, [], False
        self.gateway = SimpleNamespace(id=name)

    def send_runtest_some(self, indexes: list[int]) -> None:
        self.sent += indexes

    def shutdown(self) -> None:
        self.shutting_down = True


@pytest.mark.parametrize("with_deployments", [True, False])
def test_the_deployments_run_on_a_worker_of_their_own_which_takes_nothing_else(
    with_deployments,
):
    from tests.conftest import pytest_xdist_make_scheduler

    options = {"dist": "loadgroup", "whole_proof": True}  # make test-all
    config = SimpleNamespace(
        getoption=lambda name, default=None: options.get(name, default),
        getvalue=lambda name: ["popen"] * 3,
        option=SimpleNamespace(loadscopereorder=False, markexpr=""),
    )
    deployments = [f"tests/e2e/d.py::t{i}@deployments" for i in range(3)] * with_deployments
    # collected after the others, as a test file of theirs sorted later would be: the worker
    # apart must still take them first (the scheduler moves them to the queue's front)
    others = [f"tests/spark/s.py::t{i}" for i in range(8)]
    collection = [*others, *deployments]
    sched = pytest_xdist_make_scheduler(config, None)
    workers = [_Worker(f"gw{i}") for i in range(3)]
    for worker in workers:
        sched.add_node(worker)
        sched.add_node_collection(worker, collection)
    sched.schedule()
    apart = workers[0]
    if not with_deployments:  # nothing for it: it stops at once
        assert apart.sent == [] and apart.shutting_down

    def pending(worker: _Worker) -> list[int]:
        work = sched.assigned_work.get(worker, {}).values()
        return [collection.index(n) for unit in work for n, done in unit.items() if not done]

    while any(pending(w) for w in workers):  # each worker runs what it was sent, in turns
        for worker in workers:
            if indexes := pending(worker):
                sched.mark_test_complete(worker, indexes[0])
    ran = {w.name: sorted(collection[i] for i in w.sent) for w in workers}
    assert ran["gw0"] == sorted(deployments), ran
    options["whole_proof"] = False  # make test: no deployments, xdist's own loadgroup
    assert pytest_xdist_make_scheduler(config, None) is None
    assert sorted(ran["gw1"] + ran["gw2"]) == sorted(others), ran
    assert ran["gw1"] and ran["gw2"] and all(w.shutting_down for w in workers)


def test_each_command_says_its_own_budget():
    from tests.conftest import WHOLE_BUDGET, _TimeGuard

    gate, whole = _TimeGuard(), _TimeGuard(WHOLE_BUDGET)
    gate.started = whole.started = gate.started - 16 * 60  # 16 minutes ago
    assert gate.lines(2)[0] == (
        "gate (make test) wall time 16m00.0s on 2 worker(s); budget 15m00.0s: OVER BUDGET",
        True,
    )
    assert whole.lines(3)[0] == (
        "whole proof (make test-all) wall time 16m00.0s on 3 worker(s); budget 60m00.0s",
        False,
    )


def test_the_whole_proof_record_has_the_commit_the_counts_and_the_time():
    from tests.conftest import proof_outcome

    report = SimpleNamespace(when="call")
    stats = {"passed": [report] * 5, "failed": [report], "skipped": [report] * 2, "": [report]}
    outcome = proof_outcome(stats, 123.456, 1, ["--whole-proof"])
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    assert outcome["commit"] == head.stdout.strip() and len(outcome["commit"]) == 40
    counts = {k: outcome[k] for k in ("passed", "failed", "errors", "skipped", "deselected")}
    assert counts == {"passed": 5, "failed": 1, "errors": 0, "skipped": 2, "deselected": 0}
    assert (outcome["wall_seconds"], outcome["exit_status"]) == (123.5, 1)
    assert datetime.fromisoformat(outcome["finished"]).tzinfo is not None
    assert outcome["pytest_args"] == ["--whole-proof"]


@pytest.mark.parametrize("whole", [False, True])
def test_the_gate_leaves_out_the_tests_marked_whole_and_the_whole_proof_runs_them(whole):
    """The fleet's stories (marked whole) collected as make test and make test-all would."""
    fleet = "tests/e2e/test_fleet.py"
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:xdist", fleet]
        + ["--whole-proof"] * whole,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    collected = [line for line in proc.stdout.splitlines() if line.startswith(f"{fleet}::")]
    if whole:
        assert len(collected) == 9 and "deselected" not in proc.stdout, proc.stdout
    else:
        assert not collected and "9 deselected" in proc.stdout, proc.stdout
