"""The approval step before an irreversible step of a manual DAG: Airflow's human-in-the-loop
``ApprovalOperator``, asking only where the query's registry entry says so
(:mod:`stateops.control.approval`), showing the plan and the backup, and ending the run on a
rejection or no answer, so that nothing irreversible happens unapproved.

Its answer comes from the UI (Browse > Required Actions, or the task's Required Actions tab)
or the REST API (``PATCH /api/v2/dags/{dag}/dagRuns/{run}/taskInstances/{task}/-1/hitlDetails``
with ``{"chosen_options": ["Approve"]}`` or ``["Reject"]``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from airflow.providers.standard.operators.hitl import ApprovalOperator, HITLOperator
from airflow.sdk.exceptions import AirflowFailException

from stateops.control.approval import (
    TIMEOUT,
    TIMEOUT_TEXT,
    ApprovalRequest,
    refusal,
    respondents,
    unaccepted,
    without_approval,
)
from stateops.core.errors import one_line
from stateops.core.registry import Source, load_registry
from stateops_airflow.tasks import one_line_errors, say

__all__ = [
    "ApprovalGate",
    "approved",
    "ask_backfill",
    "ask_migration_stop",
    "ask_repartition",
    "ask_restore",
    "ask_switch",
    "ask_upgrade_stop",
    "renew_hold",
]


class ApprovalGate(ApprovalOperator):
    """Waits for an approval of ``operation`` where ``ask(context)`` (an ApprovalRequest, or a
    line saying why there is nothing to approve) and the query's registry entry call for one;
    else it says why in the log and the run goes on. Approved: returns who approved (see
    :func:`approved`). Rejected or unanswered within :data:`stateops.control.approval.TIMEOUT`:
    fails with ``on_reject``, without retries (a retry is for a fault while asking).
    ``ask`` only reads (it is asked again for the answer's approvers); ``renew(context)``, if
    given, runs before the request is made (a hold renewed to outlast the wait)."""

    def __init__(
        self,
        *,
        operation: str,
        ask: Callable[[Any], ApprovalRequest | str],
        on_reject: str,
        renew: Callable[[Any], None] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(
            subject=f"Approve the {operation}?",  # the request's own when it asks
            response_timeout=TIMEOUT,
            **kwargs,
        )
        self.operation, self.ask, self.on_reject = operation, ask, on_reject
        self.renew = renew

    def execute(self, context: Any) -> Any:
        asked = one_line_errors(self.ask)(context)
        needless = (
            asked if isinstance(asked, str) else without_approval(asked.query, self.operation)
        )
        if needless:
            say(needless)
            return {"approved_by": None, "reason": needless}
        if self.renew is not None:
            one_line_errors(self.renew)(context)
        self.subject, self.body = asked.subject(self.operation), asked.body(self.on_reject)
        self.assigned_users = one_line_errors(respondents)(asked.query, _triggerer(context))
        who = ", ".join(u["name"] for u in self.assigned_users or []) or "anyone who may act"
        self.notifiers = _approvers_notified(asked.query, self.subject)
        say(
            f"{self.subject} Waiting for an answer in Airflow's required actions (or over "
            f"REST) for up to {TIMEOUT_TEXT}, from {who}; rejected or unanswered: "
            f"{self.on_reject}"
        )
        return super().execute(context)

    def execute_complete(self, context: Any, event: dict[str, Any]) -> Any:
        query = context["params"]["query"]
        if event.get("error_type") == "timeout":
            answer = f"not answered within {TIMEOUT_TEXT}"
            raise AirflowFailException(refusal(self.operation, query, answer, self.on_reject))
        # The base class checks the answer; ApprovalOperator's own would skip the steps after
        # it on a rejection and leave the run green.
        answer = HITLOperator.execute_complete(self, context, event)
        who = (answer["responded_by_user"] or {}).get("name") or "an unknown user"
        if answer["chosen_options"] != [self.APPROVE]:
            raise AirflowFailException(
                refusal(self.operation, query, f"rejected by {who}", self.on_reject)
            )
        asked = one_line_errors(self.ask)(context)  # whose approvers: as when it asked
        if not isinstance(asked, str):
            why = unaccepted(asked.query, answer["responded_by_user"], _triggerer(context))
            if why:
                raise AirflowFailException(refusal(self.operation, query, why, self.on_reject))
        say(f"the {self.operation} of {query} was approved by {who}")
        return {"approved_by": who, "at": answer["responded_at"].isoformat()}


def _triggerer(context: Any) -> str | None:
    """Who triggered the run (None: the scheduler)."""
    return getattr(context.get("dag_run"), "triggering_user_name", None)


def _approvers_notified(query: Any, subject: str) -> list[Callable[[Any], None]]:
    """The registry's notifier (``alerts.notifier``), called once the request is made, with an
    ``alert`` of rule ``approval`` and state ``requested`` (docs/alerts.md); none without one."""
    from stateops.alerts import Alert, notifier_for

    registry = load_registry(switched=False)
    if registry.alerts.notifier is None:
        return []
    alert = Alert(query.name, "approval", "requested", "ASK", subject).as_dict()

    def notify(context: Any) -> None:
        # A webhook that is down must not stop the request: it is in the required actions.
        try:
            notifier_for(registry)({**context, "alert": alert})
        except Exception as err:  # any notifier's own error
            say(
                f"the approvers were not notified ({one_line(err)}); the request waits all the same"
            )

    return [notify]


def approved(context: Any, gate: str) -> bool:
    """Whether approval step ``gate`` of this run let the steps after it go (approved, or no
    approval needed): if not, none of them ran."""
    return context["ti"].xcom_pull(task_ids=gate) is not None


# What each manual DAG's approval step asks, from its plan step's result.


def _result(context: Any, task_id: str = "plan") -> dict[str, Any]:
    return context["ti"].xcom_pull(task_ids=task_id)


def ask_migration_stop(context: Any) -> ApprovalRequest:
    """Before the migration stops the query and drains its old source."""
    from stateops.ops.migration import format_migration_plan

    plan = _result(context, "preflight")
    new = plan["new"]["source"]
    return ApprovalRequest(
        load_registry().query(plan["query"]),
        step=f"stop it, drain its old source, carry its state to {new['format']} "
        f"{Source.model_validate(new).where}",
        plan=format_migration_plan(plan, dry_run=False),
        backup=f"taken after the drain, to {plan['backup_to']}",
    )


def ask_upgrade_stop(context: Any) -> ApprovalRequest:
    """Before the code upgrade stops the query and rewrites its state."""
    from stateops.ops.upgrade import format_upgrade_plan

    plan = _result(context, "preflight")
    return ApprovalRequest(
        load_registry().query(plan["query"]),
        step=f"stop it, rewrite its state for its new code into {plan['new']['checkpoint']}",
        plan=format_upgrade_plan(plan, dry_run=False),
        backup=f"taken after the stop, to {plan['backup_to']}",
    )


def _carry_plan(plan: dict[str, Any]) -> str:
    """A migration's or a code upgrade's plan, as its preflight printed it."""
    from stateops.ops.migration import format_migration_plan
    from stateops.ops.upgrade import format_upgrade_plan

    upgrade = plan.get("operation") == "upgrade"
    return (format_upgrade_plan if upgrade else format_migration_plan)(plan, dry_run=False)


def renew_hold(context: Any) -> None:
    """Before the switch's request: the run's hold renewed, since the query stays held while
    the request waits (the hold outlasts :data:`TIMEOUT`)."""
    from stateops.control.target import query_target
    from stateops.ops.migration import prepare_migration

    plan = _result(context, "preflight")
    prepare_migration(query_target(None, plan["query"]), plan)


def ask_switch(context: Any) -> ApprovalRequest:
    """Before a migrated (or upgraded) query is switched to its new checkpoint (its hold
    renewed first: :func:`renew_hold`)."""
    from stateops.control.target import query_target

    plan = _result(context, "preflight")
    target = query_target(None, plan["query"])
    settled, proof = _result(context, "backup"), _result(context, "prove")["proof"]
    return ApprovalRequest(
        target.require_query("a registered query"),
        step=f"switch it to {plan['new']['checkpoint']}, its carried state proven",
        plan=_carry_plan(plan) + f"\n  proven: {proof['variables']} ({proof['proof_file']})",
        backup=f"{settled['backup_id']} in {plan['backup_to']}",
    )


def ask_backfill(context: Any) -> ApprovalRequest:
    """Before the backfill's rollback."""
    plan = _result(context)
    return ApprovalRequest(
        load_registry().query(plan["query"]),
        step=f"roll it back to batch {plan['to_batch']} and reprocess what follows",
        plan=plan["text"],
        backup=f"taken before the rollback, to {plan['backup_to']}",
    )


def ask_restore(context: Any) -> ApprovalRequest | str:
    """Before a restore over an existing checkpoint (into a new or empty folder: none)."""
    from stateops.ops.restore import format_restore_plan

    plan = _result(context)
    if plan["target_contents"] == "none" or plan["already_restored"]:
        return f"{plan['target']}: nothing there is replaced; the restore needs no approval"
    backup = plan["backup"]
    return ApprovalRequest(
        load_registry().query(plan["owner"] or context["params"]["query"]),
        step=f"replace {plan['target']} with backup {backup['backup_id']}",
        plan=format_restore_plan(plan, dry_run=False),
        backup=f"restores {backup['backup_id']} (batch {backup['batch_id']}); the target's "
        "files are moved aside to <target>.replaced-<time>, never deleted",
    )


def ask_repartition(context: Any) -> ApprovalRequest:
    """Before the repartition's backup and Spark's repartition."""
    from stateops.ops.repartition import format_repartition_plan

    plan = _result(context)
    return ApprovalRequest(
        load_registry().query(context["params"]["query"]),
        step=f"repartition its state {plan['partitions_before']} -> {plan['partitions']}",
        plan=format_repartition_plan(plan, dry_run=False),
        backup=f"taken before anything changes, to {plan['backup_to']}",
    )
