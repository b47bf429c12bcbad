"""Repartition (issue 19): a stopped query's state moves to another number of partitions by
Spark's own engine, proven, and the query goes on as if it had always had that many.

Library-level in the shared session (the job's ``main`` in process, as ``spark-submit`` runs
it); the CLI through ``spark-submit`` with a backup to the test's S3, the refusals, a failed
run's exit code, and kills at each step of a run are below."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from stateops.control.lock import new_run_id
from stateops.control.markers import read_repartition
from stateops.control.target import query_target
from stateops.core.checkpoint import load_checkpoint
from stateops.core.files import relocate_checkpoint
from stateops.core.registry import load_registry
from stateops.core.report import checkpoint_report
from stateops.core.verify import verify_checkpoint
from stateops.ops.cleanup import run_cleanup
from stateops.ops.repartition import plan_repartition, proof_path, run_repartition
from stateops.spark.export import store_checksums
from stateops.spark.repartition import store_states
from tests.conftest import VENV_BIN, run_cli, tree_digest, whole_after
from tests.spark.harness import (
    copy_checkpoint,
    copy_query,
    in_session,
    job_in_session,
    kill_when,
    land,
    last_committed,
    read_sink,
    run_in_session,
    shape_registry,
    state_and_output,
)

pytestmark = pytest.mark.spark


def quiet(_: str) -> None:
    pass


def registry_with(root: Path, partitions: int, landing: Path | None = None) -> Path:
    """The shapes' registry with every query on ``partitions`` state partitions."""
    path = shape_registry(root, landing=landing)
    raw = yaml.safe_load(path.read_text())
    for entry in raw["queries"].values():
        entry["shuffle_partitions"] = partitions
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


def repartition(spark, registry: Path, name: str, partitions: int) -> dict:
    return run_repartition(
        query_target(registry, name),
        partitions,
        run_id=new_run_id("repartition"),
        log=quiet,
        submit=in_session(spark, registry),
    )


def held_and_written(spark, registry: Path, name: str) -> tuple:
    """(state checksums, output of each batch that wrote any, in order): what a query holds
    and wrote, whatever the batch ids (a repartition's batch reads no input and writes
    nothing)."""
    _, state, _ = state_and_output(spark, registry, name)
    return state, written(registry, name)


def written(registry: Path, name: str) -> list:
    """The output of each batch that wrote any, in order."""
    sink = Path(load_registry(registry).query(name).sink.path)
    return [rows for _, rows in sorted(read_sink(sink).items())]


def misplaced(spark, registry: Path, name: str, partitions: int) -> dict[str, int]:
    """Per store of ``name``'s last state, the rows outside the partition the repartition
    proof's placement check expects for ``partitions`` (only stores with any)."""
    checkpoint = load_registry(registry).query(name).checkpoint
    stores = store_states(spark, checkpoint, last_committed(Path(checkpoint)), partitions)
    return {store: s["misplaced"] for store, s in stores.items() if s["misplaced"]}


