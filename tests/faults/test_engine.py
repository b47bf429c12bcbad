"""The trial engine's own verdicts (issue 40): a trial aimed at a point proves something only if
its run died there, and an operation none of whose runs was killed proved nothing. The runs are
scripted here (what a run did is data: its exit code and the points its trace reached); the
real runs are tests/faults/test_faults.py's."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from tests.faults import engine
from tests.faults.engine import Operation, Settings, format_report, run_operation

pytestmark = pytest.mark.unit

# A clean run passes these points, in this order.
POINTS = [("delete", 1), ("delete", 2), ("delete", 3), ("audit", 1)]


class Quiet(Operation):
    """Sound whatever happens: only the engine's own verdicts can fail it."""

    name = "scripted"
    ranked = ("delete",)

    def prepare(self, trial: str) -> None:
        return None

    def command(self, ctx: None) -> tuple[list[str], dict[str, str]]:
        return ["cleanup", "somewhere"], {}

    def capture(self, ctx: None) -> None:
        return None

    def judge(self, ctx: None, expected: None) -> list[str]:
        return []


def scripted(kills: str):
    """A stand-in for the engine's ``_run``: a run passes POINTS and exits 0, unless it is
    killed: ``kills`` says how a point kill goes ("there": at the aim; "elsewhere": at the
    point before it; "never": the point does not kill, the run finishes; "fails": the run
    exits 1 before any point). A random delay always outlasts the run (finished first)."""

    def run(argv, env, trace: Path, *, kill_at=None, delay=None, from_first=False):
        points = [(name, k, 0.1 * i) for i, (name, k) in enumerate(POINTS, 1)]
        if kill_at is None or kills == "never":
            return engine._Run(0, "", points, 0.0, 1.0)
        if kills == "fails":
            return engine._Run(1, "error: it failed first\n", [], 0.0, 1.0)
        name, _, k = kill_at.partition(":")
        upto = points.index(next(p for p in points if p[:2] == (name, int(k))))
        upto -= kills == "elsewhere"
        return engine._Run(-signal.SIGKILL, "", points[: upto + 1], 0.0, 1.0)

    return run


def _report(monkeypatch, tmp_path, kills: str) -> engine.OperationReport:
    monkeypatch.setattr(engine, "_run", scripted(kills))
    monkeypatch.setattr(engine, "REPORTS", [])  # kept out of the session's fault report
    settings = Settings(trials=5, restarts=0, seed=7)  # 3 aimed, 2 at random moments
    return run_operation(Quiet(), tmp_path, settings, log=lambda _: None)


def test_aimed_trials_killed_at_their_points_pass_and_random_ones_that_finished_are_counted(
    monkeypatch, tmp_path
):
    report = _report(monkeypatch, tmp_path, "there")
    assert report.failures() == []
    assert [t.mode for t in report.trials].count("point") == 3
    assert report.killed == 3 and report.finished_first == 2
    assert all(t.hit == t.aim for t in report.trials if t.mode == "point")
    text = format_report([report])
    assert "at random moments (2, 2 finished before the kill): finished first x2" in text, text


@pytest.mark.parametrize(
    ("kills", "died_at"),
    [("never", "not reached"), ("fails", "not reached"), ("elsewhere", None)],
)
def test_an_aimed_trial_whose_run_did_not_die_at_its_point_fails(
    monkeypatch, tmp_path, kills, died_at
):
    report = _report(monkeypatch, tmp_path, kills)
    failures = report.failures()
    aimed = [t for t in report.trials if t.mode == "point"]
    for trial in aimed:
        assert trial.hit != trial.aim and (died_at is None or trial.hit == died_at)
        assert any(
            f.startswith(f"{trial.name} ")
            and f"aimed at {trial.aim}, but the run died at {trial.hit}" in f
            for f in failures
        ), failures
    if kills == "elsewhere":  # killed, at the wrong point
        assert report.killed == len(aimed)
    else:
        assert report.killed == 0
        assert "none of the 5 trials was killed: nothing was proven" in failures
