"""Where the suite's time goes: a record of one test session, for benchmarks/suite_report.py.

On when ``STATEOPS_SUITE_RECORD`` names a folder (``make suite-report`` sets it). Each test
process appends to its own ``events-<worker>.jsonl`` there: every test's phases (wall seconds,
its tier markers) and its CPU seconds (the process and everything it started), every fixture
set up (name, scope, seconds) and the test it was set up for. Stand-ins for ``java`` and for
Spark's Python (``JAVA_HOME``, ``PATH``, ``PYSPARK_PYTHON``) append each JVM and each Python
worker started to ``spawns.log`` with the time and the test worker it came from
(``PYTEST_XDIST_WORKER``, which every process a worker starts inherits), then run the real one:
the report gives each start to the test that was running on that worker at the time, including
the Python workers that the shared Spark session of a test process starts long after it was
itself started. Python workers that Spark's daemon forks are not separate starts: the daemon is
counted.
"""

from __future__ import annotations

import json
import os
import resource
import shlex
import shutil
import string
import sys
import time
from pathlib import Path

RECORD = os.environ.get("STATEOPS_SUITE_RECORD")

_JAVA_STANDIN = """#!/bin/bash
# Records a JVM start (its arguments without the class path), then runs the real java.
args=(); skip=0
for a in "$@"; do
  if [ $skip = 1 ]; then skip=0; continue; fi
  case "$a" in -cp|-classpath|--class-path) skip=1; continue;; esac
  args+=("$a")
done
printf '%s\\t%s\\tjava\\t%s\\n' "$(date +%s.%N)" "${PYTEST_XDIST_WORKER:-main}" \\
  "$(printf '%s' "${args[*]}" | tr '\\t\\n' '  ')" >> $SPAWNS
exec $REAL "$@"
"""

_PYTHON_STANDIN = """#!/bin/sh
# Records a Python worker's start (Spark runs PYSPARK_PYTHON), then runs the real Python.
printf '%s\\t%s\\tpython\\t%s\\n' "$(date +%s.%N)" "${PYTEST_XDIST_WORKER:-main}" \\
  "$(printf '%s' "$*" | tr '\\t\\n' '  ')" >> $SPAWNS
exec $REAL "$@"
"""


def standin(path: Path, template: str, spawns: Path, real: str) -> Path:
    """A script at ``path`` that appends a line to ``spawns`` and runs ``real`` with its
    arguments (``template``: :data:`_JAVA_STANDIN` or :data:`_PYTHON_STANDIN`)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    script = string.Template(template).safe_substitute(
        SPAWNS=shlex.quote(str(spawns)), REAL=shlex.quote(real)
    )
    path.write_text(script)
    path.chmod(0o755)
    return path


def install_standins(folder: Path) -> None:
    """The recording ``java`` and Python in this process's environment, inherited by every
    process the session starts (test workers, spark-submit, Airflow, the broker). The stand-in
    JDK home links everything else of the real one (its lib/, its other tools)."""
    folder.mkdir(parents=True, exist_ok=True)
    if str(folder) in os.environ.get("PYSPARK_PYTHON", ""):
        return  # installed already: this process inherited them
    spawns = folder / "spawns.log"
    python = standin(
        folder / "python" / "python",
        _PYTHON_STANDIN,
        spawns,
        os.environ.get("PYSPARK_PYTHON", sys.executable),
    )
    os.environ["PYSPARK_PYTHON"] = str(python)
    java = (
        Path(os.environ["JAVA_HOME"], "bin", "java")
        if "JAVA_HOME" in os.environ
        else Path(shutil.which("java") or "")
    )
    if not java.is_file():
        return  # no java: the tests that need one say so themselves
    real_home = java.resolve().parent.parent
    home = folder / "java-home"
    (home / "bin").mkdir(parents=True, exist_ok=True)
    for entry in real_home.iterdir():
        if entry.name != "bin" and not (home / entry.name).exists():
            (home / entry.name).symlink_to(entry)
    for tool in (real_home / "bin").iterdir():
        if tool.name != "java" and not (home / "bin" / tool.name).exists():
            (home / "bin" / tool.name).symlink_to(tool)
    standin(home / "bin" / "java", _JAVA_STANDIN, spawns, str(java.resolve()))
    os.environ["JAVA_HOME"] = str(home)
    os.environ["PATH"] = f"{home / 'bin'}{os.pathsep}{os.environ['PATH']}"


def _descendants_cpu() -> float:
    """CPU seconds of every live process below this one, with what each has reaped: with
    this process's own and its reaped children's, all the CPU its tree has used so far."""
    tick = os.sysconf("SC_CLK_TCK")
    parent: dict[int, int] = {}
    cpu: dict[int, float] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            stat = Path(entry.path, "stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        parent[int(entry.name)] = int(fields[1])
        cpu[int(entry.name)] = sum(int(f) for f in fields[11:15]) / tick
    me, total = os.getpid(), 0.0
    for pid in cpu:
        p = parent.get(pid)
        while p is not None and p not in (me, 0, 1):
            p = parent.get(p)
        if p == me:
            total += cpu[pid]
    return total


def tree_cpu() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF)
    reaped = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + reaped.ru_utime + reaped.ru_stime + _descendants_cpu()


def _plain(nodeid: str) -> str:
    """A test's id without the ``@group`` that xdist's loadgroup appends."""
    return nodeid.rsplit("@", 1)[0] if "@tests." in nodeid else nodeid


class Recorder:
    """One test process's events, appended as JSON lines."""

    def __init__(self, folder: Path, worker: str) -> None:
        self.worker = worker
        self.file = (folder / f"events-{worker}.jsonl").open("a", buffering=1)
        self.test: str | None = None

    def close(self) -> None:
        self.file.close()

    def write(self, kind: str, **fields) -> None:
        self.file.write(json.dumps({"kind": kind, "worker": self.worker, **fields}) + "\n")

    def test_started(self, nodeid: str) -> tuple[float, float]:
        self.test = _plain(nodeid)
        return time.time(), tree_cpu()

    def test_finished(self, nodeid: str, started: tuple[float, float]) -> None:
        self.write(
            "test",
            test=_plain(nodeid),
            start=started[0],
            end=time.time(),
            # A process that ended unreaped by this tree takes its CPU with it: never below 0.
            cpu=round(max(0.0, tree_cpu() - started[1]), 3),
        )
        self.test = None

    def phase(self, report, tiers: list[str]) -> None:
        self.write(
            "phase",
            test=_plain(report.nodeid),
            when=report.when,
            seconds=round(report.duration, 3),
            outcome=report.outcome,
            keywords=tiers,
        )

    def fixture(self, fixturedef, seconds: float) -> None:
        self.write(
            "fixture",
            name=fixturedef.argname,
            scope=fixturedef.scope,
            where=fixturedef.baseid or "(plugin)",
            test=self.test,
            seconds=round(seconds, 3),
        )