# Both reference processors, a built-in aggregation, a stream-stream join and a session
# window, on RocksDB (Spark repartitions RocksDB state only: the HDFS store is refused, below).
# The join's and the session window's state keys hold a field their partitioning does not (a
# value's index, the session's start): the placement check must leave it out.
@pytest.mark.whole
@pytest.mark.parametrize(
    "name",
    ["page_visits", "user_sessions", "page_counts_rocksdb", "views_near_events", "session_counts"],
)
def test_repartitioned_queries_go_on_like_queries_that_always_had_the_new_count(
    spark, tmp_path, name
):
    # Up from 2 to 4 and down from 4 to 3 (a join at 8 partitions holds 32 RocksDB stores and
    # costs this test twice the time, for the same proof).
    landing = tmp_path / "landing"
    at2, at4, at3 = (registry_with(tmp_path / f"p{n}", n, landing) for n in (2, 4, 3))
    from4 = registry_with(tmp_path / "from4", 4, landing)
    land(landing, round_=0, files=1)
    for registry in (at2, at4, at3):
        run_in_session(spark, registry, name)
    copy_query(at4, from4, name)
    # The proof's placement check holds on Spark's own state at each count, and it can fail:
    # the same state checked against another count has rows out of place.
    assert misplaced(spark, at4, name, 4) == {} and misplaced(spark, at3, name, 3) == {}
    assert misplaced(spark, at4, name, 3), "the placement check found nothing to fail on"

    up = repartition(spark, at2, name, 4)
    down = repartition(spark, from4, name, 3)
    for done, (before, after) in ((up, (2, 4)), (down, (4, 3))):
        assert (done["partitions_before"], done["partitions"]) == (before, after)
        proof = done["proof"]
        assert proof["ok"] and proof["stores"], proof
        for store in proof["stores"].values():  # same rows and checksum, each row placed
            assert store["before"]["state"] == store["after"]["state"]
            assert store["after"]["state"][0] > 0 and store["after"]["misplaced"] == 0
    for registry, n in ((at2, 4), (from4, 3)):
        query = load_registry(registry).query(name)  # the registry follows
        cp = load_checkpoint(query.checkpoint)
        assert query.shuffle_partitions == n and cp.partitions(cp.last_committed_batch) == n
        assert verify_checkpoint(query.checkpoint)["ok"]

    land(landing, round_=1, files=1)
    for registry in (at2, at4, at3, from4):
        run_in_session(spark, registry, name)
    assert held_and_written(spark, at2, name) == held_and_written(spark, at4, name)
    assert held_and_written(spark, from4, name) == held_and_written(spark, at3, name)

    # The partition the state left behind goes with the cleanup once no retained batch reads
    # it.
    # Its plan counts the snapshot groups as inspect does (one group across the partitions).
    query = load_registry(from4).query(name)
    checkpoint, deltas = Path(query.checkpoint), query.state_store.min_deltas_for_snapshot
    inspected = {
        op["operator_id"]: {g["group_id"] for g in op["snapshot_groups"]}
        for op in checkpoint_report(load_checkpoint(checkpoint), deltas)["operators"]
    }
    plan = run_cleanup(query_target(from4, name), 1, run_id=new_run_id("cleanup"), log=quiet)
    planned: dict[int, set[int]] = {}
    for group in plan["groups"]:
        planned.setdefault(group["operator"], set()).add(group["group_id"])
    assert planned == inspected
    left = {p.relative_to(checkpoint).parts[2] for p in checkpoint.glob("state/*/*/**/*.zip")}
    assert left == {"0", "1", "2"} and verify_checkpoint(checkpoint)["ok"], left


@pytest.mark.whole
def test_the_placement_check_fits_spark_s_own_state_of_dedup_and_group_state(spark, tmp_path):
    """The proof's partitioning keys of the operators not repartitioned above (dedup within
    the watermark, applyInPandasWithState), checked on the state Spark wrote at 3
    partitions: every row where the check expects it, and rows out of place at 2."""
    registry = registry_with(tmp_path / "p3", 3)
    land(registry.parent / "landing", round_=0, files=1)
    for name in ("first_views", "idle_sessions"):
        run_in_session(spark, registry, name)
        assert misplaced(spark, registry, name, 3) == {}, name
        assert misplaced(spark, registry, name, 2), name


