"""Spark itself on S3 (issue 43): every Spark job on a checkpoint in S3, Spark writing
``s3a://`` to the embedded endpoint (SeaweedFS), leaves the state and output the same job
leaves on a local checkpoint of the same query and input.

One module fixture (:func:`world`) builds two registries of the same queries on the same
landed input: one with local checkpoints and sinks, one with the checkpoints in S3 (and one
sink in S3 too). The shapes: a processor (transformWithStateInPandas, RocksDB), an
aggregation on the HDFS-backed store and a stream-stream join on RocksDB. Both go through the
same chain of jobs, in-process in the shared session (the one spark-submit proof is the last
test): run available-now, export (the S3 side's into S3), ``verify --data`` (Great
Expectations), a continuous run stopped gracefully, a repartition, a backfill's rollback and
reprocessing, a bootstrap from the export (the S3 side's read from S3). After each step,
each test compares the two sides through Spark's own readers: the state (``statestore``,
through :func:`stateops.spark.streaming.checkpoint_url`) and the sinks, and asserts there is
something to compare.
"""

from __future__ import annotations

import json
import re
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import yaml

from stateops.control.lock import live_lock, new_run_id
from stateops.control.markers import request_stop
from stateops.control.target import query_target
from stateops.core.checkpoint import load_checkpoint
from stateops.core.registry import load_registry
from stateops.core.storage import S3Path, copy_to_local, list_files, location
from stateops.ops.backfill import plan_backfill, run_backfill
from stateops.ops.backup import backup_checkpoint
from stateops.ops.bootstrap import preflight_bootstrap, run_bootstrap
from stateops.ops.drill import begin_drill, finish_drill
from stateops.ops.repartition import run_repartition
from stateops.spark.streaming import checkpoint_url
from tests.conftest import S3A_BUCKET, spark_submit_run_query, whole_proof, write_registry
from tests.spark.harness import (
    in_session,
    job_in_session,
    job_runner,
    land,
    read_sink,
    run_in_session,
    shape_registry,
    state_checksums,
    summary_of,
)

pytestmark = pytest.mark.spark
NAME = "page_visits"
# A processor (transformWithStateInPandas on RocksDB, the gate's) and an aggregation on the
# HDFS-backed store (the whole proof's), through every job (:func:`world`); a stream-stream
# join on RocksDB through the jobs that differ by shape (:func:`join_world`, the whole proof).
QUERIES = ("page_visits", "page_counts")
JOIN = "views_near_events"
S3_SINK = "page_counts"  # its sink is in S3 too: the backfill's report reads it there
VALIDATED = (NAME,)  # Great Expectations costs about 15 s a query and side
REPARTITIONED = ("page_visits", JOIN)  # Spark repartitions RocksDB state only
SIDES = ("local", "s3")
quiet = lambda _: None  # noqa: E731


def sink_of(sink: str, scratch: Path) -> dict[int, list[tuple]]:
    """Output rows per batch, from a local sink or one in S3 (copied down first)."""
    where = location(sink)
    if isinstance(where, S3Path):
        local = scratch / f"sink-{time.monotonic_ns()}"
        for rel in list_files(where):
            (local / rel).parent.mkdir(parents=True, exist_ok=True)
            copy_to_local(where / rel, local / rel)
        return read_sink(local)
    return read_sink(Path(sink))


def snapshot(spark, registry: Path, scratch: Path, names: tuple[str, ...]) -> dict[str, tuple]:
    """name -> (last committed batch, state, output) of each query."""
    reg = load_registry(registry)
    out = {}
    for name in names:
        query = reg.query(name)
        out[name] = (*state_checksums(spark, query.checkpoint), sink_of(query.sink.path, scratch))
    return out


