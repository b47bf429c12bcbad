"""The lifecycle stories on the fleet against the same stories on `make airflow`'s single host,
and on each a migration's downtime against a plain stop and restart (issue 56's figures).

    source scripts/env.sh && .venv/bin/python benchmarks/bench_fleet.py [--only single|fleet]

In one run on this machine, one after the other, each started as a newcomer starts it:
`make airflow` (airflow standalone: SQLite, the LocalExecutor, the driver on the host, the
checkpoint in a local folder) and `make fleet` (Postgres, Celery with two workers that share no
disk, a Spark cluster, the checkpoint and the control store in S3), both with the registry's
Kafka query (kafka_visits) alone. On each, driven over the REST API as the UI does, a run timed
by Airflow (its start to its end):

- up: the script's start to its "ready" line;
- ``stream_start``'s first run (the scheduled one), then the next, after a round of records;
- a plain stop and restart of the query running continuously on the Spark cluster
  (`stateops stop`, then `stateops run` again at once, records waiting);
- the migration to a new topic of the query running continuously, approved twice;
- a code upgrade approved twice, and the run after it.

The downtimes are the old query's last commit to the new query's first (commit files' times):
the plain restart's and the migration's. Prints each figure on both and the ratio fleet /
single host, and on each the migration's downtime / the plain restart's; writes
build/bench-fleet.json. About 40 minutes on 2 cores.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "include"))

from tests.e2e.test_airflow import _until  # noqa: E402
from tests.e2e.test_fleet import (  # noqa: E402
    NEW_TOPIC,
    PASSWORD,
    QUERY,
    Fleet,
    _commit_time,
    _ends,
    migration_to,
    running_fleet,
)
from tests.spark.upgrading import PER_PAGE  # noqa: E402

from stateops.core.checkpoint import load_checkpoint  # noqa: E402
from stateops.core.kafka import parse_offsets  # noqa: E402
from stateops.dev.s3server import free_port  # noqa: E402

OUT = ROOT / "build" / "bench-fleet.json"
# make airflow's ports (scripts/airflow.sh), under the names the fleet's driver reads
SINGLE_PORTS = {
    "PORT": "STATEOPS_AIRFLOW_PORT",
    "SPARK_PORT": "STATEOPS_SPARK_PORT",
    "SPARK_UI_PORT": "STATEOPS_SPARK_UI_PORT",
    "SPARK_WORKER_UI_PORT": "STATEOPS_SPARK_WORKER_UI_PORT",
    "S3_PORT": "STATEOPS_S3_PORT",
    "KAFKA_PORT": "STATEOPS_KAFKA_PORT",
}


@dataclass
class SingleHost(Fleet):
    """`make airflow` driven as the fleet is: one host, so the CLI's host is Airflow's."""

    @property
    def run(self) -> Path:
        return self.dir / "_stateops" / "airflow"

    @property
    def scheduler_log(self) -> Path:
        return self.run / "airflow.log"  # airflow standalone's output

    @property
    def bastion(self) -> dict[str, str]:
        return self.env

    def script(self, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            ["scripts/airflow.sh", *args], cwd=ROOT, env=self.env, capture_output=True,
            text=True, timeout=600,
        )  # fmt: skip


@contextmanager
def running_single_host() -> Iterator[SingleHost]:
    """`make airflow` in a folder of its own on free ports, the registry's Kafka queries alone
    (as on the fleet), until it said it is ready; stopped after, on failure too."""
    folder = Path(tempfile.mkdtemp(prefix="stateops-single-"))
    port = {name: free_port() for name in SINGLE_PORTS}
    raw = yaml.safe_load((ROOT / "registry.yaml").read_text())
    raw["data_dir"] = str(folder)
    raw["queries"] = {
        n: q for n, q in raw["queries"].items() if q.get("source", {}).get("format") == "kafka"
    }
    (folder / "registry.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))
    (folder / "landing").mkdir()  # no file query's sample data (the script writes it if empty)
    (folder / "landing" / ".none").touch()
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("AIRFLOW_CONN_", "STATEOPS_S3_", "STATEOPS_KAFKA_"))
    }
    env |= {
        "AIRFLOW_HOME": str(folder / "airflow"),
        "STATEOPS_DATA_DIR": str(folder),
        "STATEOPS_REGISTRY": str(folder / "registry.yaml"),
        "STATEOPS_ADMIN_PASSWORD": PASSWORD,
        # the manual DAGs (stream_start is unpaused by the story: its first run is scheduled)
        "STATEOPS_UNPAUSE": "stream_source_migration stream_code_upgrade",
        **{SINGLE_PORTS[name]: str(p) for name, p in port.items()},
        "STATEOPS_S3_ENDPOINT_URL": f"http://127.0.0.1:{port['S3_PORT']}",
        "STATEOPS_KAFKA_BOOTSTRAP_SERVERS": f"127.0.0.1:{port['KAFKA_PORT']}",
    }
    log = folder / "make-airflow.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(
            ["scripts/airflow.sh"], cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
    host = SingleHost(folder, env, proc, log, port)

    def ready() -> bool:
        if proc.poll() is not None:
            raise SystemExit(f"make airflow exited {proc.returncode}:\n{host.output()[-3000:]}")
        return "stops everything" in host.output()

    try:
        os.environ["STATEOPS_KAFKA_BOOTSTRAP_SERVERS"] = env["STATEOPS_KAFKA_BOOTSTRAP_SERVERS"]
        started = time.monotonic()
        _until("make airflow did not say it is ready", ready, 420, host.output)
        host.figures["up"] = round(time.monotonic() - started, 1)
        yield host
    finally:
        if proc.poll() is None:
            host.script("stop")
            proc.wait(timeout=120)
        shutil.rmtree(folder, ignore_errors=True)


@contextmanager
def continuous(d: Fleet, name: str) -> Iterator[subprocess.Popen]:
    """``stateops run QUERY --mode continuous`` on the deployment's Spark cluster, from the
    operator's host; killed if it is still running after."""
    spark = f"spark://127.0.0.1:{d.port['SPARK_PORT']}"
    log = d.dir / f"{name}.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(
            ["stateops", "run", QUERY, "--mode", "continuous", "--master", spark],
            cwd=ROOT, env=d.bastion, stdout=out, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
    proc.log = log
    try:
        yield proc
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)


