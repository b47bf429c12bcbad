"""Kafka over mutual TLS (issue 75 item 3): a broker whose TLS listener checks its clients'
certificates; the registry's source names an Airflow connection that holds the client's
settings in librdkafka's spelling (CA, certificate and key in PEM). The library's client and
Spark's Kafka connector both reach the topic through it; a client without its certificate
does not get in."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from stateops.core.checkpoint import load_checkpoint
from stateops.core.errors import StateOpsError
from stateops.core.kafka import kafka_settings, parse_offsets, topic_partitions
from stateops.dev.kafka import TlsListener, start_broker
from stateops.dev.s3server import free_port
from tests.conftest import KafkaBroker, spark_submit_run_query, write_registry
from tests.spark.test_kafka_queries import visits

pytestmark = [pytest.mark.spark, pytest.mark.whole]


def _certificates(folder: Path) -> dict[str, Path]:
    """A CA, and a broker's and a client's PKCS#8 key and certificate (signed by it, for
    127.0.0.1) each in one PEM file."""
    folder.mkdir(parents=True)

    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=folder, check=True, capture_output=True)

    openssl(
        *("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2"),
        *("-keyout", "ca.key", "-out", "ca.pem", "-subj", "/CN=stateops-test-ca"),
    )
    (folder / "san.ext").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    for name in ("broker", "client"):
        openssl(
            *("req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key"),
            *("-out", f"{name}.csr", "-subj", f"/CN={name}"),
        )
        openssl(
            *("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key"),
            *("-CAcreateserial", "-days", "2", "-extfile", "san.ext", "-out", f"{name}.crt"),
        )
        key = (folder / f"{name}.key").read_text()
        assert "BEGIN PRIVATE KEY" in key, "not PKCS#8"
        (folder / f"{name}.pem").write_text(key + (folder / f"{name}.crt").read_text())
    return {
        "ca": folder / "ca.pem",
        "broker": folder / "broker.pem",
        "client": folder / "client.pem",
    }


@pytest.fixture(scope="module")
def tls_broker(tmp_path_factory):
    root = tmp_path_factory.mktemp("kafka-tls")
    files = _certificates(root / "certs")
    listener = TlsListener(free_port(), files["broker"], files["ca"])
    broker = start_broker(root / "broker", tls=listener)
    yield broker, files
    broker.stop()


def _connection(monkeypatch, conn_id: str, extra: dict) -> None:
    monkeypatch.setenv(
        f"AIRFLOW_CONN_{conn_id.upper()}", json.dumps({"conn_type": "kafka", "extra": extra})
    )


def test_a_source_reads_a_topic_over_mutual_tls_through_its_connection(
    tls_broker, tmp_path, monkeypatch
):
    broker, files = tls_broker
    plain = KafkaBroker(broker, 0.0)  # the topic made and filled on the plain listener
    topic = plain.create_topic("tls-visits", partitions=2)
    plain.produce(topic, visits(20))
    secured = {
        "bootstrap.servers": broker.tls_bootstrap_servers,
        "security.protocol": "SSL",
        "ssl.ca.location": str(files["ca"]),
        "ssl.certificate.location": str(files["client"]),
        "ssl.key.location": str(files["client"]),
    }
    _connection(monkeypatch, "kafka_tls", secured)
    assert topic_partitions(kafka_settings(None, "kafka_tls"), [topic]) == {topic: [0, 1]}

    no_certificate = {
        k: v for k, v in secured.items() if not k.endswith(("certificate.location", "key.location"))
    }
    _connection(monkeypatch, "kafka_anonymous", no_certificate)
    monkeypatch.setenv("STATEOPS_KAFKA_TIMEOUT", "3")
    with pytest.raises(
        StateOpsError, match=f"Kafka at {broker.tls_bootstrap_servers} does not answer"
    ):
        topic_partitions(kafka_settings(None, "kafka_anonymous"), [topic])

    source = {
        "format": "kafka",
        "topic": topic,
        "schema": "user_id STRING, page STRING, event_time TIMESTAMP",
        "connection": "kafka_tls",
        "options": {"startingOffsets": "earliest"},
    }
    registry = write_registry(tmp_path, page_visits={"source": source})
    run = spark_submit_run_query(registry, "page_visits", "--mode", "available-now")
    assert run.returncode == 0, run.stderr[-4000:]
    checkpoint = load_checkpoint(tmp_path / "checkpoints" / "page_visits")
    offsets = parse_offsets(checkpoint.entry(checkpoint.last_committed_batch, 0)) or {}
    assert sum(offsets[topic].values()) == 20, offsets  # every record, read over TLS
