"""Spark-side test harness: queries under test, landing files, sinks and state, read back."""

from __future__ import annotations

import contextlib
import copy
import fcntl
import functools
import hashlib
import importlib.util
import io
import json
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType

import pyarrow.parquet as pq
import yaml

from stateops.core.checkpoint import load_checkpoint
from stateops.core.errors import StateOpsError
from stateops.core.files import relocate_checkpoint
from stateops.core.registry import PROVIDER_CLASSES, Query, load_registry
from stateops.core.storage import S3Path, list_files, location
from stateops.dev.sampledata import DATASETS, generate_events
from stateops.ops.carry import write_checkpoint_file
from stateops.ops.start import is_transient
from stateops.spark.jobs import job_path, quiesce
from stateops.spark.streaming import (
    CHECKPOINT_FILE_MANAGER,
    apply_query_conf,
    checkpoint_url,
    query_frame,
    start_query,
    write_batch,
)
from tests.conftest import TEST_SPARK_CONF, TEST_STATE_STORE, tree_digest, write_registry

_mtime = [1_700_000_000]


def land(landing_root: Path, round_: int, files: int) -> None:
    """Sample events for round ``round_``, with strictly increasing mtimes (file order)."""
    written = generate_events(
        {name: landing_root / name for name in DATASETS},
        events_per_file=40,
        users=12,
        files=files,
        round_=round_,
    )
    for paths in written.values():
        for p in paths:
            _mtime[0] += 10
            os.utime(p, (_mtime[0], _mtime[0]))


def read_sink(path: Path | S3Path) -> dict[int, list[tuple]]:
    """Per-batch output rows, sorted, from a ``batch_id=N`` sink folder, local or in S3."""
    out: dict[int, list[tuple]] = {}
    if not path.exists():
        return out
    for rel in list_files(path):
        folder, _, name = rel.partition("/")
        if not folder.startswith("batch_id=") or "/" in name:
            continue
        rows = out.setdefault(int(folder.split("=")[1]), [])
        if name.endswith(".parquet"):
            table = pq.read_table(io.BytesIO((path / rel).read_bytes()))
            rows += [tuple(r.values()) for r in table.to_pylist()]
    return {batch: sorted(rows, key=repr) for batch, rows in out.items()}


def read_state(spark, checkpoint: str | Path, reads: list[dict[str, str]]) -> list[list[str]]:
    """State rows per read (options of the ``statestore`` reader), sorted, as strings; a
    checkpoint in S3 read as Spark names it (``s3a://``: checkpoint_url)."""
    url = checkpoint_url(spark, checkpoint)
    result = []
    for options in reads:
        df = spark.read.format("statestore").options(**options).load(url)
        result.append(sorted(repr(r) for r in df.collect()))
    quiesce(spark)
    return result


def state_checksums(spark, checkpoint: str) -> tuple[int | None, dict[str, tuple]]:
    """(the last committed batch, rows and checksum of every state variable or store at it)
    of a local or S3 checkpoint, as the library's reads name them, each read by Spark's
    ``statestore`` reader."""
    from stateops.spark.export import read_state_variable, state_checksum, state_reads

    batch = load_checkpoint(checkpoint).last_committed_batch
    state = {
        f"operator {read['operator_id']} {read['variable']}": state_checksum(
            read_state_variable(spark, checkpoint, batch, read)
        )
        for read in state_reads(spark, checkpoint, batch)
    }
    quiesce(spark)
    return batch, state


def digest(checkpoint: str | Path) -> dict[str, str]:
    """Every file with its sha256 (:func:`tests.conftest.tree_digest`), of a local folder or
    an S3 prefix (S3A's directory markers aside)."""
    root = location(checkpoint)
    if isinstance(root, Path):
        return tree_digest(root)
    return {rel: hashlib.sha256((root / rel).read_bytes()).hexdigest() for rel in list_files(root)}


