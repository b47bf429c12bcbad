"""Where Kafka settings come from, how Spark gets them, and that a secret is never shown;
the offsets arithmetic of the Kafka kind (lag, retention margin, offsets that go back)."""

from __future__ import annotations

import json

import pytest

from stateops.core.errors import StateOpsError
from stateops.core.kafka import kafka_settings, offsets_text, parse_offsets, spark_options
from stateops.kinds.kafka import Lag, offsets_backwards

pytestmark = pytest.mark.unit

SECRET = "s3cret-not-for-logs"


@pytest.fixture
def clean_env(monkeypatch):
    for name in (
        "AIRFLOW_CONN_KAFKA_DEFAULT",
        "STATEOPS_KAFKA_BOOTSTRAP_SERVERS",
        "STATEOPS_KAFKA_SECURITY_PROTOCOL",
        "STATEOPS_KAFKA_SASL_MECHANISM",
        "STATEOPS_KAFKA_SASL_USERNAME",
        "STATEOPS_KAFKA_SASL_PASSWORD",
    ):
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def test_the_source_wins_then_the_connection_then_the_environment(clean_env):
    with pytest.raises(StateOpsError, match="no Kafka bootstrap servers: give the source's"):
        kafka_settings()
    clean_env.setenv("STATEOPS_KAFKA_BOOTSTRAP_SERVERS", "env:9092")
    assert kafka_settings().bootstrap_servers == "env:9092"
    conn = {"conn_type": "kafka", "extra": {"bootstrap.servers": "conn:9092"}}
    clean_env.setenv("AIRFLOW_CONN_KAFKA_DEFAULT", json.dumps(conn))
    assert kafka_settings().bootstrap_servers == "conn:9092"
    assert kafka_settings("mine:9092").bootstrap_servers == "mine:9092"
    clean_env.setenv("AIRFLOW_CONN_KAFKA_DEFAULT", "{not json")
    with pytest.raises(StateOpsError, match="AIRFLOW_CONN_KAFKA_DEFAULT is not a JSON connection"):
        kafka_settings()


def test_sasl_settings_reach_spark_and_the_client_and_are_never_shown(clean_env):
    clean_env.setenv("STATEOPS_KAFKA_BOOTSTRAP_SERVERS", "b:9093")
    clean_env.setenv("STATEOPS_KAFKA_SECURITY_PROTOCOL", "SASL_SSL")
    clean_env.setenv("STATEOPS_KAFKA_SASL_MECHANISM", "SCRAM-SHA-512")
    clean_env.setenv("STATEOPS_KAFKA_SASL_USERNAME", "svc")
    clean_env.setenv("STATEOPS_KAFKA_SASL_PASSWORD", SECRET)
    settings = kafka_settings()
    assert settings.client_config() == {
        "bootstrap.servers": "b:9093",
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": "SCRAM-SHA-512",
        "sasl.username": "svc",
        "sasl.password": SECRET,
    }
    options = spark_options(settings)
    assert options["kafka.security.protocol"] == "SASL_SSL"
    assert options["kafka.sasl.jaas.config"] == (
        "org.apache.kafka.common.security.scram.ScramLoginModule required "
        f'username="svc" password="{SECRET}";'
    )
    assert SECRET not in repr(settings) and SECRET not in str(settings)


def test_offsets_entries_parse_and_read_as_text():
    assert parse_offsets('{"t":{"0":12,"1":40}}') == {"t": {0: 12, 1: 40}}
    assert parse_offsets({"logOffset": 3}) is None  # a file source's
    assert parse_offsets("-") is None and parse_offsets({}) is None
    assert offsets_text({"t": {0: 12, 1: 40}}) == "t[0]=12 t[1]=40"


def test_lag_and_retention_margin_per_partition():
    lag = Lag(
        committed={"t": {0: 10, 1: 4}},
        end={"t": {0: 15, 1: 4, 2: 3}},
        earliest={"t": {0: 2, 1: 6, 2: 0}},
    )
    assert lag.per_partition == {"t": {0: 5, 1: 0, 2: 3}}  # partition 2: never read, from 0
    assert lag.total == 8
    assert lag.margin == {"t": {0: 8, 1: -2, 2: 0}}  # partition 1: retention passed it
    assert str(lag) == "lag 8 records (t[0]=5 t[1]=0 t[2]=3)"


def test_offsets_that_go_back_or_lose_a_partition_are_named():
    assert offsets_backwards({"t": {0: 5, 1: 5}}, {"t": {0: 6, 1: 5, 2: 0}}) == []
    assert offsets_backwards({"t": {0: 5, 1: 5}}, {"t": {0: 4}}) == [
        "t[0] goes back from 5 to 4",
        "t[1] is gone",
    ]


def test_a_source_on_another_cluster_gets_none_of_the_configured_credentials(clean_env):
    clean_env.setenv("STATEOPS_KAFKA_BOOTSTRAP_SERVERS", "a:9093")
    clean_env.setenv("STATEOPS_KAFKA_SASL_USERNAME", "svc")
    clean_env.setenv("STATEOPS_KAFKA_SASL_PASSWORD", SECRET)
    assert kafka_settings("a:9093").security["sasl.password"] == SECRET
    other = kafka_settings("b:9093")
    assert other.security == {} and SECRET not in str(spark_options(other))


