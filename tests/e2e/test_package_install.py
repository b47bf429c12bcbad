"""The package installed as a platform team installs it (issue 75): `make wheel`, then a fresh
virtual environment with stock Airflow from the registry and the wheel with its `airflow`
extra, no checkout on the path. pip finds the set consistent, the wheel's metadata states
ranges, Airflow lists the provider and the "Streaming state" view (from the entry points, no
plugins folder of ours), and the Spark jobs, the project's jar, the library the executors get
and the CLI are where the installed package is.

The DAGs of a project of one's own (a factory called from its DAGs folder) and a DAG run
there are not part of this yet (docs/install.md: Not yet)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from tests.conftest import ROOT

pytestmark = [pytest.mark.e2e, pytest.mark.whole]


def _requirement(name: str) -> str:
    """``name==version`` as the project's tested set pins it."""
    for line in (ROOT / "requirements.txt").read_text().splitlines():
        if line.lower().startswith(f"{name}=="):
            return line
    raise AssertionError(f"{name} is not pinned in requirements.txt")


def _pins(requirement: Requirement) -> bool:
    """An exact version, not a range (a marker's ``extra == "airflow"`` is no pin)."""
    return any(spec.operator in ("==", "===") for spec in requirement.specifier)


def test_the_wheel_installs_beside_stock_airflow_and_registers_itself(tmp_path):
    built = subprocess.run(["make", "wheel"], cwd=ROOT, capture_output=True, text=True)
    assert built.returncode == 0, built.stdout + built.stderr
    (wheel,) = (ROOT / "dist").glob("stateops-*.whl")

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    bin_ = venv / "bin"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHONPATH", "STATEOPS_"))} | {
        "AIRFLOW_HOME": str(tmp_path / "airflow"),
        "PATH": f"{bin_}:{os.environ['PATH']}",
    }
    env["AIRFLOW__CORE__LOAD_EXAMPLES"] = "False"
    env["AIRFLOW__CORE__PLUGINS_FOLDER"] = str(tmp_path / "no-plugins")
    env["XDG_CACHE_HOME"] = str(tmp_path / "cache")  # where the executors' zip is made

    def run(*args: str, check: bool = True) -> subprocess.CompletedProcess:
        done = subprocess.run(args, cwd=tmp_path, env=env, capture_output=True, text=True)
        if check:
            assert done.returncode == 0, f"{' '.join(args)}:\n{done.stdout}\n{done.stderr}"
        return done

    # Stock Airflow first, as a platform has it; then the wheel, which must fit beside it.
    run(str(bin_ / "pip"), "install", "--quiet", _requirement("apache-airflow"))
    run(str(bin_ / "pip"), "install", "--quiet", f"{wheel}[airflow]")
    assert "No broken requirements found" in run(str(bin_ / "pip"), "check").stdout

    probe = run(
        str(bin_ / "python"),
        "-c",
        "import json, stateops, stateops_airflow.tasks\n"
        "from importlib.metadata import requires\n"
        "from stateops.spark.jobs import job_path, py_files, spark_classpath_conf\n"
        "print(json.dumps({'at': stateops.__file__, 'job': str(job_path('run_query.py')),"
        " 'requires': requires('stateops'), 'classpath': spark_classpath_conf(),"
        " 'py_files': py_files()}))",
    )
    found = json.loads(probe.stdout.strip().splitlines()[-1])
    assert str(ROOT) not in found["at"] and str(venv) in found["at"], found
    assert Path(found["job"]).is_file() and str(venv) in found["job"], found
    jar = found["classpath"].get("spark.executor.extraClassPath", "")
    assert jar.endswith("stateops/jars/stateops-checkpoint.jar") and str(venv) in jar, found
    assert Path(jar).is_file(), found
    with zipfile.ZipFile(found["py_files"]) as shipped:  # what the executors import
        names = set(shipped.namelist())
    assert {"stateops/__init__.py", "stateops/spark/streaming.py"} <= names, sorted(names)[:5]
    pinned = [r for r in map(Requirement, found["requires"]) if _pins(r)]
    assert pinned == [], pinned
    assert run(str(bin_ / "stateops"), "--version").stdout.startswith("stateops ")

    providers = run(str(bin_ / "airflow"), "providers", "list", "--output", "json").stdout
    assert "stateops" in [p["package_name"] for p in json.loads(providers)], providers
    plugins = run(str(bin_ / "airflow"), "plugins", "--output", "json").stdout
    assert [p["name"] for p in json.loads(plugins)].count("stateops_ui") == 1, plugins
