"""A registered query may be the user's own code (``transform``): a function that builds the
streaming query from its sources, with Spark's built-in stateful operators. Here: the windowed
count reference pipeline on the HDFS-backed store, and applyInPandasWithState from a folder of
the user's own code (``code_paths``), which the executors import."""

from __future__ import annotations

import json
import re
import shutil
import threading
import time
from collections import Counter
from datetime import datetime, timedelta
from pathlib import Path

import pytest
import yaml

from stateops.control.target import query_target
from stateops.core.checkpoint import load_checkpoint
from stateops.core.errors import StateOpsError
from stateops.core.registry import PROVIDER_CLASSES, load_registry
from stateops.core.steps import BOOTSTRAP_STATE, RUN_QUERY
from stateops.core.verify import verify_checkpoint
from stateops.ops.bootstrap import plan_bootstrap
from stateops.ops.transplant import transplant_refusals
from stateops.spark.jobs import job_path, preflight_job
from tests.conftest import run_cli, write_registry
from tests.spark.harness import (
    copy_checkpoint,
    job_in_session,
    land,
    read_sink,
    run_in_session,
    state_and_output,
)
from tests.spark.migrations import as_parquet

pytestmark = pytest.mark.spark

# The user's own code, in a folder the registry names in code_paths.
SESSIONS = '''
import functools

import pandas as pd
from pyspark.sql.streaming import StatefulProcessor
from pyspark.sql.streaming.state import GroupStateTimeout


def count_events(key, frames, state, timeout_ms):
    """Events per user; the state times out once the user is idle that long (event time)."""
    if state.hasTimedOut:
        (count,) = state.get
        state.remove()
        yield pd.DataFrame({"user_id": [key[0]], "events": [count], "open": [False]})
        return
    frames = list(frames)
    latest = max(int(f["event_time"].max().timestamp() * 1000) for f in frames)
    count = (state.get[0] if state.exists else 0) + sum(len(f) for f in frames)
    state.update((count,))
    state.setTimeoutTimestamp(max(latest, state.getCurrentWatermarkMs()) + timeout_ms)
    yield pd.DataFrame({"user_id": [key[0]], "events": [count], "open": [True]})


def keep_events(key, frames, state, timeout_ms):
    """count_events with a bug: a timed-out group's state is kept (no remove, no new timeout)."""
    if state.hasTimedOut:
        yield pd.DataFrame({"user_id": [key[0]], "events": [state.get[0]], "open": [False]})
        return
    yield from count_events(key, frames, state, timeout_ms)


def build(spark, inputs, idle_minutes=600, keep_expired=False):
    events = inputs["source"].withWatermark("event_time", "10 minutes")
    function = keep_events if keep_expired else count_events
    return events.groupBy("user_id").applyInPandasWithState(
        functools.partial(function, timeout_ms=idle_minutes * 60_000),
        outputStructType="user_id STRING, events LONG, open BOOLEAN",
        stateStructType="count LONG",
        outputMode="Update",
        timeoutConf=GroupStateTimeout.EventTimeTimeout,
    )


def reject(frames):
    for frame in frames:
        raise ValueError(f"no visit for {frame['user_id'].iloc[0]}")
        yield frame


def raises(spark, inputs):
    return inputs["source"].mapInPandas(reject, inputs["source"].schema)


def batch(spark, inputs):
    return spark.range(3)


class Counter(StatefulProcessor):
    def init(self, handle):
        self.count = handle.getValueState("count", "n LONG")

    def handleInputRows(self, key, rows, timerValues):
        yield pd.DataFrame({"user_id": [key[0]], "n": [sum(len(r) for r in rows)]})


def counted(spark, inputs):
    """transformWithState, which the HDFS-backed store cannot serve."""
    return inputs["source"].groupBy("user_id").transformWithStateInPandas(
        Counter(), "user_id STRING, n LONG", "Update", "None"
    )


def passthrough(spark, inputs):
    return inputs["source"]
'''

VISITS = "user_id STRING, page STRING, event_time TIMESTAMP"
SESSION_EVENTS = "user_id STRING, data STRING, is_last BOOLEAN, event_time TIMESTAMP"
# applyInPandasWithState's store records each group's timeout: none may be behind the watermark.
GROUP_STATE_EXPIRY = {"expiry": {"timeout_column": "value_timeoutTimestamp"}}