@dataclass
class Case:
    """A stateful query under test and how to read its state back."""

    name: str
    provider: str
    landing: str  # landing subfolder (user_sessions or page_visits events)
    state_reads: list[dict[str, str]]
    start: Callable = field(repr=False)  # (spark, root, checkpoint, sink) -> StreamingQuery

    def run(self, spark, root: Path, checkpoint: Path, sink: Path) -> None:
        run_to_end(spark, lambda: self.start(spark, root, checkpoint, sink), self.name)


def run_to_end(spark, start: Callable, name: str, timeout: float = 240) -> list:
    """Start a query with ``start()`` and wait for its available-now run to end, once more
    after a transient failure of Spark's (as the library's runs do:
    stateops.ops.start.is_transient); Spark's progress of the run, the query stopped and its
    stores unloaded (:func:`quiesce`)."""
    progress: list = []
    for attempt in (1, 2):
        query = start()
        try:
            try:
                query.awaitTermination(timeout)
            except Exception:  # noqa: BLE001 - the query's failure, read below
                pass
            error = query.exception()
            progress += query.recentProgress
            if attempt == 1 and is_transient(error):
                continue
            assert error is None, error
            assert not query.isActive, f"{name} did not finish within {timeout} s"
            return progress
        finally:
            query.stop()
            quiesce(spark)
    raise AssertionError("unreachable")


def _builtin_conf(spark, provider: str) -> None:
    spark.conf.set("spark.sql.streaming.stateStore.providerClass", PROVIDER_CLASSES[provider])
    # Spark's default checkpoint file manager: an S3 test's abortable one, left in the shared
    # session, refuses these local checkpoints (CANNOT_LOAD_CHECKPOINT_FILE_MANAGER).
    spark.conf.unset(CHECKPOINT_FILE_MANAGER)
    # Format v1, whatever a registered query in format v2 (tests/spark/test_format_v2.py) left
    # in the shared session: the HDFS provider fails on v2, and the offsets log does not record
    # the format, so a v1 test would silently write v2.
    spark.conf.set("spark.sql.streaming.stateStore.checkpointFormatVersion", "1")
    spark.conf.set("spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled", "true")
    spark.conf.set("spark.sql.streaming.stateStore.minDeltasForSnapshot", "2")
    # The session's 2 partitions, whatever a registered query's shuffle_partitions (a
    # repartition's 3) left in the shared session: the checkpoint records the count.
    spark.conf.set("spark.sql.shuffle.partitions", "2")
    # Compact the file source's log every 3 entries, so restart sets cross a compaction.
    spark.conf.set("spark.sql.streaming.fileSource.log.compactInterval", "3")


def _per_batch_sink(writer, sink: Path):
    return writer.foreachBatch(
        lambda df, batch_id: df.write.mode("overwrite").parquet(f"{sink}/batch_id={batch_id}")
    )


def _visits_stream(spark, root: Path):
    return (
        spark.readStream.format("json")
        .schema("user_id STRING, page STRING, event_time TIMESTAMP")
        .option("maxFilesPerTrigger", 1)
        .load(str(root / "landing" / "page_visits"))
    )


def aggregation_case(provider: str) -> Case:
    def start(spark, root, checkpoint, sink):
        from pyspark.sql import functions as F

        _builtin_conf(spark, provider)
        df = (
            _visits_stream(spark, root)
            .groupBy("user_id")
            .agg(F.count("*").alias("visits"), F.max("event_time").alias("last_seen"))
        )
        writer = df.writeStream.outputMode("update").option("checkpointLocation", str(checkpoint))
        return _per_batch_sink(writer, sink).trigger(availableNow=True).start()

    return Case(f"aggregation-{provider}", provider, "page_visits", [{}], start)


def join_case(provider: str) -> Case:
    def start(spark, root, checkpoint, sink):
        from pyspark.sql import functions as F

        _builtin_conf(spark, provider)
        src = _visits_stream(spark, root)
        left = src.select(
            F.col("user_id").alias("l_user"), F.col("event_time").alias("l_time"), "page"
        ).withWatermark("l_time", "2 minutes")
        right = src.select(
            F.col("user_id").alias("r_user"),
            F.col("event_time").alias("r_time"),
            F.col("page").alias("r_page"),
        ).withWatermark("r_time", "2 minutes")
        joined = left.join(
            right,
            F.expr("l_user = r_user AND r_time BETWEEN l_time - interval 1 minute AND l_time"),
        )
        writer = joined.writeStream.outputMode("append").option(
            "checkpointLocation", str(checkpoint)
        )
        return _per_batch_sink(writer, sink).trigger(availableNow=True).start()

    return Case(
        f"join-{provider}",
        provider,
        "page_visits",
        [{"joinSide": "left"}, {"joinSide": "right"}],
        start,
    )


