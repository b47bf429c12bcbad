"""
### stream_health

Checks every registered query's health on the registry's `alerts.schedule` (every 5 minutes by
default), the rules `stateops status` shows, read from the checkpoints, the run summaries, the
brokers and the backup store, without Spark: a task per query, `health_<query>`, which logs
each rule that fires and what it saw, and fails, naming them, when a FAIL rule fires (a WARN
alone is alerted, not a red task) (Kafka lag over `health.lag_records`, input not
read within `health.input_waiting`, retention close to the committed offsets, no backup within
`health.backup_within`, the last run or validation failed, code that does not fit the state,
state growing faster than `health.state_rows_per_hour`). Work in progress (an operation holding
the query, a planned batch) fires no rule. Each check records the query's figures in its
history (`stateops status --history`) and sends them as gauges through Airflow's metrics.
A query whose code upgrade (or migration, where `health.migration_readiness` is set) failed
its readiness window, its runs failing or stuck with input to read, is switched
back to its old checkpoint first, and the rule `switched_back` says why (docs/code-upgrades.md).

Its callbacks send each change through the Airflow notifier the registry names
(`alerts.notifier`, e.g. the HTTP provider's `HttpNotifier` to a webhook): a rule that starts
firing, once, and a rule that recovers, once, per query and rule, however many checks see it
in between. What was alerted is kept beside the query's lease (the control store on a fleet).
See docs/alerts.md. By hand: `stateops status QUERY`.
"""

from __future__ import annotations

from airflow.sdk import dag, task

from stateops.alerts import notifier_for
from stateops.core.registry import timetable
from stateops_airflow.dags import Rendering
from stateops_airflow.tasks import LIFECYCLE_DAG, HealthAlerts, check_health


def build(r: Rendering):
    """``stream_health`` for ``r`` (:func:`stateops_airflow.dags.lifecycle_dags`)."""
    REGISTRY = r.registry
    notifier_for(REGISTRY)  # a notifier that cannot be built is the DAG's import error, at once

    @dag(
        **r.dag_args(
            "stream_health",
            tags=["health"],
            # no retries: the next check is a few minutes away, a retry alerts nothing new
            default_args={
                "retries": 0,
                "on_success_callback": HealthAlerts(),
                "on_failure_callback": HealthAlerts(),
            },
        ),
        schedule=timetable(REGISTRY.alerts.schedule),
        **LIFECYCLE_DAG,
        doc_md=__doc__,
    )
    def stream_health() -> None:
        for query in r.queries(refused=True):
            task(task_id=f"health_{query}")(check_health)(query)

    return stream_health()
