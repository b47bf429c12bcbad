"""Approval before irreversible steps (issue 20, item 3): who must approve (the registry's
``approval`` per query; unset, a migration asks and the rest do not), what the approver sees,
and how the approval step ends a run on a rejection or no answer. The step waiting in a real
Airflow and answered from the UI and over REST: tests/e2e/test_airflow.py."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
import yaml
from airflow.sdk import BaseNotifier
from airflow.sdk.exceptions import AirflowFailException

from stateops.control.approval import (
    OPERATIONS,
    TIMEOUT,
    ApprovalRequest,
    respondents,
    unaccepted,
    without_approval,
)
from stateops.core.errors import RegistryError, StateOpsError
from stateops.core.registry import load_registry
from stateops_airflow.approval import ApprovalGate
from tests.conftest import write_registry

pytestmark = pytest.mark.unit


def _query(tmp_path, approval: str | None):
    overrides = {} if approval is None else {"page_visits": {"approval": approval}}
    return load_registry(write_registry(tmp_path, **overrides)).query("page_visits")


@pytest.mark.parametrize(
    ("approval", "asks"),
    [
        (None, {"migration", "upgrade"}),  # the default: the operations that switch checkpoints
        ("required", set(OPERATIONS)),
        ("none", set()),
    ],
)
def test_the_registry_says_which_operations_wait_for_an_approval(tmp_path, approval, asks):
    query = _query(tmp_path, approval)
    assert {op for op in OPERATIONS if without_approval(query, op) is None} == asks
    for op in set(OPERATIONS) - asks:
        said = without_approval(query, op)
        assert said.startswith(f"page_visits: the {op} goes on without approval (registry: ")
        default = "only a migration and a code upgrade ask by default"
        assert ("approval: none" if approval else default) in said


def test_an_unknown_approval_setting_is_refused_when_the_registry_loads(tmp_path):
    path = write_registry(tmp_path)
    raw = yaml.safe_load(path.read_text())
    raw["queries"]["page_visits"]["approval"] = "sometimes"
    path.write_text(yaml.safe_dump(raw))
    with pytest.raises(RegistryError, match="approval"):
        load_registry(path).query("page_visits")


def test_the_request_shows_the_plan_the_backup_and_what_a_refusal_leaves(tmp_path):
    request = ApprovalRequest(
        _query(tmp_path, None),
        step="stop it",
        plan="PLAN: migration of page_visits\n  undo: stop it",
        backup="b-000004-20261125T000000Z in s3://backups/page_visits",
    )
    assert request.subject("migration") == "Approve the migration of page_visits: stop it?"
    body = request.body("nothing changed")
    assert "**Backup:** `b-000004-20261125T000000Z in s3://backups/page_visits`" in body
    assert "`PLAN: migration of page_visits`\n- `undo: stop it`" in body
    hours = int(TIMEOUT.total_seconds() // 3600)
    assert body.endswith(f"**Reject**, or no answer within {hours} hours: nothing changed.")


class _TaskInstance:
    def __init__(self, results: dict[str, object]) -> None:
        self.results = results

    def xcom_pull(self, task_ids: str) -> object:
        return self.results.get(task_ids)


def _gate(ask=lambda context: "never asked") -> ApprovalGate:
    return ApprovalGate(
        task_id="approve",
        operation="backfill",
        ask=ask,
        on_reject="nothing changed; the query goes on as it was",
    )


CONTEXT = {"params": {"query": "page_visits"}}


def _answer(option: str) -> dict:
    return {
        "chosen_options": [option],
        "params_input": {},
        "responded_at": datetime(2026, 11, 25, 3, 0, tzinfo=UTC),
        "responded_by_user": {"id": "7", "name": "oncall"},
    }


def test_an_approval_lets_the_steps_after_it_go_and_says_who_approved():
    done = _gate().execute_complete(CONTEXT, _answer("Approve"))
    assert done == {"approved_by": "oncall", "at": "2026-11-25T03:00:00+00:00"}


def test_a_rejection_or_no_answer_fails_the_step_saying_what_it_leaves():
    with pytest.raises(AirflowFailException) as refused:
        _gate().execute_complete(CONTEXT, _answer("Reject"))
    assert str(refused.value) == (
        "the backfill of page_visits was rejected by oncall: nothing changed; the query goes on "
        "as it was"
    )
    timed_out = {
        "error": "The Human-in-the-loop response timeout has passed without a response.",
        "error_type": "timeout",
    }
    with pytest.raises(
        AirflowFailException,
        match="^the backfill of page_visits was not answered within 4 hours: nothing changed",
    ):
        _gate().execute_complete(CONTEXT, timed_out)


def test_where_nothing_needs_approval_the_step_says_why_and_does_not_wait(tmp_path):
    query = _query(tmp_path, "none")
    ask = lambda context: ApprovalRequest(query, "roll it back", "PLAN: ...", "to s3://b")  # noqa: E731
    done = _gate(ask).execute({**CONTEXT, "ti": _TaskInstance({})})
    assert done["approved_by"] is None
    assert (
        done["reason"] == "page_visits: the backfill goes on without approval (registry: "
        "approval: none)"
    )
    # A restore into an empty folder: the ask itself says there is nothing to approve.
    done = _gate(lambda context: "nothing there is replaced").execute(CONTEXT)
    assert done == {"approved_by": None, "reason": "nothing there is replaced"}


class _DagRun:
    def __init__(self, triggered_by: str | None) -> None:
        self.triggering_user_name = triggered_by


def _approvers(tmp_path, **approvers):
    overrides = {"page_visits": {"approval": "required", "approvers": approvers}}
    return load_registry(write_registry(tmp_path, **overrides)).query("page_visits")


def test_an_approval_is_asked_of_the_named_approvers_but_the_one_who_triggered_the_run(tmp_path):
    """Airflow's API server answers anyone outside ``assigned_users`` 403 (issue 75 item 5)."""
    query = _approvers(tmp_path, users=["alice", "bob"], not_the_triggerer=True)
    assert respondents(query, "alice") == [{"id": "bob", "name": "bob"}]
    assert respondents(query, None) == [
        {"id": "alice", "name": "alice"},
        {"id": "bob", "name": "bob"},
    ]
    with pytest.raises(StateOpsError) as refused:
        respondents(_approvers(tmp_path, users=["alice"], not_the_triggerer=True), "alice")
    assert str(refused.value) == (
        "page_visits: its only approver, alice, triggered this run and may not approve it "
        "(approvers.not_the_triggerer): name another in approvers.users, or let another "
        "approver trigger it"
    )
    assert respondents(_approvers(tmp_path, not_the_triggerer=True), "alice") is None  # anyone


