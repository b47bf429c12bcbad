"""The fault-injection trial engine: run an operation the way a user does (the ``stateops`` CLI,
a process of its own), SIGKILL it, run it again the same way, and judge what the two left.

A trial kills the run either at a chosen point (``STATEOPS_KILL_AT=NAME:K``, see
:mod:`stateops.core.faults`: the K-th deletion, upload, download, the restore's stage and swap,
...) or after a random delay. The points come from a control run of the same command, which is also
what each resumed run must equal. An aimed trial whose run did not die at its point fails (it
proved nothing); a random delay that outlasted the run is counted and reported ("finished
first"); an operation none of whose trials was killed fails. Randomness is seeded per
operation from one seed per session (``STATEOPS_FAULT_SEED``, printed), so a failing trial can
be replayed. Spark is not used here: the operation says how to judge a result, and how to
restart it in Spark.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.conftest import VENV_BIN

__all__ = [
    "Operation",
    "OperationReport",
    "REPORTS",
    "SETTINGS",
    "Settings",
    "format_report",
    "run_operation",
]

_FAULT_ENV = ("STATEOPS_KILL_AT", "STATEOPS_FAULT_TRACE")


@dataclass(frozen=True)
class Settings:
    trials: int  # per operation
    restarts: int  # trials per operation whose result Spark restarts
    seed: int

    @classmethod
    def from_env(cls) -> Settings:
        seed = os.environ["STATEOPS_FAULT_SEED"]  # made once per session: tests/conftest.py
        return cls(
            trials=int(os.environ.get("STATEOPS_FAULT_TRIALS", "3")),
            restarts=int(os.environ.get("STATEOPS_FAULT_RESTARTS", "1")),
            seed=int(seed),
        )

    def replay(self) -> str:
        return (
            f"STATEOPS_FAULT_SEED={self.seed} STATEOPS_FAULT_TRIALS={self.trials} "
            f"STATEOPS_FAULT_RESTARTS={self.restarts} make faults"
        )


SETTINGS = Settings.from_env()


class Operation:
    """One lifecycle operation under trial. ``trial`` is a name (``control``, ``t07``)."""

    name: str
    # Points to aim at first, most telling first; every other point of the control run follows.
    ranked: tuple[str, ...] = ()

    def prepare(self, trial: str) -> Any:
        """A fresh copy of what the operation acts on; a context for the other methods."""
        raise NotImplementedError

    def command(self, ctx: Any) -> tuple[list[str], dict[str, str]]:
        """The ``stateops`` arguments and extra environment: the same for a run and its rerun."""
        raise NotImplementedError

    def capture(self, ctx: Any) -> Any:
        """After the control run: what every resumed trial must equal."""
        raise NotImplementedError

    def judge_killed(self, ctx: Any, expected: Any) -> list[str]:
        """Right after the kill, before the rerun: what the operation promises of any moment
        (the target is the old checkpoint or the new one, a pending rollback is marked, ...)."""
        return []

    def judge(self, ctx: Any, expected: Any) -> list[str]:
        """After a resume: what is wrong with the result (empty: sound)."""
        raise NotImplementedError

    def restart(self, ctx: Any) -> str | None:
        """Restart the result in Spark; None when its state and output equal the control's,
        else what differed."""
        raise NotImplementedError


@dataclass
class Trial:
    name: str
    mode: str  # "point" (STATEOPS_KILL_AT) or "random" (a delay)
    aim: str  # "delete:3", "12.5 ms into the work", "0.412 s after the start"
    hit: str = ""  # where the run died: "delete:3", "after upload:4", "before any point", ...
    killed: bool = False
    problems: list[str] = field(default_factory=list)
    restart: str | None = None  # "equal", or what differed; None: not restarted


@dataclass
class OperationReport:
    operation: str
    settings: Settings
    command: str
    points: Counter  # points a clean run passes: name -> times
    window: tuple[float, float, float]  # a clean run: seconds to its first point, last, end
    trials: list[Trial]
    seconds: float

    @property
    def sound(self) -> int:
        return sum(not t.problems for t in self.trials)

    @property
    def restarted(self) -> list[Trial]:
        return [t for t in self.trials if t.restart is not None]

    @property
    def killed(self) -> int:
        return sum(t.killed for t in self.trials)

    @property
    def finished_first(self) -> int:
        """Random trials whose delay outlasted the run: a clean run and its rerun, no kill."""
        return sum(t.mode == "random" and not t.killed for t in self.trials)

    def failures(self) -> list[str]:
        out = [
            f"{t.name} ({t.mode} {t.aim}, died at {t.hit}): {p}"
            for t in self.trials
            for p in t.problems
        ]
        if self.trials and not self.killed:
            out.append(f"none of the {len(self.trials)} trials was killed: nothing was proven")
        out += [
            f"{t.name} ({t.mode} {t.aim}): Spark restart differs from the control: {t.restart}"
            for t in self.restarted
            if t.restart != "equal"
        ]
        return out


REPORTS: list[OperationReport] = []  # this process's reports, for the terminal summary


@dataclass
class _Run:
    returncode: int
    stderr: str
    trace: list[tuple[str, int, float]]  # points reached: name, k, time
    started: float
    ended: float


def _run(
    argv: list[str],
    env: dict[str, str],
    trace: Path,
    *,
    kill_at: str | None = None,
    delay: float | None = None,
    from_first: bool = False,
) -> _Run:
    """``stateops ARGV``, traced; killed at point ``kill_at``, or ``delay`` seconds after its
    start (``from_first``: after it reached its first point)."""
    trace.unlink(missing_ok=True)
    full = {k: v for k, v in os.environ.items() if k not in _FAULT_ENV}
    full.update(env, STATEOPS_FAULT_TRACE=str(trace))
    if kill_at:
        full["STATEOPS_KILL_AT"] = kill_at
    started = time.time()
    proc = subprocess.Popen(
        [str(VENV_BIN / "stateops"), *argv],
        env=full,
        text=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        if delay is not None and from_first:
            # Start and planning take longer, and vary more, than many operations' work: wait
            # for the work to begin, then kill within it.
            while proc.poll() is None and not trace.exists():
                time.sleep(0.0005)
        if delay is not None:
            try:
                proc.wait(timeout=delay)
            except subprocess.TimeoutExpired:
                proc.send_signal(signal.SIGKILL)
        _, stderr = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    ended = time.time()
    points = []
    if trace.exists():
        for line in trace.read_text().splitlines():
            name, k, at = line.split()
            points.append((name, int(k), float(at)))
    return _Run(proc.returncode, stderr, points, started, ended)


def _last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else "(no output)"


def _plan(
    control: _Run, ranked: tuple[str, ...], n: int, rng: random.Random
) -> list[tuple[str, str, float | None, bool]]:
    """``n`` trials as (mode, aim, delay, from_first): about 40% at a random moment, the rest
    at points of the control run, each point name in turn (``ranked`` first) at a K not tried
    yet."""
    if not control.trace:
        raise AssertionError("the control run passed no fault point: nothing to aim at")
    n_random = max(1, round(n * 0.4)) if n > 1 else 0
    by_name: dict[str, list[int]] = {}
    for name, k, _ in control.trace:
        by_name.setdefault(name, []).append(k)
    names = [x for x in ranked if x in by_name] + [x for x in by_name if x not in ranked]
    aims: list[str] = []
    untried = {name: list(ks) for name, ks in by_name.items()}
    while len(aims) < n - n_random:
        if not any(untried.values()):
            untried = {name: list(ks) for name, ks in by_name.items()}  # all tried: again
        for name in names:
            if untried[name] and len(aims) < n - n_random:
                k = untried[name].pop(rng.randrange(len(untried[name])))
                aims.append(f"{name}:{k}")
    trials = [("point", aim, None, False) for aim in aims]
    # A random moment: three in four while the operation works (from its first point, within
    # the time the control run took from its first point to its last), the others anywhere in
    # the run (interpreter start, planning, the lock, the exit).
    first, last, total = _window(control)
    for _ in range(n_random):
        if rng.random() < 0.75:
            delay = rng.uniform(0, last - first)
            trials.append(("random", f"{delay * 1000:.1f} ms into the work", delay, True))
        else:
            delay = rng.uniform(0, total)
            trials.append(("random", f"{delay:.3f} s after the start", delay, False))
    rng.shuffle(trials)
    return trials


def _window(run: _Run) -> tuple[float, float, float]:
    """Seconds from the start of ``run`` to its first point, to its last, to its end."""
    return (
        run.trace[0][2] - run.started,
        run.trace[-1][2] - run.started,
        run.ended - run.started,
    )


def _hit(run: _Run, mode: str) -> str:
    """Where ``run`` died: the point it was killed at (its trace's last point: the library
    traces a point before it kills there), "before any point", or "finished first" (a
    random delay longer than the run) / "not reached" (an aim the run never got to)."""
    if run.returncode != -signal.SIGKILL:
        return "finished first" if mode == "random" else "not reached"
    if not run.trace:
        return "before any point"
    name, k, _ = run.trace[-1]
    return f"{name}:{k}" if mode == "point" else f"after {name}:{k}"


def _kill_problems(run: _Run, mode: str, aim: str, hit: str) -> list[str]:
    """An aimed trial proves something only if its run died at the point aimed at: a run
    that finished, failed first, or died elsewhere leaves a result that was never killed
    there, and its sound rerun would pass for a proof."""
    if mode != "point" or hit == aim:
        return []
    return [
        f"aimed at {aim}, but the run died at {hit} (exit {run.returncode}): the control run "
        "passed that point, this one did not; the trial proves nothing"
    ]


def run_operation(
    op: Operation, work: Path, settings: Settings = SETTINGS, log: Callable[[str], None] = print
) -> OperationReport:
    """Control run, then ``settings.trials`` killed-and-resumed trials, ``settings.restarts`` of
    them restarted in Spark. The report is also kept in :data:`REPORTS`."""
    started = time.time()
    rng = random.Random(f"{settings.seed}:{op.name}")
    work.mkdir(parents=True, exist_ok=True)
    trace = work / f"{op.name}.trace"
    ctx = op.prepare("control")
    argv, env = op.command(ctx)
    command = "stateops " + " ".join(argv)
    control = _run(argv, env, trace)
    if control.returncode != 0:
        raise AssertionError(f"control run of stateops {' '.join(argv)} failed:\n{control.stderr}")
    expected = op.capture(ctx)
    if problems := op.judge(ctx, expected):
        raise AssertionError(f"the control run is not sound itself: {problems}")
    plan = _plan(control, op.ranked, settings.trials, rng)
    restart_at = set(rng.sample(range(len(plan)), min(settings.restarts, len(plan))))
    trials = []
    for i, (mode, aim, delay, from_first) in enumerate(plan):
        trial = Trial(f"t{i:02d}", mode, aim)
        ctx = op.prepare(trial.name)
        argv, env = op.command(ctx)
        kill_at = aim if mode == "point" else None
        killed = _run(argv, env, trace, kill_at=kill_at, delay=delay, from_first=from_first)
        trial.hit = _hit(killed, mode)
        trial.killed = killed.returncode == -signal.SIGKILL
        trial.problems += _kill_problems(killed, mode, aim, trial.hit)
        if killed.returncode not in (0, -signal.SIGKILL):
            trial.problems.append(
                f"the run before the kill failed (exit {killed.returncode}): "
                f"{_last_line(killed.stderr)}"
            )
        trial.problems += [f"after the kill: {p}" for p in op.judge_killed(ctx, expected)]
        resumed = _run(argv, env, trace)
        if resumed.returncode != 0:
            trial.problems.append(
                f"the rerun failed (exit {resumed.returncode}): {_last_line(resumed.stderr)}"
            )
        else:
            trial.problems += op.judge(ctx, expected)
        if i in restart_at and not trial.problems:
            trial.restart = op.restart(ctx) or "equal"
        log(
            f"{op.name} {trial.name}: {mode} {aim}, died at {trial.hit}: "
            + ("sound" if not trial.problems else "; ".join(trial.problems))
            + (f"; Spark restart {trial.restart}" if trial.restart else "")
        )
        trials.append(trial)
    trace.unlink(missing_ok=True)
    points = Counter(name for name, _, _ in control.trace)
    report = OperationReport(
        op.name, settings, command, points, _window(control), trials, time.time() - started
    )
    REPORTS.append(report)
    return report


def _points(counts: Counter) -> str:
    return ", ".join(f"{name} x{n}" for name, n in counts.items())


def format_report(reports: list[OperationReport]) -> str:
    """The per-operation figures of a session, for a person."""
    if not reports:
        return ""
    s = reports[0].settings
    w = max(11, *(len(r.operation) for r in reports))  # "transplant-kafka-topic" fits
    lines = [
        f"fault injection: seed {s.seed}, {s.trials} trials per operation, Spark restarts of "
        f"{s.restarts} per operation",
        f"replay: {s.replay()}",
        "",
        f"{'operation':<{w}} {'trials':>6} {'killed':>6} {'finished first':>14} "
        f"{'resumes sound':>13} {'restarts equal':>14} {'seconds':>8}",
    ]
    for r in reports:
        equal = sum(t.restart == "equal" for t in r.restarted)
        lines.append(
            f"{r.operation:<{w}} {len(r.trials):>6} {r.killed:>6} {r.finished_first:>14} "
            f"{f'{r.sound}/{len(r.trials)}':>13} {f'{equal}/{len(r.restarted)}':>14} "
            f"{r.seconds:>8.0f}"
        )
    for r in reports:
        chosen = sorted({t.hit for t in r.trials if t.mode == "point"}, key=_order)
        randoms = Counter(t.hit for t in r.trials if t.mode == "random")
        lines += [
            "",
            f"{r.operation}: {r.command}",
            f"  a clean run: {r.window[2]:.2f} s, its points from {r.window[0]:.2f} s to "
            f"{r.window[1]:.2f} s: {_points(r.points)}",
            f"  killed at chosen points ({sum(t.mode == 'point' for t in r.trials)}): "
            + (", ".join(chosen) or "-"),
            f"  at random moments ({sum(randoms.values())}, {r.finished_first} finished "
            "before the kill): "
            + (
                ", ".join(
                    f"{hit} x{n}"
                    for hit, n in sorted(randoms.items(), key=lambda kv: _order(kv[0]))
                )
                or "-"
            ),
        ]
        lines += [f"  FAILED {f}" for f in r.failures()]
    return "\n".join(lines)


def _order(hit: str) -> tuple:
    name, _, k = hit.removeprefix("after ").partition(":")
    return (name, int(k) if k.isdigit() else 0)
