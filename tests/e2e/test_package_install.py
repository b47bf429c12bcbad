"""The package installed as a platform team installs it (issue 75): `make wheel`, then a fresh
virtual environment with stock Airflow from the registry and the wheel with its `airflow`
extra, no checkout on the path. pip finds the set consistent, the wheel's metadata states
ranges, Airflow lists the provider and the "Streaming state" view (from the entry points, no
plugins folder of ours), and the Spark jobs, the project's jar, the library the executors get
and the CLI are where the installed package is.

Then a project of one's own beside it (its DAGs folder calling the factory, its registry, its
code in its own package) runs its start, backup and migration DAGs."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from tests.conftest import ROOT, S3_KEY, S3_SECRET

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


@dataclass
class Installed:
    """A fresh virtual environment: stock Airflow from the registry, then the built wheel with
    its ``airflow`` and ``spark`` extras; no checkout on the path."""

    root: Path
    venv: Path
    env: dict[str, str]

    def run(self, *args: str, check: bool = True, **more_env: str) -> subprocess.CompletedProcess:
        done = subprocess.run(
            args,
            cwd=self.root,
            env=self.env | more_env,
            capture_output=True,
            text=True,
            timeout=1200,
        )
        if check:
            assert done.returncode == 0, (
                f"{' '.join(args)}:\n{done.stdout[-4000:]}\n{done.stderr[-4000:]}"
            )
        return done

    def bin(self, name: str) -> str:
        return str(self.venv / "bin" / name)


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Installed:
    built = subprocess.run(["make", "wheel"], cwd=ROOT, capture_output=True, text=True)
    assert built.returncode == 0, built.stdout + built.stderr
    (wheel,) = (ROOT / "dist").glob("stateops-*.whl")
    root = tmp_path_factory.mktemp("installed")
    venv = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHONPATH", "STATEOPS_"))}
    env = {k: v for k, v in env.items() if not k.startswith(("AIRFLOW", "SPARK_", "PYSPARK_"))}
    env |= {
        "AIRFLOW_HOME": str(root / "airflow"),
        "PATH": f"{venv / 'bin'}:{os.environ['PATH']}",
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__PLUGINS_FOLDER": str(root / "no-plugins"),
        "XDG_CACHE_HOME": str(root / "cache"),  # where the executors' zip is made
    }
    done = Installed(root, venv, env)
    # Stock Airflow first, as a platform has it; then the wheel, which must fit beside it.
    done.run(done.bin("pip"), "install", "--quiet", _requirement("apache-airflow"))
    done.run(done.bin("pip"), "install", "--quiet", f"{wheel}[airflow,spark]")
    return done


def test_the_wheel_installs_beside_stock_airflow_and_registers_itself(installed):
    venv, run, bin_ = installed.venv, installed.run, installed.bin
    assert "No broken requirements found" in run(bin_("pip"), "check").stdout

    probe = run(
        bin_("python"),
        "-c",
        "import json, stateops, stateops_airflow.tasks\n"
        "from importlib.metadata import requires\n"
        "from stateops.spark.jobs import job_path, py_files, spark_classpath_conf\n"
        "print(json.dumps({'at': stateops.__file__, 'job': str(job_path('run_query.py')),"
        " 'requires': requires('stateops'), 'classpath': spark_classpath_conf(),"
        " 'py_files': py_files()}))",
    )
    found = json.loads(probe.stdout.strip().splitlines()[-1])
    assert found["at"].startswith(str(venv)), found  # the installed one, not the checkout's
    assert Path(found["job"]).is_file() and str(venv) in found["job"], found
    jar = found["classpath"].get("spark.executor.extraClassPath", "")
    assert jar.endswith("stateops/jars/stateops-checkpoint.jar") and str(venv) in jar, found
    assert Path(jar).is_file(), found
    with zipfile.ZipFile(found["py_files"]) as shipped:  # what the executors import
        names = set(shipped.namelist())
    assert {"stateops/__init__.py", "stateops/spark/streaming.py"} <= names, sorted(names)[:5]
    pinned = [r for r in map(Requirement, found["requires"]) if _pins(r)]
    assert pinned == [], pinned
    assert run(bin_("stateops"), "--version").stdout.startswith("stateops ")

    providers = run(bin_("airflow"), "providers", "list", "--output", "json").stdout
    assert "stateops" in [p["package_name"] for p in json.loads(providers)], providers
    plugins = run(bin_("airflow"), "plugins", "--output", "json").stdout
    assert [p["name"] for p in json.loads(plugins)].count("stateops_ui") == 1, plugins
    assert "stateops_ui" in _api_server_plugins(installed), "not in the API server's list"


def _api_server_plugins(installed: Installed) -> list[str]:
    """The plugins the API server of the fresh environment lists (``/api/v2/plugins``)."""
    from stateops.dev.airflow_dags import api_call, api_token
    from stateops.dev.s3server import free_port

    port, password = free_port(), "stateops-test-admin"
    passwords = installed.root / "passwords.json"
    passwords.write_text(json.dumps({"admin": password}))
    env = installed.env | {
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": "admin:admin",
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(passwords),
    }
    installed.run(installed.bin("airflow"), "db", "migrate")
    log = installed.root / "api-server.log"
    with open(log, "w") as out:
        server = subprocess.Popen(
            [installed.bin("airflow"), "api-server", "--port", str(port)],
            cwd=installed.root,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 240
        while True:
            try:
                token = api_token(base, password)
                break
            except OSError:
                assert server.poll() is None, log.read_text()[-3000:]
                assert time.monotonic() < deadline, log.read_text()[-3000:]
                time.sleep(2)
        return [p["name"] for p in api_call(f"{base}/api/v2/plugins", token=token)["plugins"]]
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=60)


TEAM_REGISTRY = {
    "data_dir": "data",
    "code_paths": ["src"],
    "backups": {"url": "s3://backups/team", "conn_id": "aws_default"},
    "queries": {
        "visits": {
            "source": {
                "format": "json",
                "path": "landing/visits",
                "schema": "page STRING, event_time TIMESTAMP",
                "options": {"maxFilesPerTrigger": 1},
            },
            "transform": {"function": "team_code.counts:per_page", "output_mode": "update"},
            "key_columns": ["page"],
            "sink": {"format": "parquet", "path": "output/visits"},
            "checkpoint": "checkpoints/visits",
            "shuffle_partitions": 2,
            "approval": "none",
        }
    },
}
TEAM_CODE = """
def per_page(spark, inputs):
    \"\"\"Views per page: the team's own stateful query.\"\"\"
    return inputs["source"].groupBy("page").count()