def test_an_approval_by_the_triggerer_or_by_someone_not_named_ends_the_run_unapproved(tmp_path):
    """Where the auth manager lets every user answer (the simple one with all admins), the
    step itself refuses an answer the registry does not accept."""
    query = _approvers(tmp_path, users=["alice", "bob"], not_the_triggerer=True)
    assert unaccepted(query, {"id": "bob", "name": "bob"}, "alice") == ""
    assert unaccepted(query, {"id": "alice", "name": "alice"}, "alice") == (
        "approved by alice, who triggered the run: another person must approve "
        "(approvers.not_the_triggerer)"
    )
    assert unaccepted(query, {"id": "7", "name": "oncall"}, "alice") == (
        "approved by oncall, who is not one of its approvers (alice, bob)"
    )
    anyone_else = _approvers(tmp_path, not_the_triggerer=True)
    assert unaccepted(anyone_else, {"id": "7", "name": "oncall"}, "alice") == ""
    assert "who triggered the run" in unaccepted(
        anyone_else, {"id": "7", "name": "oncall"}, "oncall"
    )

    ask = lambda context: ApprovalRequest(query, "roll it back", "PLAN: ...", "to s3://b")  # noqa: E731
    context = {**CONTEXT, "dag_run": _DagRun("oncall")}
    with pytest.raises(AirflowFailException) as refused:
        _gate(ask).execute_complete(context, _answer("Approve"))
    assert str(refused.value) == (
        "the backfill of page_visits was approved by oncall, who is not one of its approvers "
        "(alice, bob): nothing changed; the query goes on as it was"
    )
    by_bob = {**_answer("Approve"), "responded_by_user": {"id": "bob", "name": "bob"}}
    assert _gate(ask).execute_complete(context, by_bob)["approved_by"] == "bob"


class Recorded(BaseNotifier):
    """A notifier that keeps what it was sent."""

    sent: list = []

    def notify(self, context) -> None:
        Recorded.sent.append(context["alert"])


@pytest.mark.parametrize("args", [{}, {"nope": 1}], ids=["sent", "cannot be built"])
def test_the_approvers_are_told_of_a_request_and_a_notifier_that_fails_does_not_stop_it(
    tmp_path, monkeypatch, caplog, args
):
    from stateops_airflow.approval import _approvers_notified

    path = write_registry(tmp_path)
    raw = yaml.safe_load(path.read_text())
    raw["alerts"] = {"notifier": f"{__name__}.Recorded", "notifier_args": args}
    path.write_text(yaml.safe_dump(raw))
    monkeypatch.setenv("STATEOPS_REGISTRY", str(path))
    Recorded.sent.clear()
    query = load_registry(path).query("page_visits")
    (notify,) = _approvers_notified(query, "Approve the backfill of page_visits: roll it back?")
    with caplog.at_level("INFO", logger="stateops"):
        notify({})
    if args:
        assert Recorded.sent == []
        assert "the approvers were not notified (alerts.notifier_args: " in caplog.text
    else:
        (alert,) = Recorded.sent
        assert (alert["rule"], alert["state"], alert["level"]) == ("approval", "requested", "ASK")
        assert alert["text"] == (
            "[ASK] page_visits: Approve the backfill of page_visits: roll it back? "
            "(Airflow's required actions)"
        )


def test_the_hold_is_renewed_before_the_request_and_asking_again_changes_nothing(tmp_path):
    """The answer's approvers come from asking again: ``ask`` only reads; what changes state
    before the wait (the switch's hold) is ``renew``, run once, before the request."""
    calls = []
    query = _query(tmp_path, "required")

    def ask(context):
        calls.append("ask")
        return ApprovalRequest(query, "switch it", "PLAN: ...", "b-1")

    gate = ApprovalGate(
        task_id="approve",
        operation="migration",
        ask=ask,
        renew=lambda context: calls.append("renew"),
        on_reject="nothing changed",
    )
    gate.execute_complete({**CONTEXT, "dag_run": _DagRun("alice")}, _answer("Approve"))
    assert calls == ["ask"]  # the answer: asked again, nothing renewed