def registered_query(root: Path, name: str, checkpoint: Path, sink: Path, **entry) -> Query:
    query = load_registry(write_registry(root, **{name: entry})).query(name)
    return query.model_copy(
        update={
            "checkpoint": str(checkpoint),
            "sink": query.sink.model_copy(update={"path": str(sink)}),
        }
    )


def two_hosts(
    root: Path, name: str, *, source: str, checkpoint: str, sink: str, entry=None, **top
) -> tuple[Path, Path]:
    """Host A's and host B's registry files (``root/a``, ``root/b``), as two Airflow workers
    that share no disk: data folders of their own (locks, markers, run summaries), query
    ``name``'s ``source`` folder, ``checkpoint`` and ``sink`` where both see them, its
    ``entry`` changes and the registry's top-level ``top`` (the control store) on both."""
    files = []
    for host in ("a", "b"):
        path = write_registry(root / host)
        raw = yaml.safe_load(path.read_text())
        query = raw["queries"][name]
        query["source"]["path"] = str(source)
        query["checkpoint"] = str(checkpoint)
        query["sink"]["path"] = str(sink)
        query.update(entry or {})
        raw.update(top)
        path.write_text(yaml.safe_dump(raw, sort_keys=False))
        files.append(path)
    return files[0], files[1]


def _registered_conf(spark) -> None:
    """The built-in cases' setting stays in the shared session: a registered query runs with
    Spark's default, whichever case ran before (the query's own settings are set on start)."""
    spark.conf.unset("spark.sql.streaming.fileSource.log.compactInterval")


@functools.cache
def _job_module(job: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"job_{job[:-3]}", job_path(job))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def job_in_session(spark, job: str, *args: str) -> tuple[int, str]:
    """``spark-submit stateops/jobs/<job> ARGS`` without the JVM to start: the job's own ``main``
    in this process's shared session. Returns (exit code, stdout). For tests whose subject is
    what a job leaves (state, output, its summary); the jobs through spark-submit are proven
    by their own tests (test_run_query, test_bootstrap, ...) and by each DAG's run."""
    _registered_conf(spark)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):  # its job_main unloads the state stores at the end
        code = _job_module(job).main(list(args))
    return code, out.getvalue()


def job_runner(spark) -> Callable[[str, str, list[str]], None]:
    """``run_job(job, registry_file, args)`` for the library's one-process runs (backfill,
    migration), each Spark step's job in the shared session; raises when it fails."""

    def run_job(job: str, registry_file: str, args: list[str]) -> None:
        code, out = job_in_session(spark, job, "--registry", registry_file, *args)
        if code != 0:
            raise StateOpsError(f"{job} exited with code {code}: {out[-2000:]}")

    return run_job


def in_session(spark, registry: Path | str) -> Callable[[dict], None]:
    """``submit`` for :func:`stateops.ops.repartition.run_repartition`: the repartition job's
    main in the shared session, given the registry as every caller gives it (the CLI, the
    DAG's ``spark_job_operator``): the job takes the query's lease in it."""
    from stateops.core.steps import REPARTITION_STATE

    def submit(plan: dict) -> None:
        code, out = job_in_session(
            spark, REPARTITION_STATE, "--registry", str(registry),
            "--checkpoint", plan["checkpoint"], "--run-id", plan["run_id"],
        )  # fmt: skip
        assert code == 0, out[-3000:]

    return submit


def summary_of(code: int, stdout: str) -> dict:
    """The summary a job printed last, once it succeeded."""
    assert code == 0, stdout[-3000:]
    return json.loads(stdout.strip().splitlines()[-1])


