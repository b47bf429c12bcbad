"""`make fleet`, the production shape (issue 56), as a platform team uses it: the script behind
it (scripts/fleet.sh) starts Postgres, Redis, Airflow with the CeleryExecutor and two workers
that share no folder (each, as root, a host of its own name), a Spark standalone master with
two workers, Kafka and S3, all on free loopback ports; the tests drive it through the REST API
and check the outcome from outside: the checkpoint and the sink in S3, the topic's offsets.

The tests run in file order on one fleet: it is up; the scheduled ``stream_start`` runs on one
worker and its next run on the other, which goes on from the state the first left in S3; a
migration stops a continuous query and switches it; a Spark worker is lost in a run, and the
scheduled cleanup is refused beside it; a Celery worker is killed (SIGKILL, the host lost) in
the middle of a backfill's reprocessing: the task is retried on the other worker, which takes
the lease over once it has expired, and the state is exact; a new host takes its place; it is
killed again in a migration's drain, which the other rolls back; Redis is restarted in a run;
a code upgrade rewrites the state on one worker and the next run on the other runs the new
code; then `make fleet-stop` leaves no process.

A task is steered to a worker with Celery's remote control (``cancel_consumer``): the DAGs are
the same as on any deployment. The module is in the deployments' xdist group with make
airflow's stack (tests/e2e/test_airflow.py): one test process of its own runs them one after
the other, the fleet built once, while the others run the rest of the suite (tests/conftest.py,
``DeploymentsApart``). The module is in the whole proof (`make test-all`);
`make test-all PYTEST_ARGS=tests/e2e/test_fleet.py` runs it alone.
"""

from __future__ import annotations

import collections
import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from stateops.control.audit import read_audit
from stateops.core.checkpoint import Checkpoint, load_checkpoint
from stateops.core.kafka import broker_offsets, kafka_settings, parse_offsets, topic_partitions
from stateops.core.registry import load_registry
from stateops.core.storage import location
from stateops.dev.airflow_dags import api_call as _request
from stateops.dev.airflow_dags import api_token
from stateops.dev.s3server import free_port
from stateops.ops.migration import default_checkpoint
from tests.conftest import ROOT
from tests.e2e.test_airflow import _alive, _awaiting, _until
from tests.spark.harness import read_sink
from tests.spark.test_kafka_rollback import read_topic
from tests.spark.upgrading import PER_PAGE

pytestmark = [pytest.mark.e2e, pytest.mark.whole]

PASSWORD = "stateops-fleet-admin"
HOSTS = ("w1", "w2")
QUERY = "kafka_visits"
TOPIC = "page-visits"
NEW_TOPIC = "page-visits-v2"  # the migration's new source
BUCKET = "stateops-fleet"
# The manual DAGs only: stream_start is unpaused by its test (its first run is the scheduled
# one), cleanup and backup stay paused (their runs would take the query's lock beside a test's).
UNPAUSE = (
    "stream_source_migration stream_code_upgrade stream_backfill stream_bootstrap stream_restore"
)
# The fault test's: a lost host's lease is taken over after it. Its retry comes later anyway
# (the heartbeat timeout, then the DAG's retry delay), and a third host reads it held first.
LEASE_SECONDS = 60
PORTS = ("PORT", "PG_PORT", "REDIS_PORT", "SPARK_PORT", "SPARK_UI_PORT", "S3_PORT", "KAFKA_PORT")