def _committed(d: Fleet) -> int:
    """The query's last committed batch (-1: none yet; batch 0 is one)."""
    last = load_checkpoint(d.query().checkpoint).last_committed_batch
    return -1 if last is None else last


def _read_all(d: Fleet) -> bool:
    """The query's last committed batch has read its topic to the end."""
    topic = d.query().source.subscribed[0]
    cp = load_checkpoint(d.query().checkpoint)
    return parse_offsets(cp.entry(cp.last_committed_batch, 0)) == {topic: _ends(topic)}


def _read_to_end(d: Fleet, proc: subprocess.Popen) -> None:
    _until("the continuous run did not read its topic to its end", lambda: _read_all(d), 600,
           proc.log.read_text)  # fmt: skip


def _stop(d: Fleet, proc: subprocess.Popen) -> None:
    """`stateops stop QUERY`, and the run gone."""
    asked = d.cli("stop", QUERY)
    assert asked.returncode == 0, asked.stderr
    assert proc.wait(timeout=300) == 0, proc.log.read_text()[-3000:]


def _downtime(old: str, last: int, new: str) -> float:
    """Batch ``last``'s commit to checkpoint ``old`` to the first commit after it in ``new``."""
    first = min(b for b in load_checkpoint(new).commits if b > last)
    return round(_commit_time(new, first) - _commit_time(old, last), 1)


def _succeeded(d: Fleet, run_url: str, figure: str) -> None:
    state, tasks = d.finished(run_url, figure)
    failed = {t: i["state"] for t, i in tasks.items() if i["state"] != "success"}
    assert state == "success", f"{figure}: {state}, tasks {failed}"