def assert_same(step: dict, names: tuple[str, ...]) -> None:
    """Both sides of ``step`` equal, and each query left state and output to compare."""
    if "error" in step:
        pytest.fail(step["error"])
    local, s3 = step["local"], step["s3"]
    for name in names:
        assert s3[name] == local[name], name
        batch, state, output = local[name]
        assert batch is not None and state and any(state.values()), (name, state)
        assert any(output.values()), (name, "no output")


def comparable(validation: dict) -> dict:
    """A validation's result but where it was written."""
    return {
        k: v for k, v in validation.items() if k not in ("checkpoint", "data_docs", "results_file")
    }


def continuous(spark, registry: Path, name: str, until_batch: int) -> dict:
    """``run_query.py --mode continuous`` in the shared session, stopped by a stop marker
    (``stateops stop``) once batch ``until_batch`` is committed: its summary."""
    reg = load_registry(registry)
    commit = location(reg.query(name).checkpoint) / "commits" / str(until_batch)
    ran: dict = {}

    def run() -> None:
        ran["result"] = job_in_session(
            spark, "run_query.py", "--registry", str(registry), "--query", name,
            "--mode", "continuous", "--poll-seconds", "0.2",
        )  # fmt: skip

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 180
    while not commit.exists() and thread.is_alive() and time.monotonic() < deadline:
        time.sleep(0.3)
    held = live_lock(reg.lock_path(name))
    if held is not None:  # else the run ended by itself: its summary says why
        request_stop(reg, name, held)
    thread.join(120)
    assert not thread.is_alive(), f"{name}: the continuous run did not stop"
    return summary_of(*ran["result"])


class World:
    """Both sides' registries and what each step left on them."""

    def __init__(
        self,
        root: Path,
        queries: tuple[str, ...],
        registries: dict[str, Path],
        exports: dict[str, str],
    ) -> None:
        self.root = root
        self.queries = queries
        self.registries = registries
        self.exports = exports  # where each side's export step writes, by side
        self.steps: dict[str, dict] = {}

    def step(self, name: str, each: Callable[[str, Path], object], after: Callable) -> None:
        """Run ``each(side, registry)`` on both sides, then record ``after(side, registry)``
        of each; a failure is recorded for the step's test to fail with (the next steps go on
        from what is there)."""
        started = time.monotonic()
        try:
            done = {side: each(side, reg) for side, reg in self.registries.items()}
            self.steps[name] = {side: after(side, reg) for side, reg in self.registries.items()} | {
                "done": done
            }
        except Exception as err:  # noqa: BLE001 - the step's test fails with it
            # Spark's error from the JVM: its causes too (a state reader's message hides them)
            causes = re.findall(r"^Caused by: .*$", getattr(err, "_stackTrace", "") or "", re.M)
            told = traceback.format_exc()
            if len(told) > 6000:  # the tail: where it failed
                told = f"{told[:1000]}\n[...]\n{told[-3000:]}"
            # The error's own message first and whole enough to read: a chained Spark error's
            # traceback is long, and its middle, where the message was, got cut (seen: a
            # repartition of a join on S3 that failed once in the whole proof of 0bab7d2).
            said = str(err)
            said = said if len(said) <= 4000 else f"{said[:4000]} [...]"
            self.steps[name] = {"error": f"{said}\n\n{told}" + "\n".join(causes)}
        self.steps[name]["seconds"] = round(time.monotonic() - started, 1)
        print(f"STEP {name}: {self.steps[name]['seconds']} s", flush=True)


def _world(spark, s3a, tmp_path_factory, queries: tuple[str, ...]) -> Iterator[World]:
    with pytest.MonkeyPatch.context() as mp:
        s3a.set_env(mp)
        root = tmp_path_factory.mktemp("spark-on-s3")
        mp.setenv("STATEOPS_GX_HOME", str(root / "gx"))  # GX's project for S3 checkpoints
        yield build_world(spark, s3a, root, queries)