@dataclass
class Fleet:
    dir: Path
    env: dict[str, str]
    proc: subprocess.Popen
    log: Path
    port: dict[str, int]
    # What the stories took here, in seconds: build/test-artifacts/fleet/figures.json
    figures: dict[str, float] = field(default_factory=dict)

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port['PORT']}"

    @property
    def run(self) -> Path:
        return self.dir / "run"

    @property
    def scheduler_log(self) -> Path:
        return self.run / "scheduler.log"

    def output(self) -> str:
        return self.log.read_text()

    def token(self) -> str:
        return api_token(self.base, PASSWORD)

    def celery(self):
        from celery import Celery

        return Celery(broker=f"redis://127.0.0.1:{self.port['REDIS_PORT']}/0")

    def only(self, host: str) -> None:
        """Only ``host`` takes tasks from the shared queue (``default``): the next task lands
        there. Celery's remote control, as an operator drains a host."""
        from kombu.exceptions import OperationalError
        from redis.exceptions import ConnectionError as BrokerDropped

        others = [f"celery@{h}" for h in HOSTS if h != host]

        def steered() -> bool:  # asked again until seen: a busy worker may miss a broadcast,
            # and a broker just restarted drops the connections it had
            with self.celery() as app:
                try:
                    app.control.add_consumer("default", destination=[f"celery@{host}"])
                    app.control.cancel_consumer("default", destination=others)
                    queues = app.control.inspect(timeout=5).active_queues() or {}
                except (BrokerDropped, OperationalError):
                    return False
            taking = [w for w, qs in queues.items() if "default" in {q["name"] for q in qs}]
            return len(queues) == len(HOSTS) and taking == [f"celery@{host}"]

        _until(f"only {host} did not take the shared queue", steered, 120, self.output)

    def trigger(self, dag: str, conf: dict | None = None) -> str:
        url = f"{self.base}/api/v2/dags/{dag}"
        run = _request(
            f"{url}/dagRuns", "POST", {"logical_date": None, "conf": conf or {}}, token=self.token()
        )
        return f"{url}/dagRuns/{run['dag_run_id']}"

    def first_scheduled_run(self) -> str:
        """``stream_start`` unpaused, and its first run, the scheduled one, started: its URL.
        The next scheduled run a day after it (``start.schedule``), not 30 minutes: the runs
        after it are the stories' own, and a scheduled one in the middle of a story would
        take the query's lock (the module takes longer than 30 minutes under load)."""
        self.edit(start={"schedule": "1 day"})
        dag_url = f"{self.base}/api/v2/dags/stream_start"
        _until(
            "the DAG processor did not read start.schedule",
            lambda: _request(dag_url, token=self.token())["timetable_summary"] == "1 day, 0:00:00",
            180,
            self.output,
        )
        _request(dag_url, "PATCH", {"is_paused": False}, token=self.token())
        [scheduled] = _until(
            "the scheduler did not start stream_start",
            lambda: _request(f"{dag_url}/dagRuns", token=self.token())["dag_runs"],
            120,
            self.output,
        )
        assert scheduled["run_type"] == "scheduled", scheduled
        return f"{dag_url}/dagRuns/{scheduled['dag_run_id']}"

    def finished(
        self, run_url: str, figure: str | None = None, timeout: float = 900
    ) -> tuple[str, dict[str, dict]]:
        """The run's end state and its tasks, once it ended; ``figure``: its time (Airflow's
        start to end) goes into the fleet's figures under that name."""
        run = _until(
            f"{run_url} did not finish",
            lambda: (
                (r := _request(run_url, token=self.token()))["state"] in ("success", "failed") and r
            ),
            timeout,
            self.output,
        )
        if figure:
            self.figures[figure] = _seconds(run["start_date"], run["end_date"])
        return run["state"], self.tasks(run_url)

    def tasks(self, run_url: str) -> dict[str, dict]:
        tis = _request(f"{run_url}/taskInstances", token=self.token())["task_instances"]
        return {t["task_id"]: t for t in tis}

    def cli(self, *args: str) -> subprocess.CompletedProcess:
        """``stateops ARGS`` from a third host (a bastion): the fleet's registry, its S3 and
        Kafka, a data folder of its own."""
        return subprocess.run(
            ["stateops", *args],
            cwd=ROOT,
            env=self.bastion,
            capture_output=True,
            text=True,
            timeout=120,
        )

    @property
    def bastion(self) -> dict[str, str]:
        """The environment of a third host: the fleet's, with a data folder of its own."""
        return {**self.env, "STATEOPS_DATA_DIR": str(self.dir / "bastion")}

    @property
    def registry(self) -> Path:
        return self.dir / "registry.yaml"

    def edit(self, entry: dict | None = None, **top) -> None:
        """Change the registry's top-level keys ``top`` and the query's ``entry`` (a value of
        None removes the key), as an operator would."""
        raw = yaml.safe_load(self.registry.read_text())
        for mapping, changes in ((raw, top), (raw["queries"][QUERY], entry or {})):
            for key, value in changes.items():
                mapping.pop(key, None) if value is None else mapping.update({key: value})
        self.registry.write_text(yaml.safe_dump(raw, sort_keys=False))

    def query(self):
        """The query as every host sees it now (a switch in the control store moves it)."""
        return load_registry(self.registry).query(QUERY)

    def produce(self, round_: int, topic: str | None = None) -> int:
        """A round of sample page views into the query's topic (or ``topic``)."""
        topic = topic or next(iter(self.query().source.subscribed))
        out = subprocess.run(
            ["python", "-m", "stateops.dev.sampledata", "--topic", topic, "--users", "40",
             "--round", str(round_)],
            cwd=ROOT, env=self.env, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert out.returncode == 0, out.stderr
        return int(out.stdout.split()[0])  # "N page_visits events (round R) to ..."

    def approve(self, run_url: str, task: str) -> dict:
        """Approve ``task``'s required action over REST once the run waits for it; returns
        what it asked."""
        token = self.token()
        asked = _awaiting(run_url, task, token, self.scheduler_log, self.output)
        _request(
            f"{run_url}/taskInstances/{task}/-1/hitlDetails",
            "PATCH",
            {"chosen_options": ["Approve"], "params_input": {}},
            token=token,
        )
        return asked

    def script(self, *args: str) -> subprocess.CompletedProcess:
        """``scripts/fleet.sh ARGS`` from another shell: ``stop`` (`make fleet-stop`),
        ``worker HOST``, ``redis``."""
        return subprocess.run(
            ["scripts/fleet.sh", *args],
            cwd=ROOT,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=600,
        )

    def isolated(self) -> list[str]:
        """What keeps the workers from being hosts of their own (empty when each is):
        scripts/fleet.sh, as root, starts each in a UTS namespace of its own, named for it.
        Only then is a lost worker's lease judged by its expiry, as on a real fleet; on one
        shared host name, a taker sees the dead driver's PID gone and takes the lease at
        once."""
        if os.geteuid() != 0:
            return ["not root: scripts/fleet.sh starts the workers on this host's name"]
        ours, problems = os.readlink("/proc/self/ns/uts"), []
        for host in HOSTS:
            pid = (self.run / f"worker-{host}.pid").read_text().strip()
            if os.readlink(f"/proc/{pid}/ns/uts") == ours:
                problems.append(f"{host} (pid {pid}) shares this host's UTS namespace")
                continue
            named = subprocess.run(
                ["nsenter", "--target", pid, "--uts", "hostname"],
                capture_output=True,
                text=True,
                timeout=30,
            )
            if named.stdout.strip() != host:
                problems.append(f"{host} (pid {pid}) is named {named.stdout.strip()!r}")
        return problems

    def require_isolated(self) -> None:
        """Skip, saying why, a story whose proof needs hosts of their own."""
        if problems := self.isolated():
            pytest.skip(f"the workers are not hosts of their own ({'; '.join(problems)})")

    def lock(self) -> dict:
        """`stateops lock show` of the query, from the bastion."""
        shown = self.cli("lock", "show", QUERY, "--json")
        assert shown.returncode == 0, shown.stderr
        return json.loads(shown.stdout)

    def status(self) -> dict:
        """`stateops status` of the query, from the bastion."""
        [query] = json.loads(self.cli("status", QUERY, "--json", "--no-backups").stdout)
        return query


@contextmanager
def running_fleet(keep: Path | None = None) -> Iterator[Fleet]:
    """`make fleet` as a newcomer starts it (its own folder, free ports), once it said it is
    ready, this process's clients pointed at its S3 and Kafka; stopped after, on failure too,
    its logs and figures copied to ``keep``. The tests' fleet and benchmarks/bench_fleet.py's."""
    # Under /tmp, readable by the postgres user (a pytest folder is its owner's only).
    folder = Path(tempfile.mkdtemp(prefix="stateops-fleet-"))
    folder.chmod(0o755)
    port = {name: free_port() for name in PORTS}
    env = {
        k: v
        for k, v in os.environ.items()
        # the test session's endpoints and folders: the script draws its own, as for a newcomer
        if not k.startswith(("AIRFLOW_CONN_", "STATEOPS_S3_", "STATEOPS_KAFKA_"))
        and k not in ("AIRFLOW_HOME", "STATEOPS_REGISTRY", "STATEOPS_DATA_DIR")
    }
    env |= {
        "STATEOPS_FLEET_DIR": str(folder),
        "STATEOPS_ADMIN_PASSWORD": PASSWORD,
        "STATEOPS_UNPAUSE": UNPAUSE,
        # A task whose worker is lost is failed (and retried) after a minute, not five.
        "AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT": "60",
        **{f"STATEOPS_FLEET_{name}": str(p) for name, p in port.items()},
        # what the tests' own clients (the CLI, boto3, Kafka) reach: the fleet's
        "STATEOPS_S3_ENDPOINT_URL": f"http://127.0.0.1:{port['S3_PORT']}",
        "STATEOPS_KAFKA_BOOTSTRAP_SERVERS": f"127.0.0.1:{port['KAFKA_PORT']}",
        "STATEOPS_REGISTRY": str(folder / "registry.yaml"),
    }
    log = folder / "make-fleet.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(
            ["scripts/fleet.sh"],
            cwd=ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    fleet = Fleet(folder, env, proc, log, port)

    def ready() -> bool:
        if proc.poll() is not None:  # said at once, not after the timeout
            raise AssertionError(f"make fleet exited {proc.returncode}:\n{fleet.output()[-5000:]}")
        return "stops everything" in fleet.output()

    try:
        with pytest.MonkeyPatch.context() as mp:  # this process's clients: the fleet's
            for name in ("STATEOPS_S3_ENDPOINT_URL", "STATEOPS_KAFKA_BOOTSTRAP_SERVERS"):
                mp.setenv(name, env[name])
            started = time.monotonic()
            _until("make fleet did not say it is ready", ready, 420, fleet.output)
            fleet.figures["make fleet: up, both workers registered"] = round(
                time.monotonic() - started, 1
            )
            yield fleet
    finally:
        if proc.poll() is None:
            fleet.script("stop")
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
        if keep:
            shutil.rmtree(keep, ignore_errors=True)
            shutil.copytree(
                folder / "run",
                keep,
                ignore=shutil.ignore_patterns("*.pid", "*.rdb", "appendonlydir"),
            )
            (keep / "figures.json").write_text(json.dumps(fleet.figures, indent=1) + "\n")
            # what make fleet said, and Postgres's own log (outside run/: it owns its folder)
            for said in (log, folder / "postgres" / "postgres.log"):
                if said.exists():
                    shutil.copy(said, keep / said.name)
            if (folder / "airflow" / "logs").is_dir():  # the tasks' logs, every worker's
                shutil.copytree(folder / "airflow" / "logs", keep / "task-logs")
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(scope="module")
def fleet():
    keep = Path(os.environ.get("STATEOPS_HOME", ROOT)) / "build" / "test-artifacts" / "fleet"
    with running_fleet(keep) as fleet:
        yield fleet


@pytest.fixture(scope="module")
def _failed_before(request) -> int:
    return request.session.testsfailed


@pytest.fixture(autouse=True)
def _after_a_failure(request, _failed_before):
    """The tests build on one another on one fleet: once one failed, the next would wait out
    its timeouts (up to 15 minutes each) on a fleet in an unknown state, and in CI run the
    suite past its limit. They are skipped at once instead; the stop runs regardless."""
    if (
        request.session.testsfailed > _failed_before
        and request.function is not test_make_fleet_stop_stops_everything
    ):
        pytest.skip("a fleet test before this one failed: the fleet is in an unknown state")


def migration_to(topic: str) -> dict:
    """stream_source_migration's conf (as the UI's form sends it): the query to ``topic``,
    read from its earliest offset."""
    return {
        "query": QUERY,
        "new_source_format": "kafka",
        "new_source_topic": topic,
        "new_source_start": "earliest",
        "dry_run": False,
    }


def _seconds(start: str, end: str) -> float:
    return round((datetime.fromisoformat(end) - datetime.fromisoformat(start)).total_seconds(), 1)


def _commit_time(checkpoint: str, batch: int) -> float:
    """When ``batch``'s commit file was written to ``checkpoint`` (epoch seconds)."""
    return (location(checkpoint) / "commits" / str(batch)).stat().st_mtime


def _ends(topic: str) -> dict[int, int]:
    """The topic's end offset per partition (on the environment's brokers)."""
    settings = kafka_settings()
    return broker_offsets(settings, topic_partitions(settings, [topic]), "latest")[topic]


def _events(topics: tuple[str, ...]) -> list[dict]:
    """The events in ``topics``, read from their beginning to their end."""
    broker = SimpleNamespace(bootstrap_servers=os.environ["STATEOPS_KAFKA_BOOTSTRAP_SERVERS"])
    return [json.loads(value) for t in topics for value in read_topic(broker, t, {}, _ends(t))]


def assert_exact(fleet: Fleet, spark, topics: tuple[str, ...] = (TOPIC,)) -> int:
    """The query's checkpoint has read its topic to the end, and each user's visit count is
    that user's events in ``topics``, every topic the query has read: in the state (its
    ``count``, read by Spark's ``statestore`` reader) and in the sink's latest row per user
    (Update mode): nothing read twice, nothing lost, nothing dropped at a carry-over. Returns
    the last committed batch."""
    query = fleet.query()
    cp = load_checkpoint(query.checkpoint)
    last = cp.last_committed_batch
    committed = parse_offsets(cp.entry(last, 0))  # read up to, by the last batch
    assert committed == {topics[-1]: _ends(topics[-1])}, committed
    visits = collections.Counter(event["user_id"] for event in _events(topics))
    state = {user: n for (user,), n in state_values(spark, query.checkpoint, "count").items()}
    assert state == dict(visits), "the state's counts are not the topics'"
    counted = {}  # user -> visits, batch by batch: the last batch's row wins
    for _, rows in sorted(read_sink(location(query.sink.path)).items()):
        counted |= {row[0]: row[1] for row in rows}  # output: user_id, visits, ...
    assert counted == dict(visits), "the sink's counts are not the topics'"
    return last


def state_values(spark, checkpoint: str, variable: str) -> dict[tuple, int]:
    """Each key of the value state ``variable`` at the checkpoint's last batch, and its
    value's first field, as Spark's ``statestore`` reader reads them (from S3)."""
    from stateops.spark.streaming import checkpoint_url

    url = checkpoint_url(spark, checkpoint)
    rows = spark.read.format("statestore").option("stateVarName", variable).load(url).collect()
    return {tuple(row.key): row.value[0] for row in rows}


def test_the_fleet_is_up_with_both_workers_registered(fleet):
    out = fleet.output()
    assert f"Airflow UI    {fleet.base}   (login: admin / {PASSWORD})" in out, out
    assert "Workers       celery@w1 celery@w2 " in out, out
    _until(
        "both Celery workers did not answer a ping",
        lambda: (
            sorted(n for reply in fleet.celery().control.ping(timeout=5) for n in reply)
            == ["celery@w1", "celery@w2"]
        ),
        60,
        fleet.output,
    )
    # Airflow's metadata is in Postgres: the lifecycle DAGs are rows there.
    dags = subprocess.run(
        ["psql", "-h", "127.0.0.1", "-p", str(fleet.port["PG_PORT"]), "-U", "airflow", "-qAt",
         "-c", "select dag_id from dag where dag_id like 'stream_%' order by 1", "airflow"],
        env={**fleet.env, "PGPASSWORD": "airflow"}, capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert dags.stdout.split() == sorted(p.stem for p in (ROOT / "dags").glob("stream_*.py"))
    master = _request(f"http://127.0.0.1:{fleet.port['SPARK_UI_PORT']}/json/")
    assert master["status"] == "ALIVE" and len(master["workers"]) == 2, master
    # Each worker a host of its own: its own data folder, empty, and (as root) its own name.
    for host in HOSTS:
        assert not any((fleet.dir / "hosts" / host / "data").iterdir()), host
    if os.geteuid() == 0:  # the lease stories below judge a lost host by its lease's expiry
        assert not fleet.isolated(), fleet.isolated()
    registry = yaml.safe_load((fleet.dir / "registry.yaml").read_text())
    assert registry["control"] == f"s3://{BUCKET}/control", registry
    assert list(registry["queries"]) == [QUERY]


def test_the_scheduled_run_on_one_worker_and_the_next_on_the_other_go_on_from_s3(fleet, spark):
    """The first, scheduled, ``stream_start`` runs on w1; w2, which has never seen the query,
    runs the next from where the first stopped: the checkpoint and the lease are in S3."""
    fleet.only("w1")
    state, tasks = fleet.finished(fleet.first_scheduled_run(), "stream_start, first run (w1)")
    assert state == "success", tasks
    assert {t["hostname"] for t in tasks.values()} == {"w1"}, tasks
    first = assert_exact(fleet, spark)

    produced = fleet.produce(round_=1)
    fleet.only("w2")
    run_url = fleet.trigger("stream_start")
    state, tasks = fleet.finished(run_url, "stream_start, next run (w2)")
    assert state == "success", tasks
    assert {t["hostname"] for t in tasks.values()} == {"w2"}, tasks
    last = assert_exact(fleet, spark)
    assert last > first and produced > 0
    summary = _request(
        f"{run_url}/taskInstances/record_{QUERY}/xcomEntries/return_value", token=fleet.token()
    )["value"]
    summary = json.loads(summary) if isinstance(summary, str) else summary
    assert summary["last_committed_batch"] == last, summary
    # only the new records' batches, the first right after the first run's last
    assert (summary["first_batch_id"], summary["last_batch_id"]) == (first + 1, last), summary
    assert summary["input_rows"] == produced, summary


def test_a_migration_on_w1_stops_the_continuous_query_and_the_next_run_on_w2_runs_the_new_one(
    fleet, spark
):
    """A continuous run of the query on the Spark cluster, started from a third host; the
    migration to another topic, triggered over REST and approved twice, runs on w1: its stop
    step reaches the driver through the control store (it stops gracefully), the old topic is
    drained, the state carried over and the switch written to the store; the next run, on w2,
    runs the new query on the new checkpoint and the new topic, and the state is exact."""
    fleet.produce(round_=4, topic=NEW_TOPIC)  # the new source has input: the proof needs it
    fleet.produce(round_=2)  # the old source gets records the continuous run reads
    fleet.edit({"approval": None})  # a migration asks for approval (the sample says none)
    old = fleet.query()
    master = f"spark://127.0.0.1:{fleet.port['SPARK_PORT']}"
    running_log = fleet.dir / "continuous.log"
    with open(running_log, "w") as out:
        running = subprocess.Popen(
            ["stateops", "run", QUERY, "--mode", "continuous", "--master", master],
            cwd=ROOT,
            env=fleet.bastion,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        _until(
            "the continuous run did not read the old topic to its end",
            lambda: (
                parse_offsets(
                    (cp := load_checkpoint(old.checkpoint)).entry(cp.last_committed_batch, 0)
                )
                == {TOPIC: _ends(TOPIC)}
            ),
            600,
            running_log.read_text,
        )
        fleet.produce(round_=3)  # read by the migration's drain, or by the run before its stop
        fleet.only("w1")
        run_url = fleet.trigger("stream_source_migration", migration_to(NEW_TOPIC))
        asked = fleet.approve(run_url, "approve_stop")
        assert asked["subject"].startswith(f"Approve the migration of {QUERY}: stop it"), asked
        fleet.approve(run_url, "approve_switch")
        state, tasks = fleet.finished(run_url, "migration, with its two approvals (w1)")
        assert state == "success", {t: i["state"] for t, i in tasks.items()}
        ran = {i["hostname"] for i in tasks.values() if i["state"] == "success"}
        assert ran == {"w1"}, tasks
        assert running.wait(timeout=120) == 0, running_log.read_text()[-5000:]
    finally:
        if running.poll() is None:
            os.killpg(running.pid, signal.SIGKILL)
    assert '"stopped_by_marker": true' in running_log.read_text(), running_log.read_text()[-3000:]
    new = fleet.query()  # read by this host from the switch in the control store
    assert new.checkpoint != old.checkpoint and new.source.subscribed == [NEW_TOPIC], new
    assert new.checkpoint.startswith(f"s3://{BUCKET}/"), new.checkpoint
    last_old = load_checkpoint(old.checkpoint).last_committed_batch
    first_new = min(b for b in load_checkpoint(new.checkpoint).commits if b > last_old)
    downtime = _commit_time(new.checkpoint, first_new) - _commit_time(old.checkpoint, last_old)
    fleet.figures["migration downtime: old query's last commit to new query's first"] = downtime

    fleet.produce(round_=5, topic=NEW_TOPIC)
    fleet.only("w2")
    run_url = fleet.trigger("stream_start")
    state, tasks = fleet.finished(run_url, "stream_start, after the migration (w2)")
    assert state == "success", tasks
    assert {t["hostname"] for t in tasks.values()} == {"w2"}, tasks
    summary = _request(
        f"{run_url}/taskInstances/record_{QUERY}/xcomEntries/return_value", token=fleet.token()
    )["value"]
    summary = json.loads(summary) if isinstance(summary, str) else summary
    assert summary["checkpoint"] == new.checkpoint and summary["batches_run"] > 0, summary
    assert assert_exact(fleet, spark, (TOPIC, NEW_TOPIC)) == summary["last_committed_batch"]


def _writing_on_w1(fleet: Fleet, rounds: tuple[int, ...]) -> tuple[str, int]:
    """``rounds`` produced and a ``stream_start`` triggered on w1, once its run has committed
    a batch: (its run's URL, the last committed batch before it)."""
    checkpoint = fleet.query().checkpoint
    before = load_checkpoint(checkpoint).last_committed_batch
    for round_ in rounds:
        fleet.produce(round_=round_)
    fleet.only("w1")
    run_url = fleet.trigger("stream_start")
    _until(
        "w1's run committed no batch",
        lambda: (load_checkpoint(checkpoint).last_committed_batch or -1) > before,
        600,
        fleet.output,
    )
    return run_url, before


def _kill_session(leader: int) -> None:
    """SIGKILL every process of the session ``leader`` leads: a host lost."""
    for process in _alive({leader}):
        os.kill(int(process.split()[0]), signal.SIGKILL)
    _until(f"session {leader} lived on", lambda: not _alive({leader}), 30, str)


def _task_log(fleet: Fleet, run_id: str, task: str) -> str:
    """What ``task`` of the run ``run_id`` logged, every try of it (every worker's logs)."""
    logs = Path(fleet.dir / "airflow" / "logs")
    return "".join(p.read_text() for p in sorted(logs.rglob(f"run_id={run_id}/task_id={task}/*")))


def _back(fleet: Fleet, host: str) -> None:
    """A new, empty host in the lost ``host``'s place (`scripts/fleet.sh worker HOST`), which
    takes tasks again."""
    back = fleet.script("worker", host)
    assert back.returncode == 0 and f"celery@{host} is back" in back.stdout, back.stderr
    assert not any((fleet.dir / "hosts" / host / "data").iterdir()), f"{host}'s host is not new"
    fleet.only(host)


def test_a_spark_worker_lost_in_a_run_and_the_scheduled_cleanup_beside_it_lose_nothing(
    fleet, spark
):
    """A run on w1; the scheduled cleanup starts on w2 while it runs and is refused, naming
    w1's run (it retries later); the Spark worker that runs the run's executor is killed:
    Spark runs its tasks again on the other worker, and the state is exact."""
    # batches enough for a cleanup to start and a worker to die in
    run_url, before = _writing_on_w1(fleet, rounds=(6, 7, 8, 9))
    fleet.only("w2")
    cleanup = f"{fleet.base}/api/v2/dags/stream_snapshot_cleanup"
    _request(cleanup, "PATCH", {"is_paused": False}, token=fleet.token())  # its schedule: now
    [scheduled] = _until(
        "the scheduler did not start the cleanup",
        lambda: _request(f"{cleanup}/dagRuns", token=fleet.token())["dag_runs"],
        120,
        fleet.output,
    )
    cleanup_url = f"{cleanup}/dagRuns/{scheduled['dag_run_id']}"
    task = f"{cleanup_url}/taskInstances/cleanup_{QUERY}"
    refused = _until(
        "the cleanup was not refused while the run held the query",
        lambda: (ti := _request(task, token=fleet.token()))["state"] == "up_for_retry" and ti,
        300,
        fleet.output,
    )
    assert refused["hostname"] == "w2", refused
    assert fleet.tasks(run_url)[f"run_{QUERY}"]["state"] == "running", "the run ended first"
    logs = Path(fleet.dir / "airflow" / "logs")
    [log] = logs.rglob(f"run_id={scheduled['dag_run_id']}/task_id=cleanup_{QUERY}/attempt=1.log")
    assert f"locked by run (run {run_url.rsplit('/', 1)[1]}" in log.read_text(), log.read_text()
    _request(cleanup, "PATCH", {"is_paused": True}, token=fleet.token())
    _request(cleanup_url, "PATCH", {"state": "failed"}, token=fleet.token())  # no retry later

    # The Spark worker that runs the run's executor, lost.
    def busy() -> int | None:
        for n in (1, 2):
            ui = f"http://127.0.0.1:{fleet.port['SPARK_UI_PORT'] + n}/json/"
            if _request(ui)["executors"]:
                return n
        return None

    n = _until("no Spark worker runs the run's executor", busy, 120, fleet.output)
    _kill_session(int((fleet.run / f"spark-worker-{n}.pid").read_text()))
    state, tasks = fleet.finished(run_url, "stream_start, a Spark worker lost in it (w1)")
    assert state == "success", tasks
    run = tasks[f"run_{QUERY}"]
    assert (run["hostname"], run["try_number"]) == ("w1", 1), run  # Spark retried, not Airflow
    # The kill hit the run: its driver lost the executor (Spark's own log of it, in the
    # task's log: the drivers run with no UI), and carried on with the other worker's.
    driver = _task_log(fleet, run_url.rsplit("/", 1)[1], f"run_{QUERY}")
    assert re.search(r"Lost executor \d+ on ", driver), driver[-5000:]
    fleet.figures["a Spark worker lost in a run: tasks lost with it"] = len(
        re.findall(r" WARN TaskSetManager: Lost task .*ExecutorLostFailure", driver)
    )
    assert assert_exact(fleet, spark, (TOPIC, NEW_TOPIC)) > before
    master = _request(f"http://127.0.0.1:{fleet.port['SPARK_UI_PORT']}/json/")
    assert [w["state"] for w in master["workers"]].count("ALIVE") == 1, master


def _records_read(cp: Checkpoint, batch: int) -> int:
    """How many records of its topic the query of ``cp`` had read once ``batch`` ended."""
    offsets = parse_offsets(cp.entry(batch, 0)) or {}
    return sum(o for partitions in offsets.values() for o in partitions.values())


def _lose_w1_in(fleet: Fleet, run_url: str, task: str, checkpoint: str, past: int) -> datetime:
    """Once ``task`` of the run runs on w1 and has committed a batch after ``past`` to
    ``checkpoint``: w2 takes the shared queue and w1 is killed with its whole session (a host
    lost), ``task`` still running. Returns when."""
    _until(
        f"w1's {task} committed no batch",
        lambda: (
            fleet.tasks(run_url)[task]["state"] == "running"
            and (load_checkpoint(checkpoint).last_committed_batch or -1) > past
        ),
        600,
        fleet.output,
    )
    fleet.only("w2")  # the next task's host (w1 still takes its own queue only)
    assert fleet.tasks(run_url)[task]["state"] == "running", f"w1's {task} ended first"
    killed = datetime.now().astimezone()
    _kill_session(int((fleet.run / "worker-w1.pid").read_text()))
    return killed


def test_a_backfill_whose_worker_is_lost_in_the_reprocessing_finishes_on_the_other(fleet, spark):
    """A backfill triggered and approved over REST, planned and rolled back on w1; w1 is
    killed (its whole session, as a host lost) while the reprocessing writes batches. Seen
    from a third host, the lease names w1's driver until it expires, then the status says the
    lease expired and the backfill did not reprocess; the scheduler retries the reprocessing on
    w2, which takes the lease over and finishes the backfill: the state is exact. Then a new,
    empty host takes w1's place (`scripts/fleet.sh worker w1`). Skipped where the workers
    are not hosts of their own: w2 would see the dead driver's PID and take over at once."""
    fleet.require_isolated()
    fleet.edit({"approval": "required"}, lease_seconds=LEASE_SECONDS)  # unset: none asked
    checkpoint = fleet.query().checkpoint
    cp = load_checkpoint(checkpoint)
    last = cp.last_committed_batch
    # far enough back that the reprocessing runs a dozen batches (250 records each)
    to_batch = max(b for b in cp.commits if _records_read(cp, last) - _records_read(cp, b) >= 3000)
    fleet.only("w1")
    conf = {"query": QUERY, "to_batch": to_batch, "dry_run": False}
    run_url = fleet.trigger("stream_backfill", conf)
    asked = fleet.approve(run_url, "approve")
    said = f"Approve the backfill of {QUERY}: roll it back to batch {to_batch} and reprocess"
    assert asked["subject"].startswith(said), asked
    killed = _lose_w1_in(fleet, run_url, "reprocess", checkpoint, past=to_batch)

    # Seen from a third host, the dead driver's lease holds until it expires: nothing on
    # another host can tell a lost holder from a slow one.
    run_id = run_url.rsplit("/", 1)[1]
    dead = fleet.lock()
    assert (dead["lock"]["operation"], dead["lock"]["run_id"]) == ("run", run_id), dead
    assert "@w1:" in dead["lock"]["owner"] and dead["state"] == "held", dead
    assert fleet.status()["unfinished_backfill"] is None  # its reprocessing holds the query
    _until("the dead run's lease did not expire", lambda: fleet.lock()["state"] == "expired",
           LEASE_SECONDS + 30, fleet.output)  # fmt: skip
    shown = fleet.status()
    reasons = shown["health"]["reasons"]
    assert any(f"run (run id {run_id}) left the lock expired" in r for r in reasons), reasons
    said = f"backfill run {run_id} did not finish (rolled back)"
    assert (shown["unfinished_backfill"] or "").startswith(said), shown
    state, tasks = fleet.finished(run_url)
    assert state == "success", {t: i["state"] for t, i in tasks.items()}
    reprocess = tasks["reprocess"]
    assert (reprocess["hostname"], tasks["rollback"]["hostname"]) == ("w2", "w1"), tasks
    assert reprocess["try_number"] >= 2, reprocess
    fleet.figures["w1 lost in a backfill: the kill to the retry's start on w2"] = _seconds(
        killed.isoformat(), reprocess["start_date"]
    )
    fleet.figures["w1 lost in a backfill: the kill to the backfill's end"] = _seconds(
        killed.isoformat(), tasks["validate_state"]["end_date"]
    )
    assert assert_exact(fleet, spark, (TOPIC, NEW_TOPIC)) >= last
    assert fleet.lock()["state"] is None, "the retry did not release the lease it took over"
    assert fleet.status()["unfinished_backfill"] is None
    audit = [r for r in read_audit(checkpoint) if r["operation"] == "backfill"]
    assert [r["result"] for r in audit[-2:]] == ["rolled back", "succeeded"], audit

    _back(fleet, "w1")


def test_a_migration_whose_worker_is_lost_in_its_drain_is_rolled_back_on_the_other(fleet, spark):
    """A migration (to a third topic) approved over REST on w1; w1 is killed while the drain
    step's driver reads the query's topic. The step fails for good (a migration's steps do not
    retry), and ``roll_back`` runs on w2: it waits until the dead driver's lease expires,
    then releases the migration's hold. The query stays on its checkpoint and topic, and the
    next run, on w2, goes on from what the drain committed, on its first try (the roll back's
    release did not make the dead drain's lock look alive again): the state is exact.
    Skipped where the workers are not hosts of their own: the roll back would see the dead
    driver's PID and wait for nothing, and the first try would prove nothing."""
    fleet.require_isolated()
    third = "page-visits-v3"
    fleet.produce(round_=12, topic=third)  # the new source exists and has records
    for round_ in (13, 14, 15):  # the drain has batches to run: it is killed in them
        fleet.produce(round_=round_)
    query = fleet.query()
    before = load_checkpoint(query.checkpoint).last_committed_batch
    fleet.only("w1")
    run_url = fleet.trigger("stream_source_migration", migration_to(third))
    run_id = run_url.rsplit("/", 1)[1]
    fleet.approve(run_url, "approve_stop")
    killed = _lose_w1_in(fleet, run_url, "drain", query.checkpoint, past=before)  # roll_back: w2
    # The dead drain's lock stays in the lease (its host is gone: nobody sees its process
    # end, and the migration's hold keeps every other taker out) until the roll back: the
    # object the roll back's release writes, which must not make that lock alive again.
    left = fleet.lock()["lock"]
    assert left is not None and left["run_id"] == run_id, left
    # Seen from a third host meanwhile: the migration holds the query.
    reasons = fleet.status()["health"]["reasons"]
    held = f"migration (run id {run_id}) holds the query"
    assert any(held in r for r in reasons), reasons

    state, tasks = fleet.finished(run_url)
    assert state == "failed", {t: i["state"] for t, i in tasks.items()}
    assert (tasks["drain"]["state"], tasks["drain"]["hostname"]) == ("failed", "w1"), tasks
    assert tasks["drain"]["try_number"] == 1, tasks["drain"]  # no retry: roll_back instead
    undo = tasks["roll_back"]
    assert (undo["state"], undo["hostname"]) == ("success", "w2"), undo
    # It found the dead drain's lock, alive (it waited for it to expire) or expired by then
    # (Airflow's heartbeat timeout and the lease are both 60 s here): either way the lock
    # was still in the lease it wrote when it released the hold.
    said = _task_log(fleet, run_id, "roll_back")
    waited = f"{QUERY}: stopping run {run_id}" in said and f"run {run_id} stopped" in said
    assert waited or f"{QUERY}: not running" in said, said
    assert tasks["approve_switch"]["state"] in ("upstream_failed", "skipped"), tasks
    fleet.figures["w1 lost in a migration's drain: the kill to its roll back's end"] = _seconds(
        killed.isoformat(), undo["end_date"]
    )
    after = fleet.query()  # nothing switched: the same checkpoint and topic, no hold, no lock
    assert (after.checkpoint, after.source.subscribed) == (query.checkpoint, [NEW_TOPIC]), after
    reasons = fleet.status()["health"]["reasons"]
    assert not [r for r in reasons if run_id in r], reasons
    audit = [r for r in read_audit(query.checkpoint) if r.get("run_id") == run_id]
    assert audit[-1]["result"] == "rolled back", audit

    run_url = fleet.trigger("stream_start")
    state, tasks = fleet.finished(run_url, "stream_start, after a migration rolled back (w2)")
    run = tasks[f"run_{QUERY}"]
    assert state == "success" and run["hostname"] == "w2", tasks
    # at once: the roll back's release of its hold did not make the dead drain's lock look alive
    assert run["try_number"] == 1, run
    assert assert_exact(fleet, spark, (TOPIC, NEW_TOPIC)) > before
    _back(fleet, "w1")


def test_redis_restarted_in_a_run_the_run_goes_on(fleet, spark):
    """The broker restarted (`scripts/fleet.sh redis`) while a run's task runs on w1: the
    workers reconnect, the run's next task goes through the new broker, and the run succeeds
    with the state exact."""
    run_url, before = _writing_on_w1(fleet, rounds=(16, 17))
    assert fleet.tasks(run_url)[f"run_{QUERY}"]["state"] == "running", "the run ended first"
    restarted = fleet.script("redis")
    assert restarted.returncode == 0 and "Redis restarted" in restarted.stdout, restarted.stderr
    # Reconnected, a worker consumes the queues it started with but those remote control
    # cancelled once (cancel_consumer deselects them; add_consumer does not select them
    # again): neither takes the shared queue now. Steered again, as an operator would.
    fleet.only("w1")
    state, tasks = fleet.finished(run_url, "stream_start, Redis restarted in it (w1)")
    assert state == "success", tasks
    assert {t["hostname"] for t in tasks.values()} == {"w1"}, tasks  # record_ came after it
    assert assert_exact(fleet, spark, (TOPIC, NEW_TOPIC)) > before
    fleet.only("w2")  # both workers take orders through the new broker


def test_a_code_upgrade_approved_over_rest_rewrites_on_w1_and_w2_runs_the_new_code(fleet, spark):
    """The query's new code (views per user and page: a wider key, which Spark cannot keep
    state for) deployed in the registry; stream_code_upgrade triggered and approved twice over
    REST rewrites the state on w1 into a new checkpoint and switches; the next run, on w2,
    runs the new code there: each (user, page) count it emits is that pair's records in every
    topic the query has read, the old code's state carried over whole."""
    old = fleet.query()
    planned = str(default_checkpoint(old))  # the first free name: taken once it is written
    fleet.edit(PER_PAGE)
    fleet.only("w1")
    run_url = fleet.trigger("stream_code_upgrade", {"query": QUERY, "dry_run": False})
    asked = fleet.approve(run_url, "approve_stop")
    assert asked["subject"].startswith(f"Approve the upgrade of {QUERY}: stop it"), asked
    fleet.approve(run_url, "approve_switch")
    state, tasks = fleet.finished(run_url, "code upgrade, with its two approvals (w1)")
    assert state == "success", {t: i["state"] for t, i in tasks.items()}
    assert {i["hostname"] for i in tasks.values() if i["state"] == "success"} == {"w1"}, tasks
    new = fleet.query()  # read by this host from the switch in the control store
    assert new.checkpoint == planned and new.logic != old.logic, new

    fleet.produce(round_=18)
    fleet.only("w2")
    run_url = fleet.trigger("stream_start")
    state, tasks = fleet.finished(run_url, "stream_start, after the upgrade (w2)")
    assert state == "success" and {t["hostname"] for t in tasks.values()} == {"w2"}, tasks
    cp = load_checkpoint(new.checkpoint)
    committed = parse_offsets(cp.entry(cp.last_committed_batch, 0))
    assert committed == {NEW_TOPIC: _ends(NEW_TOPIC)}, committed
    views = {}  # (user, page) -> views, from the new code's rows (3 columns), the last wins
    for _, rows in sorted(read_sink(location(new.sink.path)).items()):
        views |= {(row[0], row[1]): row[2] for row in rows if len(row) == 3}
    records = collections.Counter((e["user_id"], e["page"]) for e in _events((TOPIC, NEW_TOPIC)))
    assert views and {pair: records[pair] for pair in views} == views
    # Every pair, not only those the new code emitted: the old state carried over whole.
    assert state_values(spark, new.checkpoint, "views") == dict(records)


def test_make_fleet_stop_stops_everything(fleet):
    sessions = {fleet.proc.pid, *(int(p.read_text()) for p in fleet.run.glob("*.pid"))}
    started = time.monotonic()
    stopped = fleet.script("stop")
    fleet.figures["make fleet-stop"] = round(time.monotonic() - started, 1)
    assert stopped.returncode == 0 and "stopped" in stopped.stdout, stopped.stderr
    assert fleet.proc.wait(timeout=60) == 0, fleet.output()[-3000:]
    deadline = time.time() + 30
    while (left := _alive(sessions)) and time.time() < deadline:
        time.sleep(2)
    assert not left, f"processes left after make fleet-stop: {left}"
    assert not list(fleet.run.glob("*.pid")), "pid files left"
