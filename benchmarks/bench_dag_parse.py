"""DAG parsing: what the project's DAG files cost the dag-processor against empty DAG files.

    .venv/bin/python benchmarks/bench_dag_parse.py [--runs 7]

Each run is a fresh Python process (as a dag-processor's parse of a changed file is a fresh
import) that imports Airflow, then times ``DagBag(dag_folder=...)`` alone over one folder: the
project's ``dags/`` (the registry in the environment, as ``make airflow`` sets it), and, as the
baseline measured in the same run, a folder of as many DAG files that each define one DAG with
one task and import nothing of the project. Prints the median seconds of each and the ratio.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

EMPTY_DAG = """from datetime import datetime

from airflow.sdk import dag, task


@dag(dag_id="empty_{n}", schedule=None, start_date=datetime(2026, 1, 1), catchup=False)
def empty_{n}() -> None:
    @task
    def nothing() -> None:
        return None

    nothing()


empty_{n}()
"""

PARSE = """
import json, sys, time
from airflow.dag_processing.dagbag import DagBag
start = time.perf_counter()
bag = DagBag(dag_folder=sys.argv[1])
seconds = time.perf_counter() - start
print(json.dumps({"seconds": seconds, "dags": len(bag.dags), "errors": len(bag.import_errors)}))
"""


def parse(folder: Path, env: dict[str, str]) -> dict:
    proc = subprocess.run(
        [sys.executable, "-c", PARSE, str(folder)],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        raise SystemExit(f"parsing {folder} failed:\n{proc.stderr[-3000:]}")
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    if result["errors"]:
        raise SystemExit(f"{folder}: {result['errors']} import errors")
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7)
    args = parser.parse_args()
    dags = ROOT / "dags"
    count = len(list(dags.glob("*.py")))
    with tempfile.TemporaryDirectory(prefix="stateops-bench-dags-") as tmp:
        empty = Path(tmp) / "empty"
        empty.mkdir()
        for n in range(count):
            (empty / f"empty_{n}.py").write_text(EMPTY_DAG.format(n=n))
        env = {
            **os.environ,
            "AIRFLOW_HOME": str(Path(tmp) / "airflow"),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "PYTHONPATH": os.pathsep.join(
                [str(ROOT / "include"), os.environ.get("PYTHONPATH", "")]
            ),
            "STATEOPS_REGISTRY": os.environ.get("STATEOPS_REGISTRY", str(ROOT / "registry.yaml")),
        }
        times: dict[str, list[float]] = {"empty": [], "project": []}
        for _ in range(args.runs):  # interleaved: a busy moment weighs on both alike
            times["empty"].append(parse(empty, env)["seconds"])
            times["project"].append(parse(dags, env)["seconds"])
    base = statistics.median(times["empty"])
    print(f"DagBag parse of {count} DAG files, median of {args.runs} fresh processes")
    for name, label in (("empty", "empty DAG files (baseline)"), ("project", "dags/")):
        median = statistics.median(times[name])
        print(f"  {label:<28} {median:6.3f} s  {median / base:5.1f}x")


if __name__ == "__main__":
    main()