@pytest.fixture(scope="module")
def world(spark, s3a, tmp_path_factory, request) -> Iterator[World]:
    """Every job on both sides: the processor in the gate, the aggregation too (its sink in
    S3: the backfill) in the whole proof."""
    queries = QUERIES if whole_proof(request.config) else (NAME,)
    yield from _world(spark, s3a, tmp_path_factory, queries)


@pytest.fixture(scope="module")
def join_world(spark, s3a, tmp_path_factory) -> Iterator[World]:
    yield from _world(spark, s3a, tmp_path_factory, (JOIN,))


def build_world(spark, s3a, root: Path, queries: tuple[str, ...]) -> World:
    """Each job on both sides, those that name page_visits (the drill, ``verify --data``, the
    continuous run, the bootstrap) or its S3 sink (the backfill) where ``queries`` hold it."""
    landing = root / "landing"
    registries = {}
    for side in SIDES:
        path = shape_registry(root / side, landing=landing)
        raw = yaml.safe_load(path.read_text())
        raw["queries"] = {n: raw["queries"][n] for n in queries}
        for entry in raw["queries"].values():
            entry["trigger"] = {"processing_time": "1 second"}
        if side == "s3":
            prefix = s3a.url(root.name)
            for name, entry in raw["queries"].items():
                entry["checkpoint"] = f"{prefix}/checkpoints/{name}"
            if S3_SINK in queries:  # as Spark names it: the registry takes the sink as given
                raw["queries"][S3_SINK]["sink"]["path"] = f"s3a{prefix[2:]}/output/{S3_SINK}"
        raw["backups"] = {"url": s3a.url(f"{root.name}/backups-{side}")}
        path.write_text(yaml.safe_dump(raw, sort_keys=False))
        registries[side] = path
    exports = {"local": str(root / "exports"), "s3": f"{s3a.url(root.name)}/exports"}
    world = World(root, queries, registries, exports)
    scratch = root / "scratch"
    scratch.mkdir()
    snap = lambda side, reg: snapshot(spark, reg, scratch, queries)  # noqa: E731

    land(landing, round_=0, files=2)
    world.step(
        "run",
        lambda side, reg: [
            run_in_session(spark, reg, n, "--mode", "available-now") for n in queries
        ],
        snap,
    )

    def export(side, reg):
        out = {}
        for name in queries:
            code, stdout = job_in_session(
                spark, "export_state.py", "--registry", str(reg), "--checkpoint", name,
                "--out", f"{exports[side]}/{name}",
            )  # fmt: skip
            out[name] = summary_of(code, stdout)
        return out

    world.step("export", export, lambda side, reg: None)

    def validate(side, reg):
        out = {}
        for name in VALIDATED:
            code, stdout = job_in_session(
                spark, "validate_state.py", "--registry", str(reg), "--query", name, "--json"
            )
            result = json.loads(stdout.strip().splitlines()[-1])
            out[name] = (code, result)
        return out

    if NAME in queries:
        world.step("verify-data", validate, lambda side, reg: None)

    def drill(side, reg):
        # A restore drill: the scratch place beside the checkpoint (in S3 on that side), the
        # export job reading it as the DAG's read task does, the record beside the backup.
        target, client = query_target(reg, NAME), s3a.client()
        backup_checkpoint(target.checkpoint, target.backup_location(), client, log=quiet)
        plan = begin_drill(target, client, log=quiet)
        code, stdout = job_in_session(
            spark, "export_state.py", "--registry", str(reg), "--checkpoint", plan["checkpoint"],
            "--out", plan["state"], "--batch", str(plan["batch_id"]),
        )  # fmt: skip
        record = finish_drill(plan, client, failed=None if code == 0 else stdout[-500:], log=quiet)
        return record["state"], location(plan["scratch"]).exists()

    if NAME in queries:
        world.step("drill", drill, lambda side, reg: None)
        land(landing, round_=1, files=2)
        world.step(
            "continuous",
            lambda side, reg: continuous(spark, reg, NAME, until_batch=3),
            lambda side, reg: snapshot(spark, reg, scratch, names=(NAME,)),
        )
    repartitioned = tuple(name for name in REPARTITIONED if name in queries)

    def repartition(side, reg):
        return {
            name: run_repartition(
                query_target(reg, name), 3, run_id=new_run_id("repartition"), log=quiet,
                submit=in_session(spark, reg),
            )["proof"]["ok"]
            for name in repartitioned
        }  # fmt: skip

    world.step(
        "repartition",
        repartition,
        lambda side, reg: snapshot(spark, reg, scratch, repartitioned),
    )

    def backfill(side, reg):
        out = {}
        for name in (S3_SINK,):  # its sink in S3: the rollback moves it, the report reads it
            target = query_target(reg, name)
            last = load_checkpoint(target.checkpoint).last_committed_batch
            run_id = new_run_id("backfill")
            # two batches back: the last one may be a no-data batch with empty output
            plan = plan_backfill(target, run_id, to_batch=last - 2, dry_run=False, log=quiet)
            done = run_backfill(
                target, plan, run_id=run_id, backup=None, run_job=job_runner(spark), log=quiet
            )
            out[name] = {k: v for k, v in done["report"].items() if k != "examples"}
        return out

    if S3_SINK in queries:
        world.step(
            "backfill", backfill, lambda side, reg: snapshot(spark, reg, scratch, (S3_SINK,))
        )

    def bootstrap(side, reg):
        # page_visits into a new checkpoint on each side, from that side's export (the S3
        # side's read from S3, as a bootstrap on another host than the export's reads it). It
        # reads the same sources, so it goes on from the exported batch's positions: a run
        # over the input that batch had not read.
        raw = yaml.safe_load(reg.read_text())
        entry = raw["queries"][NAME]
        entry["checkpoint"] = entry["checkpoint"] + "-bootstrapped"
        entry["sink"]["path"] = str(root / side / "output" / "bootstrapped")
        reg.write_text(yaml.safe_dump(raw, sort_keys=False))
        target, plan = preflight_bootstrap(
            str(reg), NAME, f"{exports[side]}/{NAME}", None, "auto", False
        )
        return run_bootstrap(target, plan, run_id=new_run_id("bootstrap"), log=quiet)["status"]

    if NAME in queries:
        world.step("bootstrap", bootstrap, lambda side, reg: snapshot(spark, reg, scratch, (NAME,)))
    return world


