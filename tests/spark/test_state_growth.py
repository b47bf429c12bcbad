"""The state growth rule on real runs (issue 57): a sessions query that forgets to remove the
sessions it timed out (tests/spark/leaky.py) against the same query that removes them, on the
same input, each run through run_query's own code; the figures are those Spark reported and
each run recorded in the query's history (stateops.control.history)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import yaml

from stateops.control.history import read_history
from stateops.core.registry import load_registry
from stateops.dev.sampledata import generate_events
from stateops.status import query_status
from tests.conftest import ROOT, chromium, write_registry
from tests.spark.harness import run_in_session

pytestmark = [pytest.mark.spark, pytest.mark.whole]
ROUNDS = 4
ARTIFACTS = ROOT / "build" / "test-artifacts"


def _land(landing: Path, round_: int) -> None:
    """The sample sessions' first file again, ``round_`` times two hours later and with users
    of its own: each round opens the same sessions as the first, and times out (watermark) those
    of the round before, whose users never come back."""
    [first] = generate_events(
        {"user_sessions": landing.parent / "first"}, events_per_file=40, users=12, files=1
    )["user_sessions"]
    later = timedelta(hours=2 * round_)
    lines = []
    for line in first.read_text().splitlines():
        event = json.loads(line)
        at = datetime.fromisoformat(event["event_time"].replace("Z", "+00:00")) + later
        event |= {"user_id": f"{event['user_id']}-r{round_}", "data": f"{event['data']}-r{round_}",
                  "event_time": at.strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"}  # fmt: skip
        lines.append(json.dumps(event) + "\n")
    landing.mkdir(parents=True, exist_ok=True)
    (landing / f"sessions-{round_}.json").write_text("".join(lines))


def _sessions(spark, root, processor_class: str) -> tuple[list[int], dict]:
    """user_sessions with ``processor_class``, run once per round: the state rows each run
    recorded, and the query's status."""
    processor = yaml.safe_load((ROOT / "registry.yaml").read_text())["queries"]["user_sessions"][
        "processor"
    ]
    entry = {
        "processor": {**processor, "class": processor_class},
        # any growth at all over the runs (a few seconds apart here) is over the limit
        "health": {"state_rows_per_hour": 1, "growth_window": "1 hour"},
    }
    registry = write_registry(root, user_sessions=entry)
    for round_ in range(ROUNDS):
        _land(root / "landing" / "user_sessions", round_)
        assert run_in_session(spark, registry, "user_sessions")["status"] == "succeeded"
    loaded = load_registry(registry)
    since = datetime.now(UTC) - timedelta(hours=1)
    points = read_history(loaded, "user_sessions", since)
    assert [p["source"] for p in points] == ["run"] * ROUNDS, points
    return [p["state_rows"] for p in points], query_status(
        loaded, "user_sessions", history=timedelta(hours=1)
    )


def _growth(status: dict) -> list[str]:
    return [f["reason"] for f in status["health"]["findings"] if f["rule"] == "state_growth"]


def test_state_that_leaks_is_said_to_grow_and_the_same_query_that_removes_it_is_not(
    spark, tmp_path
):
    leaky, leaking = _sessions(spark, tmp_path / "leaky", "tests.spark.leaky:ForgetfulUserSessions")
    fixed, removing = _sessions(
        spark, tmp_path / "fixed", "stateops.pipelines.user_sessions:UserSessionsProcessor"
    )
    # The leak: every round adds the sessions it timed out and kept, its users' keys.
    assert leaky == [leaky[0] * (n + 1) for n in range(ROUNDS)], leaky
    [said] = _growth(leaking)
    assert said.startswith(f"state rows grew from {leaky[0]} to {leaky[-1]} in "), said
    assert f"({ROUNDS} runs)" in said and "more than health.state_rows_per_hour (1)" in said
    assert [f["level"] for f in leaking["health"]["findings"] if f["rule"] == "state_growth"] == [
        "WARN"
    ]
    # The same input, its expired sessions removed: the same state after every round.
    assert fixed == [fixed[0]] * ROUNDS and 0 < fixed[0] < leaky[0], (fixed, leaky)
    assert _growth(removing) == []
    _seen_in_a_browser(
        {"leaky": leaking, "fixed": removing}, f"state rows: {leaky[0]} to {leaky[-1]}, "
    )


def _seen_in_a_browser(statuses: dict[str, dict], caption: str) -> None:
    """The Streaming state view's cards of ``statuses`` (with their history) in Chromium: the
    leaky query's state rows drawn over time, its caption starting with ``caption``; the
    screenshot is docs/images/state-growth.png's source."""
    from playwright.sync_api import sync_playwright

    from stateops_airflow.ui import _PAGE, _query_card

    page_file = ARTIFACTS / "state-growth.html"
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    cards = "".join(_query_card(s | {"query": name}) for name, s in statuses.items())
    page_file.write_text(_PAGE.format(body=cards))
    with sync_playwright() as p:
        browser = chromium(p)
        page = browser.new_page(viewport={"width": 900, "height": 700})
        page.goto(page_file.as_uri())
        card = page.locator("section#query-leaky")
        chart = card.get_by_role("img", name="state rows over time")
        assert chart.count() == 1 and chart.bounding_box()["width"] == 360
        said = card.locator("figcaption").first.inner_text()
        assert said.startswith(caption) and f"{ROUNDS} points, " in said, said
        assert "state rows grew from" in card.inner_text()  # the WARN leads the card
        card.screenshot(path=ARTIFACTS / "state-growth.png")
        browser.close()