"""


def _land(folder: Path, files: int, first: int) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for n in range(first, first + files):
        rows = [
            {"page": f"p{(n + i) % 3}", "event_time": f"2026-12-0{1 + n % 5}T10:0{i}:00Z"}
            for i in range(4)
        ]
        (folder / f"part-{n:03d}.json").write_text("\n".join(json.dumps(r) for r in rows))


def test_a_project_of_its_own_runs_the_lifecycle_dags_of_its_registry_with_its_code(installed, s3):
    """A user project folder beside the installed package: its own DAGs folder (one file that
    calls the factory), its own registry, its own query code in its own package. ``airflow
    dags test`` of its start, backup and (real) migration DAGs succeeds."""
    import yaml

    project = installed.root / "team"
    (project / "dags").mkdir(parents=True)
    (project / "dags" / "team.py").write_text(
        "from pathlib import Path\n\n"
        "from stateops_airflow.dags import lifecycle_dags\n\n"
        "REGISTRY = Path(__file__).resolve().parents[1] / 'registry.yaml'\n"
        "globals().update(lifecycle_dags(REGISTRY, prefix='team_', tags=['team']))\n"
    )
    (project / "registry.yaml").write_text(yaml.safe_dump(TEAM_REGISTRY, sort_keys=False))
    (project / "src" / "team_code").mkdir(parents=True)
    (project / "src" / "team_code" / "__init__.py").write_text("")
    (project / "src" / "team_code" / "counts.py").write_text(TEAM_CODE)
    _land(project / "data" / "landing" / "visits", files=3, first=0)
    _land(project / "data" / "landing_v2" / "visits", files=2, first=10)
    conn = {"conn_type": "aws", "login": S3_KEY, "password": S3_SECRET}
    env = {
        "AIRFLOW__CORE__DAGS_FOLDER": str(project / "dags"),
        "AIRFLOW_CONN_SPARK_DEFAULT": json.dumps({"conn_type": "spark", "host": "local[2]"}),
        "AIRFLOW_CONN_AWS_DEFAULT": json.dumps(conn | {"extra": {"endpoint_url": s3.endpoint}}),
        "PYSPARK_PYTHON": installed.bin("python"),
    }
    airflow = installed.bin("airflow")
    installed.run(airflow, "db", "migrate", **env)

    def dags_test(dag_id: str, *args: str) -> str:
        done = installed.run(airflow, "dags", "test", dag_id, *args, check=False, **env)
        log = done.stdout + done.stderr
        assert done.returncode == 0 and "new_state=failed" not in log, log[-5000:]
        return log

    dags_test("team_stream_start")
    checkpoint = project / "data" / "checkpoints" / "visits"
    assert (checkpoint / "commits" / "2").is_file(), "a batch per landed file"
    log = dags_test("team_stream_checkpoint_backup")
    assert "visits: backup " in log and " of batch 2" in log, log[-3000:]
    conf = {
        "query": "visits",
        "new_source_format": "json",
        "new_source_path": "landing_v2/visits",
        "dry_run": False,
    }
    log = dags_test("team_stream_source_migration", "--conf", json.dumps(conf))
    status = installed.run(
        installed.bin("stateops"),
        "--registry",
        str(project / "registry.yaml"),
        "status",
        "visits",
        "--json",
        check=False,
        **env,
    )
    assert "landing_v2/visits" in status.stdout, status.stdout[-3000:] + status.stderr[-2000:]