def steps_done(world: World, name: str) -> dict:
    step = world.steps[name]
    if "error" in step:
        pytest.fail(f"{name} ({step['seconds']} s):\n{step['error']}")
    return step


def test_run_available_now_on_s3_equals_local(world):
    assert_same(world.steps["run"], world.queries)


def test_export_of_an_s3_checkpoint_equals_the_local_export(world):
    assert_exports_equal(world)


def assert_exports_equal(world: World) -> None:
    step = steps_done(world, "export")
    for name in world.queries:  # each checkpoint has its own query id: the rest is equal
        local, s3 = (
            {k: v for k, v in step["done"][side][name].items() if k != "query_id"} for side in SIDES
        )
        assert s3 == local and any(e["rows"] for e in local["entries"]), name
        manifest = location(world.exports["s3"]) / name / "manifest.json"  # the export in S3
        entries = json.loads(manifest.read_text())["entries"]
        assert [{k: e[k] for k in local["entries"][0]} for e in entries] == local["entries"]


def test_a_restore_drill_of_an_s3_checkpoint_reads_the_state_a_local_one_does(world):
    """A backup of each side restored into a scratch place beside its checkpoint (on S3: an
    S3 prefix), read by the export job: the same rows and checksums per store as the local
    side's drill and as the export of the checkpoint itself; no scratch place is left."""
    step = steps_done(world, "drill")
    exported = steps_done(world, "export")["done"]["local"][NAME]["entries"]
    assert (
        step["done"]["s3"]
        == step["done"]["local"]
        == (
            {
                f"operator {e['operator_id']} {e['variable']}": {
                    k: e[k] for k in ("rows", "checksum")
                }
                for e in exported
            },
            False,
        )
    )