def run_in_session(spark, registry: Path, name: str, *args: str) -> dict:
    """``run_query.py --registry REGISTRY --query NAME ARGS`` in the shared session: its summary."""
    return summary_of(
        *job_in_session(spark, "run_query.py", "--registry", str(registry), "--query", name, *args)
    )


PAGE_VISITS_READS = [{"stateVarName": "pages"}, {"stateVarName": "count"}]


def pipeline_case(name: str, state_reads: list[dict[str, str]]) -> Case:
    def start(spark, root, checkpoint, sink):
        query = registered_query(root, name, checkpoint, sink)
        _registered_conf(spark)
        apply_query_conf(spark, query)
        return start_query(spark, query, available_now=True)

    return Case(f"{name}-rocksdb", "rocksdb", name, state_reads, start)


# Checkpoint format v2, with what a retried task leaves: batch FAILS_ONCE fails once after its
# tasks uploaded their state (its output is written, its commit is not), so Spark runs it again
# and state version FAILS_ONCE + 1 has two files in each store, of which the commit names one.
V2_STATE_STORE = {**TEST_STATE_STORE, "checkpoint_format": 2}
FAILS_ONCE = 3


class InjectedFailure(RuntimeError):
    pass


def fail_once(spark, query: Query, batch: int, timeout: float = 240) -> None:
    """Run ``query`` available-now until its batch ``batch`` fails after writing its output
    (and its state): the batch is planned, not committed, as a crash would leave it."""

    def fails_once(df, batch_id):
        write_batch(df, batch_id, query)
        if batch_id == batch:
            raise InjectedFailure(f"batch {batch_id} fails once, after its state and output")

    failing = (
        query_frame(spark, query)
        .writeStream.outputMode(query.output_mode)
        .option("checkpointLocation", query.checkpoint)
        .foreachBatch(fails_once)
        .trigger(availableNow=True)
        .start()
    )
    try:
        failing.awaitTermination(timeout)
    except Exception as err:  # noqa: BLE001 - the query's failure, checked below
        assert f"batch {batch} fails once" in str(err), err
    else:
        raise AssertionError(f"batch {batch} was never run: too little input")
    finally:
        failing.stop()
        quiesce(spark)


def v2_case() -> Case:
    name = "page_visits"

    def start(spark, root, checkpoint, sink):
        query = registered_query(root, name, checkpoint, sink, state_store=V2_STATE_STORE)
        _registered_conf(spark)
        apply_query_conf(spark, query)
        if not checkpoint.exists():  # the first run: batch FAILS_ONCE fails once
            fail_once(spark, query, FAILS_ONCE)
        return start_query(spark, query, available_now=True)

    return Case("page_visits-v2", "rocksdb", name, PAGE_VISITS_READS, start)


ALL_CASES = [
    pipeline_case(
        "user_sessions",
        [{"stateVarName": "events"}, {"readRegisteredTimers": "true"}],
    ),
    pipeline_case("page_visits", PAGE_VISITS_READS),
    aggregation_case("hdfs"),
    aggregation_case("rocksdb"),
    join_case("hdfs"),
    join_case("rocksdb"),
]


def gate_cases(cases: list[Case], gate: set[str]) -> list:
    """``cases`` as pytest params named by the case: those named in ``gate`` in the landing
    gate too, the others (the rest of the matrix) in the whole proof only."""
    import pytest

    unknown = gate - {case.name for case in cases}
    assert not unknown, f"no such case: {unknown}"
    return [
        pytest.param(case, id=case.name, marks=() if case.name in gate else pytest.mark.whole)
        for case in cases
    ]


def state_and_output(spark, registry: Path, name: str) -> tuple:
    """(last committed batch, ``operator N NAME`` -> (kind, (rows, checksum)) for every store or
    state variable of every operator, output per batch) of registered query ``name``: what
    Spark's ``state-metadata`` names, each read here by Spark's ``statestore`` reader, not by
    the library's (whose coverage :func:`spark_state_reads` checks); the library's checksum
    arithmetic (:func:`stateops.spark.export.state_checksum`) sums what they read."""
    from stateops.spark.export import state_checksum

    query = load_registry(registry).query(name)
    batch = last_committed(Path(query.checkpoint))
    reads = spark_state_reads(spark, query.checkpoint, batch)
    state = {
        f"operator {op} {variable}": (
            kind,
            state_checksum(
                spark.read.format("statestore").options(**options).load(str(query.checkpoint))
            ),
        )
        for (op, variable), (kind, options) in sorted(reads.items())
    }
    assert state, f"{name}: no state to compare"
    quiesce(spark)
    return batch, state, read_sink(Path(query.sink.path))


