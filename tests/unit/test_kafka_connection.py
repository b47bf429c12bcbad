"""A Kafka connection kept in Airflow's database reaches the library in a task:
:func:`stateops.core.kafka.publish_connection` and the task wrapper that calls it."""

from __future__ import annotations

import json
import os
from types import SimpleNamespace

import pytest

from stateops.core.kafka import kafka_settings, publish_connection

pytestmark = pytest.mark.unit

VAR = "AIRFLOW_CONN_KAFKA_DEFAULT"
SECURED = {
    "bootstrap.servers": "kafka-1:9093,kafka-2:9093",
    "security.protocol": "SASL_SSL",
    "sasl.mechanism": "SCRAM-SHA-512",
    "sasl.username": "stateops",
    "sasl.password": "s3cret-pass",
}


@pytest.fixture
def clean_env(monkeypatch):
    monkeypatch.delenv(VAR, raising=False)
    monkeypatch.setenv("STATEOPS_KAFKA_BOOTSTRAP_SERVERS", "127.0.0.1:9092")
    return monkeypatch


def test_a_connection_from_the_database_wins_over_the_environment(clean_env):
    asked = []
    assert publish_connection("kafka_default", lambda c: asked.append(c) or SECURED) is True
    assert asked == ["kafka_default"]
    assert json.loads(os.environ[VAR]) == {"conn_type": "kafka", "extra": SECURED}
    settings = kafka_settings()
    assert settings.bootstrap_servers == "kafka-1:9093,kafka-2:9093"
    assert settings.security["sasl.password"] == "s3cret-pass"
    assert "s3cret" not in repr(settings)


def test_no_connection_leaves_the_environment_alone(clean_env):
    assert publish_connection("kafka_default", lambda conn_id: None) is False
    assert kafka_settings().bootstrap_servers == "127.0.0.1:9092"


def test_a_connection_variable_already_set_is_not_looked_up(clean_env):
    given = json.dumps({"conn_type": "kafka", "extra": {"bootstrap.servers": "env:1"}})
    clean_env.setenv(VAR, given)
    assert publish_connection("kafka_default", lambda c: pytest.fail("looked up")) is False
    assert kafka_settings().bootstrap_servers == "env:1"


def test_every_task_publishes_it_before_its_work(clean_env, capsys):
    """A task's library call (through ``one_line_errors``) sees the database's connection."""
    from airflow.sdk import BaseHook

    import stateops_airflow.tasks as tasks

    clean_env.setattr(
        BaseHook,
        "get_connection",
        classmethod(
            lambda cls, conn_id: SimpleNamespace(conn_type="kafka", extra_dejson=dict(SECURED))
        ),
    )
    tasks._publish_connections.cache_clear()
    try:
        servers = tasks.one_line_errors(lambda: kafka_settings().bootstrap_servers)()
    finally:
        tasks._publish_connections.cache_clear()
    assert servers == "kafka-1:9093,kafka-2:9093"
    out = capsys.readouterr()
    assert "s3cret" not in out.out + out.err