def test_verify_data_reads_the_state_from_s3_as_from_local(world):
    step = steps_done(world, "verify-data")
    for name in VALIDATED:
        (code, local), (s3_code, s3) = step["done"]["local"][name], step["done"]["s3"][name]
        assert code == s3_code == 0, (local, s3)
        assert s3["checkpoint"].startswith("s3://") and s3["results_file"].startswith("s3://")
        assert comparable(s3) == comparable(local) and local["variables"], name
        assert Path(local["data_docs"]).is_file(), local["data_docs"]  # beside the checkpoint
        assert s3["data_docs"].startswith("s3://") and location(s3["data_docs"]).exists(), s3


def test_the_data_docs_of_an_s3_checkpoint_list_every_host_s_validations(
    spark, world, monkeypatch, tmp_path
):
    """A validation on another host (its own, empty, local GX folder) builds the Data Docs in
    S3 over the project the world's validation published: its index lists both runs."""
    first = steps_done(world, "verify-data")["done"]["s3"][NAME][1]
    docs = location(first["data_docs"])
    results = docs.parent.parent.parent / "validations"  # GX's uncommitted/validations

    def runs() -> set[str]:  # the run times of the validation results kept there
        keys = [k.split("/__none__/") for k in list_files(results)]
        return {key[1].split("/")[0] for key in keys if len(key) == 2}

    before = runs()
    raw = yaml.safe_load(world.registries["s3"].read_text())
    raw["queries"][NAME]["checkpoint"] = first["checkpoint"]  # the one the world validated
    registry = world.registries["s3"].with_name("validate-again.yaml")
    registry.write_text(yaml.safe_dump(raw, sort_keys=False))
    monkeypatch.setenv("STATEOPS_GX_HOME", str(tmp_path / "another-host"))
    code, out = job_in_session(
        spark, "validate_state.py", "--registry", str(registry), "--query", NAME, "--json"
    )
    assert code == 0, out[-3000:]
    assert json.loads(out.strip().splitlines()[-1])["data_docs"] == first["data_docs"]
    after, index = runs(), docs.read_text()
    assert before and before < after and all(run in index for run in after), (before, after)

    # The Streaming state view serves them from S3, inside their own prefix only.
    from fastapi import HTTPException

    from stateops_airflow.ui import data_docs

    monkeypatch.setenv("STATEOPS_REGISTRY", str(registry))
    assert data_docs(NAME, "index.html").body == docs.read_bytes()
    assert (results / ".ge_store_backend_id").exists()  # outside the docs: never served
    for outside in ("../../validations/.ge_store_backend_id", "no-such-page.html"):
        with pytest.raises(HTTPException, match="no such Data Docs file"):
            data_docs(NAME, outside)


def test_a_continuous_run_on_s3_stops_gracefully_as_locally(world):
    step = steps_done(world, "continuous")
    assert_same(step, names=(NAME,))
    for side in SIDES:
        assert step["done"][side]["status"] == "succeeded", step["done"][side]


def test_repartition_on_s3_equals_local(world):
    assert_repartitioned_alike(world)


def assert_repartitioned_alike(world: World) -> None:
    repartitioned = tuple(name for name in REPARTITIONED if name in world.queries)
    step = steps_done(world, "repartition")
    assert step["done"]["s3"] == step["done"]["local"] == dict.fromkeys(repartitioned, True)
    assert_same(step, repartitioned)
    for name in repartitioned:  # the new count is in the state's partitions
        before = world.steps["continuous" if name == NAME else "run"]["s3"][name][0]
        assert step["s3"][name][0] == before + 1, name  # Spark's repartition batch