def spark_state_reads(
    spark, checkpoint: str | Path, batch: int
) -> dict[tuple[int, str], tuple[str, dict[str, str]]]:
    """(operator, store or state variable) -> (kind, the ``statestore`` reader's options that
    read it after ``batch``), from Spark's own ``state-metadata``; asserted equal to what the
    library's reader reads (``stateops.spark.export.state_reads``). Without the second half, a
    store that reader missed would be missed on both sides of every comparison, and the
    comparison pass."""
    from stateops.spark.export import state_reads

    _ = spark.streams.active  # the StateStoreCoordinator, or RocksDB stores do not load
    meta = spark.read.format("state-metadata").option("batchId", batch).load(str(checkpoint))
    reads = {}
    for row in meta.collect():
        op = int(row["operatorId"])
        at = {"batchId": str(batch), "operatorId": str(op)}
        variables = json.loads(row["operatorProperties"] or "{}").get("stateVariables")
        if variables is None:  # a built-in operator's store (a join has four), by its name
            reads[(op, row["stateStoreName"])] = (
                "store",
                {**at, "storeName": row["stateStoreName"]},
            )
            continue
        for var in variables:  # transformWithState: its variables, its timers once
            name, kind = var["stateName"], var["stateVariableType"]
            if not name.startswith("$"):
                reads[(op, name)] = (
                    kind.removesuffix("State").lower(),
                    {**at, "stateVarName": name},
                )
            elif kind == "TimerState":  # Spark's own families ($...): not by stateVarName
                reads[(op, "timers")] = ("timers", {**at, "readRegisteredTimers": "true"})
            else:
                raise AssertionError(
                    f"{checkpoint}: operator {op} has internal state {name} ({kind}) this "
                    "harness does not read: teach spark_state_reads how Spark reads it"
                )
    library = {
        (r["operator_id"], r["variable"]) for r in state_reads(spark, str(checkpoint), batch)
    }
    assert library == set(reads), (
        f"{checkpoint} batch {batch}: the library's state reader reads {sorted(library)}, "
        f"Spark's state-metadata names {sorted(reads)}"
    )
    return reads


def last_committed(checkpoint: Path) -> int:
    batch = load_checkpoint(checkpoint).last_committed_batch
    assert batch is not None
    return batch


# Queries of every shape of Spark's built-in stateful operators (tests/spark/user_code).
USER_CODE = Path(__file__).parent / "user_code"
VIEWS = {
    "format": "json",
    "path": "landing/page_visits",
    "schema": "user_id STRING, page STRING, event_time TIMESTAMP",
    "options": {"maxFilesPerTrigger": 1},
}
EVENTS = {
    "format": "json",
    "path": "landing/user_sessions",
    "schema": "user_id STRING, data STRING, is_last BOOLEAN, event_time TIMESTAMP",
    "options": {"maxFilesPerTrigger": 1},
}


def _transform(function: str, **entry) -> dict:
    inputs = {"source": VIEWS} if "sources" not in entry else {}
    return {
        **inputs,
        "transform": {"function": function, "output_mode": "append"},
        "state_store": {"provider": "rocksdb"},
        **entry,
    }


# The shapes beside registry.yaml's own queries (user_sessions, page_visits, page_counts on the
# HDFS-backed store, idle_sessions with applyInPandasWithState): name -> registry entry, or
# the registered query whose entry it takes on RocksDB.
SHAPES = {
    "page_counts_rocksdb": "page_counts",
    "first_views": _transform("shapes:first_views", key_columns=["user_id", "page"]),
    "session_counts": _transform("shapes:session_counts"),
    "views_near_events": _transform(
        "shapes:views_near_events", sources={"views": VIEWS, "events": EVENTS}
    ),
}