def test_the_cli_backs_up_repartitions_and_refuses_what_it_must_not_touch(spark, s3, tmp_path):
    """``stateops repartition`` through spark-submit, and its refusals: a running query, an
    uncommitted last batch, the same count, 0 or a negative count, and the HDFS store (with
    advice that works: followed, below); each in one line, exiting 2, the checkpoint
    byte-identical after. A run whose Spark job dies is undone and exits 1."""
    registry = registry_with(tmp_path / "data", 2)
    land(registry.parent / "landing", round_=0, files=2)
    for name in ("page_counts", "page_visits"):
        run_in_session(spark, registry, name)
    reg = load_registry(registry)
    checkpoint = Path(reg.query("page_visits").checkpoint)
    cli = ("--registry", str(registry), "repartition")

    def refused(name: str, *args: str, says: str) -> None:
        path = Path(reg.query(name).checkpoint)
        before = tree_digest(path)
        proc = run_cli(*cli, name, *args, env=s3.env())
        error = proc.stderr.strip().splitlines()
        assert proc.returncode == 2 and len(error) == 1 and says in error[0], proc.stderr
        assert tree_digest(path) == before and read_repartition(path) is None

    refused("page_visits", "--partitions", "2", says="already has 2 partitions")
    refused("page_visits", "--partitions", "0", says="from 1 to 10000")
    refused("page_visits", "--partitions", "-4", says="from 1 to 10000")
    # Spark 4.2 refuses it too (UNSUPPORTED_PROVIDER, after writing an offsets entry), and no
    # operation moves state to another store: the advice is a replay, which is followed below.
    refused(
        "page_counts",
        "--partitions",
        "4",
        says="Spark repartitions RocksDB state only; "
        "no operation moves state to another store, so replay the source instead",
    )
    with query_target(reg, "page_visits").lock("run", "run-now"):  # as a running query holds it
        refused("page_visits", "--partitions", "4", says="run-now")
    last = load_checkpoint(checkpoint).last_committed_batch
    uncommitted = tmp_path / "uncommitted"  # as a run killed between offsets and commit
    copy_checkpoint(checkpoint, uncommitted)
    (uncommitted / "commits" / str(last)).unlink()
    before = tree_digest(uncommitted)
    proc = run_cli(*cli, str(uncommitted), "--partitions", "4", "--no-backup")
    assert proc.returncode != 0 and "planned but not committed" in proc.stderr, proc.stderr
    assert tree_digest(uncommitted) == before

    # A run whose Spark job dies in the middle of its write fails, is undone and exits 1 (the
    # input was good; 2 is for refusals).
    before, stderr = tree_digest(checkpoint), tmp_path / "failed.stderr"
    with stderr.open("w") as err:
        proc = subprocess.Popen(
            [str(VENV_BIN / "stateops"), *cli, "page_visits", "--partitions", "4", "--no-backup"],
            process_group=0,  # killed whole, in the session's CPU share (the kill trials')
            stdout=subprocess.DEVNULL,
            stderr=err,
        )
    try:
        kill_spark_job(proc, checkpoint / "offsets" / str(last + 1))
        assert proc.wait(timeout=120) == 1, stderr.read_text()
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # the job's Python driver, orphaned
    error = stderr.read_text().strip().splitlines()[-1]
    assert error.startswith("error: the repartition of ") and "it was undone" in error, error
    assert tree_digest(checkpoint) == before and read_repartition(checkpoint) is None

    dry = run_cli(*cli, "page_visits", "--partitions", "4", "--dry-run", check=True)
    assert "DRY RUN: nothing changed" in dry.stdout and "2 -> 4" in dry.stdout, dry.stdout
    assert tree_digest(checkpoint) == before
    proc = run_cli(*cli, "page_visits", "--partitions", "4", "--json", env=s3.env(), timeout=300)
    assert proc.returncode == 0, proc.stderr
    done = json.loads(proc.stdout)
    assert done["proof"]["ok"] and done["batch"] == last + 1 and done["backup_id"], done
    assert proof_path(checkpoint, done["run_id"]).exists()
    assert load_registry(registry).query("page_visits").shuffle_partitions == 4
    listed = run_cli(
        "--registry",
        str(registry),
        "backups",
        "list",
        reg.backups.url_for("page_visits"),
        env=s3.env(),
        check=True,
    )
    assert done["backup_id"] in listed.stdout
    inspect = run_cli("--registry", str(registry), "inspect", "page_visits", "--json", check=True)
    assert [op["num_partitions"] for op in json.loads(inspect.stdout)["operators"]] == [4]
    # A backup after it holds the repartition batch's restart set, and restores to a
    # checkpoint with 4 partitions that verifies clean.
    run_cli(
        "--registry",
        str(registry),
        "backup",
        "page_visits",
        "--to",
        reg.backups.url_for("page_visits"),
        env=s3.env(),
        check=True,
    )
    restored = tmp_path / "restored"
    run_cli(
        "--registry",
        str(registry),
        "restore",
        "page_visits",
        "--backup",
        "latest",
        "--to",
        str(restored),
        env=s3.env(),
        check=True,
    )
    cp = load_checkpoint(restored)
    assert cp.last_committed_batch == last + 1 and cp.partitions(last + 1) == 4
    assert verify_checkpoint(restored)["ok"]

    # The HDFS refusal's advice, followed: a new checkpoint and sink, 4 partitions on RocksDB,
    # the same input files: the replay holds the same state and wrote the same rows, and can
    # be repartitioned from then on.
    raw = yaml.safe_load(registry.read_text())
    raw["queries"]["page_counts"].update(
        checkpoint="checkpoints/page_counts_replayed",
        shuffle_partitions=4,
        sink={"format": "parquet", "path": "output/page_counts_replayed"},
        state_store={**raw["queries"]["page_counts"].get("state_store", {}), "provider": "rocksdb"},
    )
    replayed = registry.with_name("replayed.yaml")
    replayed.write_text(yaml.safe_dump(raw, sort_keys=False))
    run_in_session(spark, replayed, "page_counts")
    old, new = reg.query("page_counts"), load_registry(replayed).query("page_counts")
    batch = last_committed(Path(new.checkpoint))
    assert load_checkpoint(new.checkpoint).partitions(batch) == 4
    assert store_checksums(spark, new.checkpoint, batch) == store_checksums(
        spark, old.checkpoint, last_committed(Path(old.checkpoint))
    )
    assert written(replayed, "page_counts") == written(registry, "page_counts")
    assert plan_repartition(query_target(replayed, "page_counts"), 3)["partitions_before"] == 4