@pytest.mark.parametrize(
    "options, says",
    [
        (
            {"kafka.sasl.jaas.config": "x"},
            "security settings come from the source.s Airflow connection",
        ),
        ({"kafka.ssl.keystore.password": "x"}, "never the registry"),
        ({"subscribePattern": "a.*"}, "as topic or topics, not options"),
        ({"kafka.bootstrap.servers": "h:1"}, "as bootstrap_servers, not options"),
    ],
)
def test_a_registry_kafka_source_keeps_its_topics_brokers_and_secrets_out_of_options(options, says):
    from pydantic import ValidationError

    from stateops.core.registry import Source

    spec = {"format": "kafka", "topic": "t", "schema": "a STRING"}
    with pytest.raises(ValidationError, match=says):
        Source.model_validate(spec | {"options": options})
    assert Source.model_validate(spec | {"options": {"kafka.max.poll.records": 5}}).subscribed


def test_a_committed_offset_past_the_brokers_end_is_named():
    from stateops.kinds.kafka import retention

    lag = Lag(
        committed={"t": {0: 40, 1: 3}}, end={"t": {0: 12, 1: 3}}, earliest={"t": {0: 0, 1: 0}}
    )
    assert retention(lag, 0.1).ahead == ["t[0] committed 40, end 12"]
    assert retention(Lag({"t": {0: 3}}, {"t": {0: 5}}, {"t": {0: 0}}), 0.1).ahead == []


def _connection(monkeypatch, conn_id: str, extra: dict) -> None:
    conn = {"conn_type": "kafka", "extra": extra}
    monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", json.dumps(conn))


def test_each_source_reads_the_brokers_and_credentials_of_its_own_connection(clean_env):
    _connection(clean_env, "kafka_default", {"bootstrap.servers": "a:9092"})
    _connection(
        clean_env,
        "kafka_eu",
        {
            "bootstrap.servers": "eu:9093",
            "security.protocol": "SASL_SSL",
            "sasl.mechanisms": "PLAIN",  # librdkafka's other spelling
            "sasl.username": "eu",
            "sasl.password": SECRET,
        },
    )
    assert kafka_settings(None, None) == kafka_settings(None, "kafka_default")
    assert kafka_settings().security == {}
    eu = kafka_settings(None, "kafka_eu")
    assert (eu.bootstrap_servers, eu.security["sasl.mechanism"]) == ("eu:9093", "PLAIN")
    assert "PlainLoginModule" in spark_options(eu)["kafka.sasl.jaas.config"]
    with pytest.raises(StateOpsError, match="the Airflow connection kafka_us, or"):
        kafka_settings(None, "kafka_us")


def test_tls_settings_reach_the_client_as_given_and_spark_in_the_java_clients_spelling(clean_env):
    tls = {
        "bootstrap.servers": "b:9094",
        "security.protocol": "ssl",
        "ssl.ca.location": "/secrets/ca.pem",
        "ssl.certificate.location": "/secrets/client.pem",
        "ssl.key.location": "/secrets/client.pem",
        "ssl.key.password": SECRET,
        "ssl.endpoint.identification.algorithm": "none",
    }
    _connection(clean_env, "kafka_tls", tls)
    settings = kafka_settings(None, "kafka_tls")
    assert settings.client_config() == tls  # librdkafka takes its own spelling
    assert spark_options(settings) == {
        "kafka.bootstrap.servers": "b:9094",
        "kafka.security.protocol": "SSL",
        "kafka.ssl.truststore.type": "PEM",
        "kafka.ssl.truststore.location": "/secrets/ca.pem",
        "kafka.ssl.keystore.type": "PEM",
        "kafka.ssl.keystore.location": "/secrets/client.pem",
        "kafka.ssl.key.password": SECRET,
        "kafka.ssl.endpoint.identification.algorithm": "",
    }
    assert SECRET not in repr(settings)
    pkcs12 = {"ssl.keystore.location": "/s/client.p12", "ssl.keystore.password": SECRET}
    _connection(clean_env, "kafka_tls", {**tls, **pkcs12})
    options = spark_options(kafka_settings(None, "kafka_tls"))
    assert (options["kafka.ssl.keystore.type"], options["kafka.ssl.keystore.location"]) == (
        "PKCS12",
        "/s/client.p12",
    )
    assert options["kafka.ssl.keystore.password"] == SECRET


@pytest.mark.parametrize(
    "given, says",
    [
        ({"ssl.certificate.location": "/c.pem", "ssl.key.location": "/k.pem"}, "in one PEM file"),
        ({"ssl.key.location": "/k.pem"}, "in one PEM file"),
        ({"security.protocol": "SASL_SSL", "sasl.mechanism": "GSSAPI"}, "sasl.mechanism GSSAPI"),
        ({"security.protocol": "SASL_PLAINTEXT"}, "sasl.mechanism not given"),
        ({"security.protocol": "TLS"}, "security.protocol 'TLS': expected one of"),
    ],
)
def test_security_settings_the_spark_jobs_could_not_use_are_refused_naming_the_connection(
    clean_env, given, says
):
    _connection(clean_env, "kafka_x", {"bootstrap.servers": "b:1", **given})
    with pytest.raises(StateOpsError, match=f"^Kafka connection kafka_x: .*{says}"):
        kafka_settings(None, "kafka_x")