def shape_registry(root: Path, landing: Path | None = None) -> Path:
    """registry.yaml's queries and the shapes above, test-sized, backed up to the test's S3;
    reading ``landing`` (another registry's landing folder) instead of ``root/landing``."""
    path = write_registry(root)
    raw = yaml.safe_load(path.read_text())
    queries = raw["queries"]
    for name, entry in copy.deepcopy(SHAPES).items():
        if isinstance(entry, str):
            entry = {**copy.deepcopy(queries[entry]), "state_store": {"provider": "rocksdb"}}
        queries[name] = {
            "shuffle_partitions": 2,
            "spark_conf": dict(TEST_SPARK_CONF),
            **entry,
            "state_store": {**TEST_STATE_STORE, **entry["state_store"]},
            "sink": {"format": "parquet", "path": f"output/{name}"},
            "checkpoint": f"checkpoints/{name}",
        }
    for entry in queries.values() if landing else ():
        for source in [entry["source"]] if "source" in entry else entry["sources"].values():
            source["path"] = str(landing / Path(source["path"]).name)  # landing/<dataset>
    raw["code_paths"] = [str(USER_CODE)]
    raw["backups"]["url"] = f"s3://backups/{root.parent.name}"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


def copy_checkpoint(src: Path, dest: Path) -> Path:
    """A full copy that Spark can run: transformWithState metadata names absolute paths."""
    shutil.copytree(src, dest)
    relocate_checkpoint(dest)
    return dest


def copy_query(src: Path, dest: Path, name: str) -> None:
    """Registry ``dest``'s query ``name`` starts where registry ``src``'s is: its checkpoint
    and its output copied."""
    old, new = load_registry(src).query(name), load_registry(dest).query(name)
    copy_checkpoint(Path(old.checkpoint), Path(new.checkpoint))
    shutil.copytree(old.sink.path, new.sink.path)


def repoint(checkpoint: Path, old: Path, new: Path) -> None:
    """``checkpoint``, copied from a data folder ``old`` into ``new`` with its input, made to
    name its own files: transformWithState's metadata and the file source's log (which names
    the files it read by absolute path) move from ``old`` to ``new``."""
    relocate_checkpoint(checkpoint)
    for log in (checkpoint / "sources").rglob("*"):
        if log.is_file() and not log.name.endswith(".crc"):
            text = log.read_text().replace(str(old), str(new))
            write_checkpoint_file(checkpoint, str(log.relative_to(checkpoint)), text)


def round_0(spark, tmp_path_factory, case: Case, files: int, root: Path) -> None:
    """``root``'s landing (``files`` files of round 0), ``ck-original`` (``case`` run over
    them) and ``out-original``: copies of a template Spark writes once per test run, shared by
    the modules and test workers that start from the same checkpoint (built under a lock of its
    own: two workers build two templates at once)."""
    base = tmp_path_factory.getbasetemp()
    shelf = (base.parent if base.name.startswith("popen-gw") else base) / "round-0-shelf"
    shelf.mkdir(exist_ok=True)
    template = shelf / f"{case.name}-{files}"
    with open(shelf / f"{template.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if not (template / "done").exists():
            shutil.rmtree(template, ignore_errors=True)
            land(template / "landing", round_=0, files=files)
            case.run(spark, template, template / "ck-original", template / "out-original")
            (template / "done").touch()
    for part in ("landing", "ck-original", "out-original"):
        shutil.copytree(template / part, root / part)
    repoint(root / "ck-original", template, root)


def kill_when(proc: subprocess.Popen, appears: Path, timeout: float = 240) -> None:
    """SIGKILL ``proc``'s whole process group (the CLI, spark-submit, the JVM and the driver)
    as soon as ``appears`` exists: in the middle of Spark's write."""
    deadline = time.monotonic() + timeout
    while not appears.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    while time.monotonic() < deadline + 30:  # every process of the group gone (and reaped)
        try:
            os.killpg(proc.pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.05)
