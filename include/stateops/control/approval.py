"""Approval before an irreversible step: whether someone must agree (the query's
registry setting ``approval: required | none``; unset, a migration and a code upgrade ask)
and what they are shown: the plan as printed, the backup, and what a rejection or no answer
leaves.

The asking and the answer are Airflow's (human-in-the-loop required actions, answered in the
UI or through the REST API); this module decides and words it, so the DAGs cannot drift apart.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

from stateops.core.errors import StateOpsError
from stateops.core.registry import Query

__all__ = [
    "OPERATIONS",
    "TIMEOUT",
    "ApprovalRequest",
    "refusal",
    "respondents",
    "unaccepted",
    "without_approval",
]

OPERATIONS = ("migration", "upgrade", "backfill", "restore", "repartition")
# Under the migration's 6-hour hold (stateops.control.lock.hold_query), which the step before
# the switch's approval renews: an unanswered request ends the run before the hold lapses.
TIMEOUT = timedelta(hours=4)
TIMEOUT_TEXT = f"{int(TIMEOUT.total_seconds() // 3600)} hours"


def without_approval(query: Query, operation: str) -> str | None:
    """None when ``operation`` of ``query`` waits for an approval; else the line that says why
    it goes on without one (for the task log)."""
    if operation not in OPERATIONS:
        raise ValueError(f"{operation!r} is not one of {OPERATIONS}")
    if query.needs_approval(operation):
        return None
    setting = (
        f"approval: {query.approval}"
        if query.approval
        else "no approval setting: only a migration and a code upgrade ask by default"
    )
    return f"{query.name}: the {operation} goes on without approval (registry: {setting})"


@dataclass(frozen=True)
class ApprovalRequest:
    """What an approver is asked about one step of an operation of ``query``."""

    query: Query
    step: str  # what an approval lets happen, e.g. "stop it and drain its old source"
    plan: str  # the plan as the task log shows it
    backup: str  # the backup's id, or where it goes

    def subject(self, operation: str) -> str:
        return f"Approve the {operation} of {self.query.name}: {self.step}?"

    def body(self, on_reject: str) -> str:
        """Markdown: the plan's lines as a list of code spans (Airflow's required actions
        join the lines of a fenced block, and would take ``<target>`` for HTML)."""
        head, *rest = self.plan.splitlines()
        return "\n\n".join(
            [
                f"**Backup:** `{self.backup}`",
                f"`{head}`\n" + "\n".join(f"- `{line.strip()}`" for line in rest),
                f"**Reject**, or no answer within {TIMEOUT_TEXT}: {on_reject}.",
            ]
        )


def refusal(operation: str, query: str, answer: str, on_reject: str) -> str:
    """The one line that ends a run whose approval was refused (``answer``: "rejected by NAME"
    or "not answered within N hours")."""
    return f"the {operation} of {query} was {answer}: {on_reject}"


def respondents(query: Query, triggered_by: str | None) -> list[dict[str, str]] | None:
    """Who may answer an approval of ``query`` in a run ``triggered_by`` (a user name, None
    for a scheduled run), as Airflow's human-in-the-loop ``assigned_users`` (its API server
    answers anyone else 403): the registry's ``approvers.users``, without the triggerer where
    ``approvers.not_the_triggerer``; None: anyone allowed to act on the DAG. A list that the
    triggerer alone made empty is refused in one line, before anyone is asked."""
    named = query.approvers.users
    users = [u for u in named if not (query.approvers.not_the_triggerer and u == triggered_by)]
    if named and not users:
        raise StateOpsError(
            f"{query.name}: its only approver, {triggered_by}, triggered this run and may not "
            "approve it (approvers.not_the_triggerer): name another in approvers.users, or let "
            "another approver trigger it"
        )
    return [{"id": u, "name": u} for u in users] or None


def unaccepted(query: Query, responder: dict[str, str] | None, triggered_by: str | None) -> str:
    """Why an approval given by ``responder`` (Airflow's ``responded_by_user``: id and name)
    does not count, or "" when it does: not one of ``approvers.users`` (an auth manager that
    lets every user answer, e.g. the simple one with all admins), or the person who triggered
    the run where ``approvers.not_the_triggerer``."""
    who = responder or {}
    name = who.get("name") or who.get("id") or "an unknown user"
    ids = {who.get("id"), who.get("name")} - {None}
    named = query.approvers.users
    if named and not ids & set(named):
        return f"approved by {name}, who is not one of its approvers ({', '.join(named)})"
    if query.approvers.not_the_triggerer and triggered_by and triggered_by in ids:
        return (
            f"approved by {name}, who triggered the run: another person must approve "
            "(approvers.not_the_triggerer)"
        )
    return ""
