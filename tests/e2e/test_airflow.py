"""`make airflow` as a newcomer uses it: the script behind it (scripts/airflow.sh) starts airflow
standalone, a Spark standalone master and worker and the embedded S3 endpoint on free loopback
ports; the tests then use it through the REST API v2 and through a real browser (Debian's
Chromium, headless, driven by Playwright), and `make airflow-stop` (the script's `stop`) must
leave no process behind.

The tests run in file order on one stack: the browser dry-runs the migration form, bad form
values are refused, a migration is rejected over REST (nothing changes; its triggerer may not
answer: the query's approvers refuse the triggerer, another person answers), another is
approved twice in the browser's required actions by another person than its triggerer and
runs for real (on the Spark cluster), the browser
looks at the Streaming state view, then everything stops. Screenshots go to build/test-artifacts/.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
import urllib.error
import urllib.request
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from stateops.core.checkpoint import load_checkpoint
from stateops.core.report import checkpoint_report
from stateops.dev.airflow_dags import api_call as _request
from stateops.dev.airflow_dags import api_token
from stateops.dev.s3server import free_port
from tests.conftest import ROOT, S3_KEY, S3_SECRET, S3Server, chromium, tree_digest
from tests.spark.harness import read_sink
from tests.spark.migrations import Migration, assert_migrated, uninterrupted

pytestmark = [pytest.mark.e2e, pytest.mark.whole]

PASSWORD = "stateops-test-admin"
ARTIFACTS = ROOT / "build" / "test-artifacts"
DAG = "stream_source_migration"
# Two people: admin triggers, bob answers (the query's approvers refuse the triggerer).
USERS = ("admin", "bob")
APPROVERS = {"users": list(USERS), "not_the_triggerer": True}
# The manual DAGs only: an unpaused scheduled DAG would start a run at once, beside the tests'.
UNPAUSE = (
    "stream_source_migration stream_bootstrap stream_restore stream_backfill stream_repartition"
)


@dataclass
class Stack:
    base: str
    env: dict[str, str]
    proc: subprocess.Popen
    log: Path
    run_dir: Path
    migration: Migration
    whole: object
    pids: dict[str, int] | None = None

    def output(self) -> str:
        return self.log.read_text()

    @property
    def scheduler_log(self) -> Path:
        return self.run_dir / "airflow.log"  # make airflow's standalone output

    def token(self, user: str = "admin") -> str:
        return api_token(self.base, PASSWORD, user)

    def stop(self) -> subprocess.CompletedProcess:
        """`make airflow-stop`: the script's stop, from another shell."""
        return subprocess.run(
            ["scripts/airflow.sh", "stop"],
            cwd=ROOT,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=300,
        )


def _until(what: str, check, timeout: float, log) -> object:
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            result = check()
            if result:
                return result
        except (OSError, urllib.error.HTTPError, KeyError):
            pass
        time.sleep(2)
    raise AssertionError(f"{what} within {timeout:.0f} s; output:\n{log()[-5000:]}")


def _alive(sessions: set[int]) -> list[str]:
    """Processes of these sessions still alive (zombies waiting for a reaper are not)."""
    out = subprocess.run(
        ["ps", "-eo", "pid=,sid=,stat=,args="], capture_output=True, text=True
    ).stdout
    return [
        line.strip()
        for line in out.splitlines()
        if int(line.split()[1]) in sessions and line.split()[2][0] != "Z"
    ]


