"""What the health DAG alerts (stateops.alerts, issue 57 item 2): one message per query and
rule when it starts firing and one when it recovers, nothing while it goes on; work in
progress fires no rule; the notifier the registry names, built anew per alert."""

from __future__ import annotations

import pytest
import yaml
from airflow.sdk import BaseNotifier

from stateops.alerts import Alert, changes, firing, notifier_for, read_alerted, write_alerted
from stateops.core.errors import RegistryError, StateOpsError
from stateops.core.registry import load_registry
from stateops.core.storage import S3Path
from tests.conftest import write_registry

pytestmark = pytest.mark.unit


def _health(*found: tuple[str, str, str]) -> dict:
    return {"findings": [{"rule": r, "level": lv, "reason": why} for r, lv, why in found]}


def test_the_rules_that_fire_leave_out_work_in_progress_and_join_one_rules_reasons():
    health = _health(
        ("lag", "FAIL", "kafka a: 500 records behind"),
        ("held", "WARN", "backfill (run id r-1) holds the query"),
        ("lag", "FAIL", "kafka b: 700 records behind"),
        ("no_commit_yet", "WARN", "no committed batch yet"),
        ("backup_age", "WARN", "no backup yet"),
    )
    assert firing(health) == {
        "lag": {
            "level": "FAIL",
            "message": "kafka a: 500 records behind; kafka b: 700 records behind",
        },
        "backup_age": {"level": "WARN", "message": "no backup yet"},
    }
    assert firing(_health()) == {}


def test_a_health_check_fails_its_task_on_a_fail_rule_and_not_on_warnings_alone():
    """A WARN is a notification (its alert is sent either way), not a red task: a fresh
    deployment with no backup yet left stream_health red every 5 minutes (issue 75 item 6)."""
    from stateops_airflow.tasks import health_failure

    warnings = firing(_health(("backup_age", "WARN", "no backup yet")))
    assert health_failure("q", warnings) is None
    assert health_failure("q", {}) is None
    both = firing(
        _health(("backup_age", "WARN", "no backup yet"), ("lag", "FAIL", "500 records behind"))
    )
    assert health_failure("q", both) == (
        "q: [WARN] backup_age: no backup yet; [FAIL] lag: 500 records behind"
    )


def test_a_rule_alerts_when_it_starts_and_when_it_recovers_and_not_while_it_goes_on():
    lag = {"lag": {"level": "FAIL", "message": "500 records behind"}}
    [fired] = changes("q", {}, lag)
    assert fired == Alert("q", "lag", "firing", "FAIL", "500 records behind")
    assert fired.text == "[FAIL] q: 500 records behind (stateops status q)"
    more = {"lag": {"level": "FAIL", "message": "900 records behind"}}  # its figure moved
    assert changes("q", lag, more) == []
    backup = {"backup_age": {"level": "WARN", "message": "no backup yet"}}
    assert changes("q", more, backup) == [
        Alert("q", "backup_age", "firing", "WARN", "no backup yet"),
        Alert("q", "lag", "recovered", "OK", "900 records behind"),
    ]
    [recovered] = changes("q", backup, {})
    assert recovered.text == "[OK] q: backup_age recovered (it said: no backup yet)"
    assert recovered.as_dict()["text"] == recovered.text


def test_what_was_alerted_is_kept_beside_the_lease_in_the_control_store_on_a_fleet(tmp_path):
    registry = load_registry(write_registry(tmp_path))
    assert read_alerted(registry, "page_visits") == {}
    lag = {"lag": {"level": "FAIL", "message": "500 records behind"}}
    write_alerted(registry, "page_visits", lag)
    assert read_alerted(registry, "page_visits") == lag
    assert registry.alerts_path("page_visits").parent == registry.state_dir / "alerts"
    fleet = registry.model_copy(update={"control": "s3://bucket/control"})
    where = fleet.alerts_path("page_visits")
    assert isinstance(where, S3Path) and str(where) == "s3://bucket/control/page_visits/alerts.json"
    assert where.parent == fleet.lock_path("page_visits").parent