def kill_spark_job(cli: subprocess.Popen, appears: Path, timeout: float = 240) -> None:
    """SIGKILL the Spark job ``stateops`` (``cli``) runs (its spark-submit, which is the JVM
    once its launcher execs it) as soon as ``appears`` exists, leaving the CLI to handle it."""
    deadline = time.monotonic() + timeout
    while not appears.exists() and cli.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert appears.exists(), f"{appears} never appeared"
    tasks = Path(f"/proc/{cli.pid}/task")
    children = [
        int(pid) for task in tasks.iterdir() for pid in (task / "children").read_text().split()
    ]
    assert children, "the CLI runs no Spark job"
    for pid in children:
        os.kill(pid, signal.SIGKILL)


def clone(registry: Path, dest: Path) -> Path:
    """A copy of ``registry``'s whole data folder (checkpoints, their audit folders and
    markers, output, locks, switches) that runs on its own, with backups of its own: backups
    are stored by content, so copies backing up side by side under one location would upload
    each object once, and a kill at one copy's upload could find nothing left to upload."""
    shutil.copytree(registry.parent, dest)
    path = dest / registry.name
    raw = yaml.safe_load(path.read_text())
    raw["data_dir"] = str(dest)
    raw["backups"]["url"] = f"s3://backups/{dest.parent.name}-{dest.name}"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    for query in load_registry(path).queries.values():
        if Path(query.checkpoint).exists():
            relocate_checkpoint(Path(query.checkpoint))
    return path