@pytest.fixture(scope="module")
def stack(spark, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("make-airflow")
    whole = uninterrupted(spark, tmp, "user_sessions")
    ports = {
        name: free_port()
        for name in ("AIRFLOW", "SPARK", "SPARK_UI", "SPARK_WORKER_UI", "S3", "KAFKA")
    }
    s3 = S3Server(tmp / "s3", ports["S3"])  # started by the script; the tests list backups
    # Approval as a migration asks by default: a second person answers (the tests below).
    migration = Migration(spark, tmp, "user_sessions", s3, approval="required", approvers=APPROVERS)
    env = {
        **os.environ,
        "AIRFLOW_HOME": str(tmp / "airflow"),
        "STATEOPS_REGISTRY": str(migration.path),
        "STATEOPS_DATA_DIR": str(tmp),
        "STATEOPS_ADMIN_PASSWORD": PASSWORD,
        "STATEOPS_AIRFLOW_USERS": " ".join(USERS),
        "STATEOPS_UNPAUSE": UNPAUSE,
        "AWS_ACCESS_KEY_ID": S3_KEY,
        "AWS_SECRET_ACCESS_KEY": S3_SECRET,
        **{f"STATEOPS_{name}_PORT": str(port) for name, port in ports.items()},
    }
    for name in (
        "STATEOPS_S3_ENDPOINT_URL",
        "STATEOPS_KAFKA_BOOTSTRAP_SERVERS",  # a test session's broker: the script starts its own
        "AIRFLOW_CONN_SPARK_DEFAULT",
        "AIRFLOW_CONN_AWS_DEFAULT",
        "AIRFLOW_CONN_KAFKA_DEFAULT",
    ):
        env.pop(name, None)  # the script's own, as for a newcomer
    log = tmp / "make-airflow.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(
            ["scripts/airflow.sh"],
            cwd=ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    stack = Stack(
        f"http://127.0.0.1:{ports['AIRFLOW']}",
        env,
        proc,
        log,
        tmp / "_stateops" / "airflow",
        migration,
        whole,
    )

    def ready() -> bool:
        if proc.poll() is not None:  # said at once, not after the 300 s
            raise AssertionError(
                f"make airflow exited {proc.returncode}:\n{stack.output()[-5000:]}"
            )
        return "stops everything" in stack.output()

    try:
        _until("make airflow did not say it is ready", ready, 300, stack.output)
        stack.pids = {p.stem: int(p.read_text()) for p in stack.run_dir.glob("*.pid")}
        yield stack
    finally:
        if proc.poll() is None:
            stack.stop()
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()


@contextmanager
def _browser(stack: Stack, name: str, user: str = "admin"):
    """A page of headless Chromium, ``user`` logged in; a screenshot of it is kept even on
    failure."""
    from playwright.sync_api import sync_playwright

    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as p:
        browser = chromium(p)
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        # A person waits for a page; on 2 loaded cores the UI took longer than 30 s to open
        # a run it had just created (a clean run here failed so).
        page.set_default_timeout(90_000)
        try:
            page.goto(stack.base)
            page.fill("input[name=username]", user)
            page.fill("input[name=password]", PASSWORD)
            page.get_by_role("button", name="Sign in").click()
            page.get_by_role("button", name="Browse").wait_for()
            yield page
        finally:
            page.screenshot(path=ARTIFACTS / f"{name}.png")
            browser.close()


def test_the_stack_is_up_with_every_lifecycle_dag(stack):
    out = stack.output()
    assert f"Airflow UI    {stack.base}   (login: admin, bob / {PASSWORD})" in out, out
    # The banner's CLI line is all another shell needs to reach this stack's S3 endpoint.
    [cli] = [
        line.split("CLI", 1)[1].strip() for line in out.splitlines() if line.startswith("  CLI ")
    ]
    clean = {
        k: v
        for k, v in stack.env.items()  # the shell that ran make airflow, less ours
        if not k.startswith(("STATEOPS_", "AIRFLOW_CONN_"))
    }
    command = f"{cli}; stateops backups list user_sessions --json"
    listed = subprocess.run(
        ["bash", "-c", command], cwd=ROOT, env=clean, capture_output=True, text=True, timeout=60
    )
    assert listed.returncode == 0 and json.loads(listed.stdout) == [], listed.stderr
    token = stack.token()
    dags = {
        d["dag_id"]: d for d in _request(f"{stack.base}/api/v2/dags?limit=100", token=token)["dags"]
    }
    lifecycle = sorted(p.stem for p in (ROOT / "dags").glob("stream_*.py"))
    assert sorted(d for d in dags if d.startswith("stream_")) == lifecycle
    assert sorted(d for d in lifecycle if not dags[d]["is_paused"]) == sorted(UNPAUSE.split())
    assert set(stack.pids) == {"airflow", "spark-master", "spark-worker", "s3", "kafka"}
    assert f"Kafka broker  127.0.0.1:{stack.env['STATEOPS_KAFKA_PORT']}" in out, out
    master = _request(f"http://127.0.0.1:{stack.env['STATEOPS_SPARK_UI_PORT']}/json/")
    assert master["status"] == "ALIVE" and len(master["workers"]) == 1, master


def test_browser_fills_the_migration_form_and_sees_the_dry_run_succeed(stack):
    with _browser(stack, "1-migration-form") as page:
        page.goto(f"{stack.base}/dags/{DAG}")
        page.get_by_role("button", name="Trigger").click()
        form = page.get_by_role("dialog")
        form.get_by_role("combobox").first.click()
        page.get_by_role("option", name="user_sessions").click()
        form.locator("#element_new_source_path").fill("landing_v2/user_sessions")
        assert form.locator("input[name=element_dry_run]").is_checked(), "dry run by default"
        page.screenshot(path=ARTIFACTS / "0-migration-form-filled.png")
        form.get_by_role("button", name="Trigger").click()
        page.wait_for_url(f"**/dags/{DAG}/runs/manual__*")
        run_id = page.url.rsplit("/runs/", 1)[1]
        run_url = f"{stack.base}/api/v2/dags/{DAG}/dagRuns/{run_id}"
        token = stack.token()
        state = _until(
            "the dry run did not finish",
            lambda: (s := _request(run_url, token=token)["state"]) in ("success", "failed") and s,
            300,
            stack.output,
        )
        run = _request(run_url, token=token)
        assert run["conf"]["query"] == "user_sessions" and run["conf"]["dry_run"] is True
        assert state == "success", run
        page.reload()
        page.get_by_text("Success").first.wait_for()  # the run page shows its outcome
    # The plan is in the task's log in order: before Airflow's "Post Execute" group, not
    # under it; it says DRY RUN first and ends in the irreversible / backup / undo lines.
    [log] = (Path(stack.env["AIRFLOW_HOME"]) / "logs").rglob(
        f"run_id={run_id}/task_id=preflight/attempt=1.log"
    )
    events = [json.loads(line).get("event", "") for line in log.read_text().splitlines()]
    [plan] = [e for e in events if e.startswith("DRY RUN: nothing changed: migration of ")]
    assert events.index(plan) < events.index("::group::Post Execute"), events
    assert [line.split(":")[0] for line in plan.splitlines()[-3:]] == [
        "  irreversible",
        "  backup",
        "  undo",
    ], plan
    [gate] = log.parent.parent.glob("task_id=not_a_dry_run/attempt=1.log")  # says why it skips
    assert "dry run: the plan above is all this run does" in gate.read_text()
    checkpoint = load_checkpoint(stack.migration.query().checkpoint)
    assert checkpoint.root.name == "user_sessions", "a dry run changes nothing"


# Each kind of bad value the manual forms take: (DAG, conf, the start of the one line back).
BAD_FORMS = [
    (
        "stream_backfill",
        {"query": "user_sessions"},
        "to_batch, input_before: give one of them, the last batch to keep or a time",
    ),
    (
        "stream_backfill",
        {"query": "user_sessions", "to_batch": 1, "input_before": "2026-01-01"},
        "to_batch, input_before: give one of them",
    ),
    (
        "stream_backfill",
        {"query": "user_sessions", "input_before": "yesterday 3am"},
        "input_before 'yesterday 3am' is not a time; write it like 2026-11-21T03:00:00Z",
    ),
    (
        "stream_backfill",
        {"query": "user_sessions", "to_batch": 999},
        "to_batch: 999 is not a committed batch of user_sessions (committed and kept: ",
    ),
    (
        "stream_backfill",
        {"query": "user_sessions", "to_batch": 1, "overrides": {"sink": {}}},
        "overrides: sink cannot be changed by a backfill",
    ),
    (
        "stream_source_migration",
        {"query": "user_sessions", "new_source_path": "no/such/folder"},
        "new_source_path: new source path ",
    ),
    (
        "stream_source_migration",
        {
            "query": "user_sessions",
            "cutover": "yesterday 3am",
            "new_source_path": "landing_v2/user_sessions",
        },
        "cutover 'yesterday 3am' is not a time",
    ),
]


def test_bad_form_values_are_refused_before_a_run_with_the_field_named(stack):
    """Over REST, each kind of bad value gets 400 and one line that names the field and the
    fix (not the JSON schema's text), no run is created, no retry is possible and the
    checkpoint is byte-identical; in the browser, the trigger dialogs of the backfill and the
    migration show the same line."""
    token, checkpoint = stack.token(), Path(stack.migration.query().checkpoint)
    before = tree_digest(checkpoint)
    runs = {
        dag: _request(f"{stack.base}/api/v2/dags/{dag}/dagRuns", token=token)["total_entries"]
        for dag in ("stream_backfill", DAG)
    }
    for dag, conf, start in BAD_FORMS:
        with pytest.raises(urllib.error.HTTPError) as refused:
            _request(
                f"{stack.base}/api/v2/dags/{dag}/dagRuns",
                "POST",
                {"logical_date": None, "conf": conf},
                token=token,
            )
        detail = json.loads(refused.value.read())["detail"]
        assert refused.value.code == 400 and detail.startswith(start), (conf, detail)
        assert "\n" not in detail and "Failed validating" not in detail, detail
    for dag, count in runs.items():
        assert (
            _request(f"{stack.base}/api/v2/dags/{dag}/dagRuns", token=token)["total_entries"]
            == count
        ), f"{dag}: a refused trigger created a run"
    with _browser(stack, "2-bad-forms") as page:
        for dag, field, value, start in [
            ("stream_backfill", "input_before", "yesterday 3am", BAD_FORMS[2][2]),
            (DAG, "new_source_path", "no/such/folder", BAD_FORMS[5][2]),
        ]:
            page.goto(f"{stack.base}/dags/{dag}")
            page.get_by_role("button", name="Trigger").click()
            form = page.get_by_role("dialog")
            form.get_by_role("combobox").first.click()
            page.get_by_role("option", name="user_sessions").click()
            form.locator(f"#element_{field}").fill(value)
            form.get_by_role("button", name="Trigger").click()
            said = form.get_by_text(start)  # the dialog stays open, saying what to fix
            said.wait_for()
            said.scroll_into_view_if_needed()
            page.screenshot(path=ARTIFACTS / f"2-bad-form-{dag}.png")
            page.keyboard.press("Escape")
    assert tree_digest(checkpoint) == before


def _awaiting(run_url: str, task: str, token: str, scheduler_log: Path, log) -> dict:
    """The approval request of ``task``, once the run waits for it (``scheduler_log``: the
    scheduler's output; ``log``: what to show if it does not come)."""

    # The steps before an approval may take long (a migration's, on 2 loaded cores: 8.6 of
    # 10 minutes in a clean run here); a run that ended first (a step failed) is said at once.
    def asking() -> bool:
        if _request(f"{run_url}/taskInstances/{task}", token=token)["state"] == "awaiting_input":
            return True
        if (run := _request(run_url, token=token))["state"] in ("success", "failed"):
            tis = _request(f"{run_url}/taskInstances", token=token)["task_instances"]
            states = {t["task_id"]: t["state"] for t in tis}
            raise AssertionError(f"the run ended {run['state']} before {task} asked: {states}")
        return False

    _until(f"{task} did not wait for an answer", asking, 900, log)
    # Airflow 3.3 fails a step answered before the scheduler has heard from the executor that
    # the parked process ended ("finished with state success, but the task instance's state
    # attribute is queued": Marking task as FAILED); on a loaded machine that took 5 s. A person
    # is slower than that; a test answering at once waits for the scheduler's line.
    dag, run_id = run_url.split("/dags/")[1].split("/dagRuns/")
    heard = f"TaskInstance Finished: dag_id={dag}, task_id={task}, run_id={run_id},"
    _until(
        f"the scheduler did not hear that {task} was parked",
        lambda: heard in scheduler_log.read_text(),
        120,
        log,
    )
    return _request(f"{run_url}/taskInstances/{task}/-1/hitlDetails", token=token)


def _finished(stack: Stack, run_url: str, token: str) -> tuple[str, dict[str, str]]:
    state = _until(
        "the run did not finish",
        lambda: (s := _request(run_url, token=token)["state"]) in ("success", "failed") and s,
        900,
        stack.output,
    )
    tasks = _request(f"{run_url}/taskInstances", token=token)["task_instances"]
    return state, {t["task_id"]: t["state"] for t in tasks}


def test_a_migration_rejected_over_rest_changes_nothing(stack):
    """The migration waits for a second person before it stops the query, showing the plan
    and where the backup goes; the person who triggered it may not answer (Airflow refuses
    them: the request is assigned to the others); rejected over REST by another, the run fails
    saying so, nothing ran after the approval step, and the checkpoint is byte-identical."""
    m, token = stack.migration, stack.token()
    checkpoint = Path(m.query().checkpoint)
    before = tree_digest(checkpoint)
    dag_url = f"{stack.base}/api/v2/dags/{DAG}"
    run = _request(
        f"{dag_url}/dagRuns", "POST", {"logical_date": None, "conf": m.conf()}, token=token
    )
    run_url = f"{dag_url}/dagRuns/{run['dag_run_id']}"
    asked = _awaiting(run_url, "approve_stop", token, stack.scheduler_log, stack.output)
    assert asked["options"] == ["Approve", "Reject"], asked
    assert asked["subject"].startswith("Approve the migration of user_sessions: stop it"), asked
    body = asked["body"]
    assert "`PLAN: migration of user_sessions: json " in body, body
    backup = f"taken after the drain, to s3://backups/{m.root.name}/user_sessions"
    assert f"**Backup:** `{backup}`" in body and "- `undo: " in body, body
    assert [u["id"] for u in asked["assigned_users"]] == ["bob"], asked
    answer = f"{run_url}/taskInstances/approve_stop/-1/hitlDetails"
    with pytest.raises(urllib.error.HTTPError) as refused:  # the triggerer answers
        _request(answer, "PATCH", {"chosen_options": ["Approve"], "params_input": {}}, token=token)
    assert refused.value.code == 403, refused.value
    assert _request(f"{run_url}/taskInstances/approve_stop", token=token)["state"] == (
        "awaiting_input"
    )
    reject = {"chosen_options": ["Reject"], "params_input": {}}
    _request(answer, "PATCH", reject, token=stack.token("bob"))
    state, states = _finished(stack, run_url, token)
    assert state == "failed", states
    assert (states["approve_stop"], states["stop_query"], states["roll_back"]) == (
        "failed",
        "upstream_failed",
        "skipped",
    ), states
    logs = Path(stack.env["AIRFLOW_HOME"]) / "logs"
    [log] = logs.rglob(f"run_id={run['dag_run_id']}/task_id=approve_stop/attempt=1.log")
    said = "the migration of user_sessions was rejected by bob: nothing changed"
    _until(
        "the approval step's log did not say why",
        lambda: said in log.read_text(),
        60,
        log.read_text,
    )  # the resumed step's lines land after the run's end
    assert tree_digest(checkpoint) == before, "a rejected migration changed the checkpoint"
    assert m.query().checkpoint == str(checkpoint), "the query did not move"


def test_rest_api_triggers_the_migration_approved_in_the_browser_and_it_succeeds(stack, spark):
    """Both approvals of the migration (before the stop, before the switch) are given in the
    UI's required actions by another person than the one who triggered it; the migration then
    runs on the Spark cluster."""
    m, token = stack.migration, stack.token()
    dag_url = f"{stack.base}/api/v2/dags/{DAG}"
    run = _request(
        f"{dag_url}/dagRuns", "POST", {"logical_date": None, "conf": m.conf()}, token=token
    )
    run_url = f"{dag_url}/dagRuns/{run['dag_run_id']}"
    with _browser(stack, "3-approvals", user="bob") as page:
        for gate, says in [
            ("approve_stop", "stop it, drain its old source"),
            ("approve_switch", "its carried state proven"),
        ]:
            asked = _awaiting(run_url, gate, token, stack.scheduler_log, stack.output)
            assert says in asked["subject"], asked
            page.goto(
                f"{stack.base}/dags/{DAG}/runs/{run['dag_run_id']}/tasks/{gate}/required_actions"
            )
            page.get_by_text(asked["subject"]).first.wait_for()
            page.screenshot(path=ARTIFACTS / f"3-{gate}.png")
            page.get_by_role("button", name="Approve").click()
            _until(
                f"{gate} was not approved",
                lambda gate=gate: (
                    _request(f"{run_url}/taskInstances/{gate}", token=token)["state"] == "success"
                ),
                120,
                stack.output,
            )
    state, states = _finished(stack, run_url, token)
    assert state == "success", states
    assert states["roll_back"] == "skipped" and states["switch"] == "success", states
    assert states["transplant"] == "success" and states["bootstrap"] == "skipped", states
    logs = "\n".join(
        p.read_text()
        for p in (Path(stack.env["AIRFLOW_HOME"]) / "logs").rglob(
            f"run_id={run['dag_run_id']}/**/*.log"
        )
    )
    assert "spark://127.0.0.1:" in logs, "the Spark jobs ran on the standalone cluster"
    first_new = assert_migrated(spark, m, stack.whole, logs, "transplant")
    carried = [
        r
        for b, rows in read_sink(Path(m.query().sink.path)).items()
        if b >= first_new
        for r in rows
        if r[4].startswith("e0-")
    ]
    assert carried, "no session open at the cutover (round 0 events) closed on the new source"


def test_streaming_state_view_shows_the_last_committed_batch_and_the_lineage(stack):
    query = stack.migration.query()
    last = load_checkpoint(query.checkpoint).last_committed_batch
    # Input that landed two hours ago and was not read: the verdict is WARN, saying so.
    waiting = Path(query.source.path) / "late-arrival.parquet"
    waiting.write_bytes(next(Path(query.source.path).glob("*.parquet")).read_bytes())
    os.utime(waiting, (time.time() - 7200, time.time() - 7200))
    with _browser(stack, "2-streaming-state") as page:
        page.get_by_role("button", name="Browse").click()
        page.get_by_role("menuitem", name="Streaming state").click()
        page.wait_for_url("**/plugin/streaming-state")
        frame = page.frame_locator("iframe").first
        card = frame.locator("section#query-user_sessions")
        card.wait_for()
        text = card.inner_text()
        assert f"last committed batch\t{last} at " in text, text
        assert query.checkpoint in text and "parquet" in text, text
        assert "migration\tderived" in text, "the lineage shows the migration"
        assert "bytes per snapshot group" in text and "Data Docs" in text, text
        assert "1 input file of source landed and not read, the oldest 2 h ago" in text, text
        card.locator("svg.chart").first.wait_for()
        assert card.get_by_role("link", name="backfill").get_attribute("href") == (
            "../dags/stream_backfill"
        )  # its trigger forms and runs, in Airflow
        page.screenshot(path=ARTIFACTS / "streaming-state-light.png")
        # Airflow's dark theme: the view follows it (the class on the UI's <html>).
        page.emulate_media(color_scheme="dark")
        frame.locator("html.dark").wait_for(state="attached")
        page.screenshot(path=ARTIFACTS / "streaming-state-dark.png")
    # The view's API is behind Airflow's login, like the UI.
    with pytest.raises(urllib.error.HTTPError) as refused:
        _request(f"{stack.base}/stateops/api/status")
    assert refused.value.code in (401, 403)
    shown = _request(f"{stack.base}/stateops/api/status", token=stack.token())
    sessions = next(s for s in shown if s["query"] == "user_sessions")
    assert sessions["last_committed_batch"] == last and sessions["backups"], sessions
    # Its verdict leads the card, with its reasons (the rules: tests/unit/test_health.py).
    # Its snapshot groups are the checkpoint model's, by the query's own minDeltasForSnapshot
    # (several after these batches; Spark's default K would have shown one).
    k = query.state_store.min_deltas_for_snapshot
    [model] = checkpoint_report(load_checkpoint(query.checkpoint), k)["operators"]
    groups = [g["group_id"] for g in sessions["operators"][0]["snapshot_groups"]]
    assert groups == [g["group_id"] for g in model["snapshot_groups"]] and len(groups) > 1, groups
    lines = [line for line in text.splitlines() if line.strip()]
    assert lines[:2] == ["user_sessions", "WARN"], lines[:4]
    assert sessions["health"]["verdict"] == "WARN", sessions["health"]


def test_make_airflow_stop_stops_everything(stack):
    sessions = {stack.proc.pid, *stack.pids.values()}
    stopped = stack.stop()
    assert stopped.returncode == 0 and "stopped" in stopped.stdout, stopped.stderr
    assert stack.proc.wait(timeout=60) == 0, stack.output()[-3000:]
    deadline = time.time() + 30
    while (left := _alive(sessions)) and time.time() < deadline:
        time.sleep(2)
    assert not left, f"processes left after make airflow-stop: {left}"
    assert not list(stack.run_dir.glob("*.pid")), "pid files left"