@pytest.mark.whole  # its sink in S3 is the aggregation's
def test_a_backfill_on_s3_reprocesses_and_reports_as_locally(world):
    step = steps_done(world, "backfill")
    assert step["done"]["s3"] == step["done"]["local"]
    report = step["done"]["s3"][S3_SINK]
    # The rolled-back batch's output was moved aside in S3 and read there; the reprocessing
    # also reads the input landed for the continuous run since.
    assert report["rows_before"] and report["batches_before"], report
    assert_same(step, (S3_SINK,))


def test_a_bootstrap_into_an_s3_checkpoint_equals_local(world):
    step = steps_done(world, "bootstrap")
    assert step["done"]["s3"] == step["done"]["local"] == "succeeded"
    assert_same(step, names=(NAME,))


@pytest.mark.whole
def test_a_join_runs_exports_and_repartitions_on_s3_as_locally(join_world):
    """The stream-stream join's shape through the jobs whose work differs by shape."""
    assert_same(join_world.steps["run"], join_world.queries)
    assert_exports_equal(join_world)
    assert_repartitioned_alike(join_world)


def test_spark_submit_runs_a_query_on_an_s3_checkpoint(s3a_env, tmp_path):
    url = s3a_env.url(f"{tmp_path.name}/{NAME}")
    registry = write_registry(tmp_path, **{NAME: {"checkpoint": url}})
    land(tmp_path / "landing", round_=0, files=2)
    proc = spark_submit_run_query(registry, NAME, "--mode", "available-now")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert load_checkpoint(url).last_committed_batch == 1  # a batch per landed file


def test_spark_writes_an_s3_checkpoint_with_the_project_s_file_manager_only(spark):
    """S3 has no rename: an s3a:// checkpoint gets the project's file manager (one PUT a
    file, conditional for the logs: tests/spark/test_s3_guard.py); a local one Spark's default
    (the project's refuses a file system without conditional create)."""
    from stateops.spark.streaming import CHECKPOINT_FILE_MANAGER, S3_FILE_MANAGER

    assert checkpoint_url(spark, "s3://bucket/q") == "s3a://bucket/q"
    assert spark.conf.get(CHECKPOINT_FILE_MANAGER) == S3_FILE_MANAGER
    assert spark.conf.get("fs.s3a.endpoint.region")  # the S3 settings came with it
    assert checkpoint_url(spark, "/tmp/q") == "/tmp/q"
    assert spark.conf.get(CHECKPOINT_FILE_MANAGER, None) is None


def test_a_session_reads_s3_with_the_classic_stream_and_sees_files_rewritten_in_place(
    spark, s3a_env, tmp_path
):
    """Our operations rewrite checkpoint files in place (a restore, a rollback, a batch run
    again) while a session that read them lives on: each read sees the object as it now is,
    longer or shorter, through Spark's own reader and through a plain ``FileSystem.open`` (how
    Spark reads a checkpoint's logs and state metadata), S3A's classic stream
    (:func:`stateops.core.s3.spark_s3_conf` says why not Hadoop 3.5's default)."""
    key = f"{tmp_path.name}/rewritten/0"
    url = checkpoint_url(spark, s3a_env.url(key))
    jvm = spark._jvm
    path = jvm.org.apache.hadoop.fs.Path(url)
    fs = path.getFileSystem(spark._jsparkSession.sessionState().newHadoopConf())
    client = s3a_env.client()
    for version in ["v1 " + "x" * 5000, "v2 shorter", "v3 " + "y" * 20000, "v4"]:
        client.put_object(Bucket=S3A_BUCKET, Key=key, Body=f"{version}\n".encode())
        stream = fs.open(path)
        try:
            assert stream.getWrappedStream().getClass().getSimpleName() == "S3AInputStream"
            assert bytes(jvm.org.apache.commons.io.IOUtils.toByteArray(stream)) == (
                f"{version}\n".encode()
            )
        finally:
            stream.close()
        assert [row.value for row in spark.read.text(url).collect()] == [version]