def _alerts(tmp_path, **alerts):
    path = write_registry(tmp_path)
    raw = yaml.safe_load(path.read_text())
    raw["alerts"] = alerts
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return load_registry(path)


def test_the_notifier_the_registry_names_is_built_anew_for_each_alert(tmp_path):
    assert load_registry(write_registry(tmp_path)).alerts.schedule == "5 minutes"
    assert notifier_for(load_registry(write_registry(tmp_path))) is None  # the log only
    registry = _alerts(
        tmp_path,
        schedule="*/2 * * * *",
        notifier="airflow.providers.http.notifications.HttpNotifier",
        notifier_args={"http_conn_id": "alerts", "json": {"text": "{{ alert.text }}"}},
    )
    one, two = notifier_for(registry), notifier_for(registry)
    assert type(one).__name__ == "HttpNotifier" and one is not two
    assert one.json == {"text": "{{ alert.text }}"} and one.http_conn_id == "alerts"


@pytest.mark.parametrize(
    ("alerts", "said"),
    [
        ({"notifier": "HttpNotifier"}, "alerts.notifier"),
        ({"schedule": "every five minutes"}, "alerts.schedule"),
    ],
)
def test_a_bad_alerts_section_is_refused_naming_its_field(tmp_path, alerts, said):
    with pytest.raises(RegistryError, match=said):
        _alerts(tmp_path, **alerts)


@pytest.mark.parametrize(
    ("alerts", "said"),
    [
        ({"notifier": "airflow.providers.nope.Notifier"}, "alerts.notifier: airflow.providers"),
        (
            {
                "notifier": "airflow.providers.http.notifications.HttpNotifier",
                "notifier_args": {"url": "http://x"},
            },
            "alerts.notifier_args: airflow.providers.http.notifications.HttpNotifier refuses",
        ),
    ],
)
def test_a_notifier_that_cannot_be_built_says_why_in_one_line(tmp_path, alerts, said):
    with pytest.raises(StateOpsError, match=said) as err:
        notifier_for(_alerts(tmp_path, **alerts))
    assert "\n" not in str(err.value)


class Recorder(BaseNotifier):
    """A notifier (by its import path in the registry) that keeps what it was sent, or fails
    while ``down``."""

    template_fields = ("body",)
    sent: list[str] = []
    down = False

    def __init__(self, body: str) -> None:
        super().__init__()
        self.body = body

    def notify(self, context) -> None:
        if Recorder.down:
            raise ConnectionError("the receiver is down")
        Recorder.sent.append(self.body)


def test_alerts_a_notifier_failed_to_send_are_sent_again_at_the_next_check(tmp_path):
    """The callback records what it alerted only once the notifier took it: a receiver that
    was down gets the same change at the next check."""
    from stateops_airflow.tasks import HealthAlerts

    registry = _alerts(
        tmp_path,
        notifier="tests.unit.test_alerts.Recorder",
        notifier_args={"body": "{{ alert.text }}"},
    )
    lag = {"lag": {"level": "FAIL", "message": "500 records behind"}}
    found = {"query": "page_visits", "firing": lag}
    found["changes"] = [a.as_dict() for a in changes("page_visits", {}, lag)]

    class TaskInstance:  # what the callback reads of Airflow's: the check's XCom
        task_id = "health_page_visits"

        def xcom_pull(self, task_ids: str, key: str) -> dict:
            assert (task_ids, key) == (self.task_id, "alerts")
            return found

    context = {"ti": TaskInstance()}
    Recorder.sent, Recorder.down = [], True
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("STATEOPS_REGISTRY", str(registry.path))
        with pytest.raises(ConnectionError):
            HealthAlerts()(context)
        assert read_alerted(registry, "page_visits") == {} and Recorder.sent == []
        Recorder.down = False
        HealthAlerts()(context)
    assert Recorder.sent == ["[FAIL] page_visits: 500 records behind (stateops status page_visits)"]
    assert read_alerted(registry, "page_visits") == lag