# Fault stories, the whole proof's: killed in the middle of Spark's write (marked, the next
# batch planned and not committed), and at each of the other points.
@pytest.mark.parametrize(
    "points",
    whole_after(
        0,
        [["spark"], ["upload:1", "marker:1", "audit:2", "finish:1"]],
        ids=["mid-write", "every-other-point"],
    ),
)
def test_a_killed_repartition_run_again_or_rolled_back_restarts_correctly(
    spark, s3, tmp_path, points
):
    """kill -9 at five points of ``stateops repartition`` (the backup's upload, the marker,
    in the middle of Spark's write, the audit record and the marker's removal after it),
    each from the same start; then each killed checkpoint both run again (it goes on like a
    query that always had the new count) and rolled back to its last batch (it goes on like
    the query that was never touched)."""
    name, landing = "page_counts_rocksdb", tmp_path / "landing"
    at2, at4 = (registry_with(tmp_path / f"p{n}", n, landing) for n in (2, 4))
    land(landing, round_=0, files=1)
    for registry in (at2, at4):
        run_in_session(spark, registry, name)
    start = clone(at2, tmp_path / "start")  # the kills' start: at2 before it goes on
    last = load_checkpoint(load_registry(start).query(name).checkpoint).last_committed_batch

    killed: dict[str, Path] = {}
    running = []
    for point in points:
        registry = clone(start, tmp_path / f"killed-{point.replace(':', '-')}")
        env = {**s3.env(), **({} if point == "spark" else {"STATEOPS_KILL_AT": point})}
        args = [
            str(VENV_BIN / "stateops"),
            "--registry",
            str(registry),
            "repartition",
            name,
            "--partitions",
            "4",
        ]
        # Five JVMs at once: niced, in a process group of their own (killed whole), not a
        # session: Linux shares the CPU between sessions first (autogroups), where a nice value
        # counts for nothing, and Spark gives the other worker's Python workers a fixed 10 s
        # to connect back.
        proc = subprocess.Popen(
            ["nice", "-n", "19", *args],
            env={**os.environ, **env},
            process_group=0,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        running.append((point, registry, proc))
        killed[point] = registry
    for point, registry, proc in running:
        if point == "spark":
            checkpoint = Path(load_registry(registry).query(name).checkpoint)
            kill_when(proc, checkpoint / "offsets" / str(last + 1), timeout=600)
        else:
            proc.wait(timeout=600)
        assert proc.returncode == -signal.SIGKILL, (point, proc.stderr.read())
        checkpoint = Path(load_registry(registry).query(name).checkpoint)
        cp, marker = load_checkpoint(checkpoint), read_repartition(checkpoint)
        left = (marker is not None, cp.latest_offset_batch, cp.last_committed_batch)
        assert left == {
            "upload:1": (False, last, last),
            "marker:1": (False, last, last),
            "spark": (True, last + 1, last),
        }.get(point, (True, last + 1, last + 1)), (point, left)

    land(landing, round_=1, files=1)
    for registry in (at2, at4):
        run_in_session(spark, registry, name)
    for point, registry in killed.items():
        again, back = registry, clone(registry, registry.with_name(registry.name + "-back"))
        repartition(spark, again, name, 4)
        checkpoint = load_registry(back).query(name).checkpoint
        run_cli(
            "--registry",
            str(back),
            "rollback",
            name,
            "--to-batch",
            str(last),
            "--no-backup",
            check=True,
        )
        assert read_repartition(checkpoint) is None and verify_checkpoint(checkpoint)["ok"]
        assert load_registry(back).query(name).shuffle_partitions == 2, point
        for registry, control in ((again, at4), (back, at2)):
            run_in_session(spark, registry, name)
            assert held_and_written(spark, registry, name) == held_and_written(
                spark, control, name
            ), point


def test_the_repartition_job_holds_the_lease_so_the_runs_undo_waits_for_it(spark, tmp_path):
    """The DAG's job task runs between its prepare and its finish, which take the lease only
    for their own step: a driver that outlives its failed task (cluster mode) would have its
    files deleted under it by the undo. The job holds the lease for its run; the undo is
    refused while it lives, and the finish goes on after it."""
    import threading

    from stateops.control.lock import live_lock
    from stateops.core.errors import LockHeldError
    from stateops.core.steps import REPARTITION_STATE
    from stateops.ops.repartition import finish_repartition, prepare_repartition, undo_repartition

    name, landing = "page_counts_rocksdb", tmp_path / "landing"
    registry = registry_with(tmp_path / "r", 2, landing)
    land(landing, round_=0, files=1)
    run_in_session(spark, registry, name)
    target = query_target(registry, name)
    prepare_repartition(target, 3, run_id="rp-1", log=quiet)  # the DAG's prepare task
    done, seen, refused = threading.Event(), [], []

    def undo_while_it_runs() -> None:  # the undo task, started while the job's driver lives
        while not done.is_set():
            held = live_lock(target.lock_file)
            if held is not None:
                seen.append((held.operation, held.run_id))
                try:
                    undo_repartition(target, run_id="rp-1", log=quiet)
                except LockHeldError as err:
                    refused.append(str(err))
                return
            time.sleep(0.02)

    undo = threading.Thread(target=undo_while_it_runs)
    undo.start()
    try:
        code, out = job_in_session(
            spark, REPARTITION_STATE, "--registry", str(registry), "--checkpoint", name,
            "--run-id", "rp-1",
        )  # fmt: skip
    finally:
        done.set()
        undo.join(30)
    assert code == 0, out
    assert seen == [("repartition", "rp-1")], seen
    assert refused and "locked by repartition (run rp-1" in refused[0], refused
    assert read_repartition(target.checkpoint) is not None, "the undo deleted nothing"
    finished = finish_repartition(target, run_id="rp-1", log=quiet)
    assert finished and live_lock(target.lock_file) is None