def _query(name: str, function: str, **fields) -> dict:
    source = fields.pop("source", "page_visits")
    schema = VISITS if source == "page_visits" else SESSION_EVENTS
    return {
        "source": {
            "format": "json",
            "path": f"landing/{source}",
            "schema": schema,
            "options": {"maxFilesPerTrigger": 1},
        },
        "transform": {"function": function, **fields.pop("transform", {})},
        "sink": {"path": f"output/{name}"},
        "checkpoint": f"checkpoints/{name}",
        "shuffle_partitions": 2,
        "spark_conf": {"spark.sql.streaming.stateStore.maintenanceInterval": "200ms"},
        **fields,
    }


@pytest.fixture(scope="module")
def registry(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("transform")
    code = root / "code" / "shop"
    code.mkdir(parents=True)
    (code / "__init__.py").write_text("")
    (code / "sessions.py").write_text(SESSIONS)
    path = write_registry(root)
    raw = yaml.safe_load(path.read_text())
    raw["code_paths"] = ["code"]
    raw["queries"] = {
        **{
            name: _query(
                name,
                "stateops.pipelines.page_counts:build",
                transform={"output_mode": "update", "options": {"window": "10 minutes"}},
                key_columns=["page"],
                state_store={"provider": "hdfs", "min_deltas_for_snapshot": 2},
            )
            for name in ("page_counts", "windows")
        },
        "build": _query(
            "build",
            "shop.sessions:build",
            source="user_sessions",
            transform={"output_mode": "update"},
        ),
        **{
            name: _query(
                name,
                "shop.sessions:build",
                source="user_sessions",
                key_columns=["user_id"],
                transform={
                    "output_mode": "update",
                    "options": {"idle_minutes": 20, "keep_expired": name == "leaky"},
                },
                expectations=GROUP_STATE_EXPIRY,
            )
            for name in ("sessions", "leaky")
        },
        "idle_sessions": _query(
            "idle_sessions",
            "stateops.pipelines.idle_sessions:build",
            source="user_sessions",
            key_columns=["user_id"],
            transform={"output_mode": "update", "options": {"idle_seconds": 1200}},
            expectations=GROUP_STATE_EXPIRY,
        ),
        "raises": _query("raises", "shop.sessions:raises"),
        "batch": _query("batch", "shop.sessions:batch"),
        "counted": _query(
            "counted",
            "shop.sessions:counted",
            transform={"output_mode": "update"},
            state_store={"provider": "hdfs"},
        ),
        "passthrough": _query(
            "passthrough", "shop.sessions:passthrough", transform={"output_mode": "complete"}
        ),
        "missing": _query("missing", "shop.nope:build"),
        "misfit": _query(
            "misfit", "stateops.pipelines.page_counts:build", transform={"options": {"size": 3}}
        ),
    }
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    land(root / "landing", round_=0, files=2)
    return path


def _events(landing: Path) -> list[dict]:
    return [json.loads(line) for f in sorted(landing.glob("*.json")) for line in f.open()]


def _ts(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).replace(tzinfo=None)


def _latest(sink: Path, key: int) -> dict:
    """The last row each key was given, over the batches in order (update mode)."""
    latest = {}
    for _, rows in sorted(read_sink(sink).items()):
        for row in rows:
            latest[row[:key]] = row[key:]
    return latest


def test_a_windowed_count_runs_on_the_hdfs_store_and_counts_every_view(spark, registry):
    first = run_in_session(spark, registry, "page_counts")
    land(registry.parent / "landing", round_=1, files=1)
    second = run_in_session(spark, registry, "page_counts")
    assert first["status"] == second["status"] == "succeeded"
    # The new file's batch, then a batch without data where the watermark moved on.
    assert second["last_committed_batch_before"] == first["last_committed_batch"]
    assert second["batches_run"] >= 1

    query = load_registry(registry).query("page_counts")
    views = Counter()
    for e in _events(registry.parent / "landing" / "page_visits"):
        t = _ts(e["event_time"])
        start = t - timedelta(minutes=t.minute % 10, seconds=t.second, microseconds=t.microsecond)
        views[(start, start + timedelta(minutes=10), e["page"])] += 1
    got = {k: v[0] for k, v in _latest(Path(query.sink.path), key=3).items()}
    assert got == dict(views), "each window's last update is its whole count: no view lost"

    cp = load_checkpoint(query.checkpoint)
    assert cp.operators and {op.provider for op in cp.operators} == {"hdfs"}
    offsets = (Path(query.checkpoint) / "offsets" / "2").read_text()
    assert f'"spark.sql.streaming.stateStore.providerClass":"{PROVIDER_CLASSES["hdfs"]}"' in offsets
    assert verify_checkpoint(query.checkpoint)["ok"]


def test_a_backfill_with_a_longer_window_reprocesses_with_it_and_says_what_changed(spark, registry):
    from stateops.control.target import query_target
    from stateops.core.plans import BackupFirst
    from stateops.ops.backfill import plan_backfill, report_backfill, rollback_for_backfill

    run_in_session(spark, registry, "windows")
    loaded = load_registry(registry)
    target = query_target(loaded, "windows")
    lines: list[str] = []
    overrides = {"transform": {"options": {"window": "20 minutes"}}}
    plan = plan_backfill(
        target, "backfill-1", to_batch=0, overrides=overrides, dry_run=False, log=lines.append
    )
    change = 'transform.options.window: "10 minutes" -> "20 minutes"'
    assert plan["changes"] == [change] and change in lines[-1], lines
    rolled = rollback_for_backfill(
        target, plan, backup=BackupFirst(plan["backup_to"], lambda: "b-test"), log=lines.append
    )
    summary = run_in_session(spark, Path(plan["registry"]), "windows", "--run-id", "backfill-1")
    assert summary["last_committed_batch_before"] == 0 and summary["batches_run"] >= 1
    report = report_backfill(target, plan, rolled, log=lines.append)
    assert report["changes"] == [change] and f"  reprocessed with {change}" in lines
    assert report["changed_keys"] + report["added"] > 0, report
    reprocessed = [
        r
        for b, rows in read_sink(Path(loaded.query("windows").sink.path)).items()
        if b > 0
        for r in rows
    ]
    assert reprocessed and {end - start for start, end, *_ in reprocessed} == {
        timedelta(minutes=20)
    }, "every window the reprocessing wrote is a 20-minute one"


def test_the_users_own_code_runs_in_the_executors_with_its_group_state(spark, registry):
    summary = run_in_session(spark, registry, "build")
    assert summary["status"] == "succeeded" and summary["batches_run"] >= 2
    events = Counter(e["user_id"] for e in _events(registry.parent / "landing" / "user_sessions"))
    sink = Path(load_registry(registry).query("build").sink.path)
    assert {user: row[0] for (user,), row in _latest(sink, key=1).items()} == dict(events)


@pytest.mark.whole
def test_expectations_fit_the_built_in_stores_and_find_group_state_kept_past_its_timeout(
    spark, registry
):
    from stateops.spark.expectations import leaking_keys, validate_state

    loaded = load_registry(registry)
    counts = validate_state(spark, loaded.query("page_counts"))  # written by the first test
    [store] = counts["variables"]
    checks = [(e["expectation"], e["column"]) for e in store["expectations"]]
    assert counts["ok"] and ("expect_column_values_to_not_be_null", "page") in checks
    assert ("expect_compound_columns_to_be_unique", ["window_start", "window_end", "page"]) in (
        checks
    ), "one row per whole key of the store"

    for name in ("sessions", "leaky"):
        assert run_in_session(spark, registry, name)["status"] == "succeeded"
    # A session's last row says whether it was open or timed out (then kept, by the bug).
    last = _latest(Path(loaded.query("leaky").sink.path), key=1)
    timed_out = sum(1 for _, is_open in last.values() if not is_open)
    assert timed_out > 0, "some sessions timed out, so the bug had a chance to show"
    sessions = validate_state(spark, loaded.query("sessions"))
    assert sessions["ok"] and leaking_keys(sessions) == 0
    leaky = validate_state(spark, loaded.query("leaky"))
    assert not leaky["ok"] and leaking_keys(leaky) == timed_out


@pytest.mark.whole
def test_the_idle_sessions_reference_closes_each_visit_at_its_timeout_and_keeps_no_state(
    spark, registry
):
    from stateops.spark.expectations import leaking_keys, validate_state

    summary = run_in_session(spark, registry, "idle_sessions")
    assert summary["status"] == "succeeded"
    query = load_registry(registry).query("idle_sessions")
    cp = load_checkpoint(query.checkpoint)
    watermark_ms = cp.offsets[cp.last_committed_batch].watermark_ms
    # Replay the events in batch order: a visit closes once the watermark passes its last
    # event + 20 minutes; the visits the query reports closed are exactly those.
    times: dict[str, list[datetime]] = {}
    for e in _events(registry.parent / "landing" / "user_sessions"):
        times.setdefault(e["user_id"], []).append(_ts(e["event_time"]))
    rows = [r for _, batch in sorted(read_sink(Path(query.sink.path)).items()) for r in batch]
    closed = [r for r in rows if r[4] is False]
    assert closed, "some visits were idle for 20 minutes of event time"
    for user, start, end, events, _ in closed:
        inside = [t for t in times[user] if start <= t <= end]
        assert len(inside) == events, (user, start, end)
        assert not [t for t in times[user] if end < t <= end + timedelta(minutes=20)]
    result = validate_state(spark, query)
    assert result["ok"] and leaking_keys(result) == 0
    state = spark.read.format("statestore").load(query.checkpoint).collect()
    assert state and all(r["value"]["timeoutTimestamp"] > watermark_ms for r in state), (
        "open visits only, none past its timeout"
    )


def test_a_query_that_fails_in_the_users_code_names_the_python_exception(spark, registry):
    code, out = job_in_session(spark, RUN_QUERY, "--registry", str(registry), "--query", "raises")
    summary = json.loads(out.strip().splitlines()[-1])
    assert code == 1 and summary["status"] == "failed", summary
    # Spark's own first line ends "Return Message: Traceback (most recent call last):".
    said = r"[^\n]+: ValueError: no visit for u\d{5} \(nothing was committed; [^\n]+ removed\)"
    assert re.fullmatch(said, summary["error"]), summary
    assert "Traceback" not in summary["error"]


@pytest.mark.parametrize(
    ("name", "says"),
    [
        (
            "missing",
            "transform.function 'shop.nope:build' cannot be imported (No module named "
            "'shop.nope'); is its folder in the registry's code_paths?",
        ),
        (
            "misfit",
            "transform.options do not fit stateops.pipelines.page_counts:build(spark, "
            "inputs, **options): got an unexpected keyword argument 'size'",
        ),
    ],
)
def test_code_that_cannot_run_is_refused_before_spark_starts(registry, name, says):
    with pytest.raises(StateOpsError) as refused:
        preflight_job(job_path(RUN_QUERY), ["--registry", str(registry), "--query", name])
    assert str(refused.value) == f"query {name}: {says}"
    assert not Path(load_registry(registry).query(name).checkpoint).exists()


@pytest.mark.parametrize(
    ("name", "says"),
    [
        (
            "batch",
            "transform.function shop.sessions:batch returned a batch DataFrame, not a "
            "streaming DataFrame; build its result from the inputs it is given",
        ),
        (
            "passthrough",
            "Spark cannot start it: [STREAMING_OUTPUT_MODE.UNSUPPORTED_OPERATION] "
            "Invalid streaming output mode: complete.",
        ),
    ],
)
def test_a_query_spark_refuses_fails_in_one_line_and_commits_nothing(
    spark, registry, capsys, name, says
):
    code, _ = job_in_session(spark, RUN_QUERY, "--registry", str(registry), "--query", name)
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1, err
    assert err[0].startswith(f"error: query {name}: {says}"), err[0]
    checkpoint = Path(load_registry(registry).query(name).checkpoint)
    assert not (checkpoint / "commits").exists() or not any((checkpoint / "commits").iterdir())


def test_a_store_an_operator_refuses_is_one_line_and_the_corrected_entry_starts_afresh(
    spark, registry, tmp_path
):
    code, out = job_in_session(spark, RUN_QUERY, "--registry", str(registry), "--query", "counted")
    error = json.loads(out.strip().splitlines()[-1])["error"]
    assert code == 1 and len(error.splitlines()) == 1
    assert error.startswith("[UNSUPPORTED_FEATURE.STORE_BACKEND_NOT_SUPPORTED_FOR_TWS]"), error
    assert "Please use RocksDBStateStoreProvider" in error
    assert error.endswith("(nothing was committed; the checkpoint it began is removed)")
    checkpoint = Path(load_registry(registry).query("counted").checkpoint)
    assert not checkpoint.exists()

    # Its planned batch 0 would have pinned the HDFS store for every restart: gone, the entry
    # corrected to RocksDB runs on the same checkpoint path (and the user's processor, from
    # code_paths, runs its init in Spark's Python worker on the driver).
    raw = yaml.safe_load(registry.read_text())
    raw["code_paths"] = [str(registry.parent / "code")]
    raw["queries"]["counted"]["state_store"] = {"provider": "rocksdb"}
    fixed = tmp_path / "registry.yaml"
    fixed.write_text(yaml.safe_dump(raw, sort_keys=False))
    summary = run_in_session(spark, fixed, "counted")
    assert summary["status"] == "succeeded" and summary["first_batch_id"] == 0, summary
    assert load_checkpoint(checkpoint).operators[0].provider == "rocksdb"


@pytest.mark.whole
def test_the_windowed_count_bootstraps_from_its_checkpoint_by_transplant_on_a_parquet_source(
    spark, tmp_path
):
    """Spark's built-in operators keep no trace of their source: a bootstrap of the windowed
    count from another checkpoint of it transplants the aggregation's HDFS state files, and
    the query reading the rest of the input as Parquet continues exactly like the query that
    kept reading JSON (the same batches, state and output). It takes no other initial state."""
    control, old = write_registry(tmp_path / "control"), write_registry(tmp_path / "old")
    land(control.parent / "landing", round_=0, files=3)
    run_in_session(spark, control, "page_counts")
    # The old query: the control's checkpoint where it stands after round 0.
    copy_checkpoint(
        Path(load_registry(control).query("page_counts").checkpoint),
        Path(load_registry(old).query("page_counts").checkpoint),
    )
    land(tmp_path / "round1", round_=1, files=2)
    later = sorted((tmp_path / "round1" / "page_visits").iterdir())
    for f in later:  # the control reads them as JSON, where it always read
        shutil.copy2(f, control.parent / "landing" / "page_visits")
    run_in_session(spark, control, "page_counts")

    query = load_registry(old).query("page_counts")
    as_parquet(later, tmp_path / "old" / "landing_v2", query.source.schema_)
    raw = yaml.safe_load(old.read_text())
    entry = raw["queries"]["page_counts"]
    entry["source"].update(format="parquet", path="landing_v2")
    entry.update(checkpoint="checkpoints/page_counts.v2", sink={"path": "output/page_counts.v2"})
    moved = tmp_path / "old" / "registry-v2.yaml"
    moved.write_text(yaml.safe_dump(raw, sort_keys=False))
    new = load_registry(moved).query("page_counts")
    with pytest.raises(
        StateOpsError,
        match=r"^query page_counts is a transform: Spark's "
        r"built-in operators take no initial state, so .*landing_v2 \(parquet\)",
    ):
        plan_bootstrap(
            query_target(moved, "page_counts"), str(tmp_path / "old" / "landing_v2"), None
        )
    with pytest.raises(StateOpsError, match="^carry_over initial_state is for processors"):
        plan_bootstrap(query_target(moved, "page_counts"), query.checkpoint, None, "initial_state")
    # Another partition count: Spark repartitions RocksDB state only, so no transplant.
    (why,) = transplant_refusals(
        load_checkpoint(query.checkpoint), new.model_copy(update={"shuffle_partitions": 3})
    )
    assert re.fullmatch(
        r"the old state has 2 partitions, the query 3 \(shuffle_partitions\), "
        r"and operator 0 \(.*\) keeps its state in hdfs: Spark repartitions "
        r"RocksDB state only; .*",
        why,
    ), why
    assert not Path(new.checkpoint).exists()

    code, out = job_in_session(
        spark,
        BOOTSTRAP_STATE,
        "--registry",
        str(moved),
        "--query",
        "page_counts",
        "--initial-state",
        query.checkpoint,
    )
    summary = json.loads(out.strip().splitlines()[-1])
    assert code == 0 and summary["carry_over"] == "transplant", out[-3000:]
    # The first run proves the carried state: every store after the transplanted batch reads
    # the same in both checkpoints.
    assert summary["bootstrap"] == "complete" and summary["proof"]["ok"], summary["proof"]
    (rows,) = summary["proof"]["variables"].values()  # the aggregation's one store
    old_last = load_checkpoint(query.checkpoint).last_committed_batch
    assert rows > 0 and summary["proof"]["batches"] == [old_last], summary["proof"]
    assert load_checkpoint(new.checkpoint).operators[0].provider == "hdfs"

    batch, state, output = state_and_output(spark, control, "page_counts")
    assert state_and_output(spark, moved, "page_counts")[:2] == (batch, state)
    after = {b: rows for b, rows in output.items() if b > old_last}
    assert after and read_sink(Path(new.sink.path)) == after


@pytest.mark.whole
def test_the_windowed_count_runs_continuously_until_a_graceful_stop(spark, tmp_path):
    """stream_start's continuous mode on a transform: it picks up input while it runs and, on
    `stateops stop`, stops after its current batch, with the state and output of a query that
    ran once per arrival (available-now)."""
    control = write_registry(tmp_path / "control")
    running = write_registry(
        tmp_path / "running", page_counts={"trigger": {"processing_time": "1 second"}}
    )
    checkpoint = Path(load_registry(running).query("page_counts").checkpoint)
    for round_ in (0, 1):  # the control first: a query in this session must run alone
        land(control.parent / "landing", round_=round_, files=1)
        run_in_session(spark, control, "page_counts")
    # A continuous query numbers its batches by trigger, not by arrival (the second input can
    # land before the batch that only moves the first one's watermark), so it has caught up
    # when its last batch carries the control's final watermark; state and output compare
    # without batch ids.
    final_watermark = _last_watermark(load_registry(control).query("page_counts").checkpoint)
    land(running.parent / "landing", round_=0, files=1)
    ran: list[tuple[int, str]] = []
    thread = threading.Thread(
        target=lambda: ran.append(
            job_in_session(
                spark,
                RUN_QUERY,
                "--registry",
                str(running),
                "--query",
                "page_counts",
                "--mode",
                "continuous",
                "--run-id",
                "cont-t",
                "--poll-seconds",
                "0.5",
            )
        )
    )
    thread.start()

    def read(files: int) -> bool:
        """Whether the running query committed every batch of ``files`` input files."""
        try:
            cp = load_checkpoint(checkpoint)
        except StateOpsError:
            return False
        return (
            len(cp.seen_files()) == files
            and cp.last_committed_batch is not None
            and (not cp.uncommitted_batches)
        )

    def caught_up() -> bool:
        try:
            return _last_watermark(checkpoint) == final_watermark
        except StateOpsError:
            return False

    try:
        deadline = time.monotonic() + 120
        while not read(1) and thread.is_alive() and time.monotonic() < deadline:
            time.sleep(0.5)
        # a job that ended says why (one ended early in a clean clone, its output unseen)
        assert read(1), f"the first input was not committed: {[out[-3000:] for _, out in ran]}"
        land(running.parent / "landing", round_=1, files=1)
        while not (read(2) and caught_up()) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert read(2) and thread.is_alive(), "the running query did not pick up new input"
        assert caught_up(), "the running query did not move the watermark as the control did"
        run_cli("--registry", str(running), "stop", "page_counts", check=True)
    finally:
        thread.join(120)
    ((code, out),) = ran
    summary = json.loads(out.strip().splitlines()[-1])
    assert code == 0 and summary["stopped_by_marker"] and summary["mode"] == "continuous", out
    assert load_checkpoint(checkpoint).uncommitted_batches == []
    assert not load_registry(running).stop_marker("page_counts").exists()
    assert _state_and_rows(spark, running) == _state_and_rows(spark, control)


def _last_watermark(checkpoint) -> int:
    cp = load_checkpoint(checkpoint)
    return cp.offsets[cp.last_committed_batch].watermark_ms


def _state_and_rows(spark, registry: Path) -> tuple:
    """(state checksums, every output row) of page_counts: what a query holds and wrote,
    whatever its batches were numbered."""
    _, state, output = state_and_output(spark, registry, "page_counts")
    return state, sorted(row for rows in output.values() for row in rows)