def stories(d: Fleet) -> None:
    """The stories, one after the other, into ``d.figures`` (seconds)."""
    _succeeded(d, d.first_scheduled_run(), "stream_start, first (scheduled) run")
    d.produce(round_=1)
    _succeeded(d, d.trigger("stream_start"), "stream_start, next run")

    # A plain stop and restart, records waiting: the restarted run reads them at once.
    with continuous(d, "before-restart") as running:
        _read_to_end(d, running)
        before = _committed(d)
        for round_ in (2, 3):  # 8 batches: the run is busy when the stop comes
            d.produce(round_=round_)
        _until("the run read none of them", lambda: _committed(d) > before, 300, d.output)
        _stop(d, running)
    checkpoint = d.query().checkpoint
    last = _committed(d)
    if _read_all(d):  # the stop came after the last batch: the restart would wait for records
        d.produce(round_=4)
        print("  (the run read every record before its stop: a round produced before its restart)")
    with continuous(d, "restarted") as running:
        _until("the restarted run committed nothing", lambda: _committed(d) > last, 600,
               running.log.read_text)  # fmt: skip
        d.figures["plain stop and restart: downtime"] = _downtime(checkpoint, last, checkpoint)
        _read_to_end(d, running)
        _stop(d, running)

    # The migration of the query running continuously, as tests/e2e/test_fleet.py's.
    d.produce(round_=1, topic=NEW_TOPIC)
    d.produce(round_=5)
    d.edit({"approval": None})  # a migration asks for approval (the sample says none)
    old = d.query()
    with continuous(d, "migrated") as running:
        _read_to_end(d, running)
        d.produce(round_=6)  # read by the migration's drain, or by the run before its stop
        run_url = d.trigger("stream_source_migration", migration_to(NEW_TOPIC))
        d.approve(run_url, "approve_stop")
        d.approve(run_url, "approve_switch")
        _succeeded(d, run_url, "migration, with its two approvals")
        assert running.wait(timeout=120) == 0, running.log.read_text()[-3000:]
    last = load_checkpoint(old.checkpoint).last_committed_batch
    d.figures["migration: downtime"] = _downtime(old.checkpoint, last, d.query().checkpoint)
    d.produce(round_=2, topic=NEW_TOPIC)
    _succeeded(d, d.trigger("stream_start"), "stream_start, after the migration")

    d.edit(PER_PAGE)
    run_url = d.trigger("stream_code_upgrade", {"query": QUERY, "dry_run": False})
    d.approve(run_url, "approve_stop")
    d.approve(run_url, "approve_switch")
    _succeeded(d, run_url, "code upgrade, with its two approvals")
    d.produce(round_=3, topic=NEW_TOPIC)
    _succeeded(d, d.trigger("stream_start"), "stream_start, after the upgrade")


def _measured(start, name: str) -> dict[str, float]:
    print(f"{name}: starting", flush=True)
    with start() as deployment:
        try:
            stories(deployment)
        finally:  # what it took until then, for a story that failed
            print(f"{name}: {json.dumps(deployment.figures)}", flush=True)
        return deployment.figures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", choices=("single", "fleet"))
    args = parser.parse_args(argv)
    figures = {}
    if args.only != "fleet":
        figures["single"] = _measured(running_single_host, "make airflow (single host)")
    if args.only != "single":
        figures["fleet"] = _measured(running_fleet, "make fleet")
        # the fleet's up line names its start the tests' way
        figures["fleet"]["up"] = figures["fleet"].pop("make fleet: up, both workers registered")
    OUT.parent.mkdir(exist_ok=True)
    OUT.write_text(json.dumps(figures, indent=1) + "\n")

    single, fleet = figures.get("single", {}), figures.get("fleet", {})
    print(f"\n{'seconds':<40} {'single host':>12} {'fleet':>8} {'fleet/single':>13}")
    for name in dict.fromkeys([*single, *fleet]):
        a, b = single.get(name), fleet.get(name)
        ratio = f"{b / a:.2f}x" if a and b else "-"
        print(f"{name:<40} {a if a is not None else '-':>12} {b if b is not None else '-':>8} "
              f"{ratio:>13}")  # fmt: skip
    for where, f in (("single host", single), ("fleet", fleet)):
        if f.get("plain stop and restart: downtime"):
            ratio = f["migration: downtime"] / f["plain stop and restart: downtime"]
            print(f"{where}: the migration's downtime is {ratio:.2f}x a plain stop and restart's")
    print(f"written: {OUT.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
