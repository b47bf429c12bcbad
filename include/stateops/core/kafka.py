"""Kafka from the library: where the brokers are, and what they hold (earliest, latest and
by-time offsets per partition, the partitions of a topic). One place that knows the settings
and never prints a secret; every broker fault is one line that names the bootstrap servers.

Settings: a source's own ``bootstrap_servers`` (the registry), else its Airflow connection (the
source's ``connection``, else the registry's ``connections.kafka``, default ``kafka_default``:
``AIRFLOW_CONN_<ID>`` as JSON, ``conn_type`` kafka, its ``extra`` the client's settings in
librdkafka's spelling, as Airflow's Kafka provider takes them: ``bootstrap.servers``,
``security.protocol``, SASL's ``sasl.mechanism``, ``sasl.username``, ``sasl.password``, TLS's
``ssl.ca.location``, ``ssl.certificate.location``, ``ssl.key.location``, ``ssl.key.password``,
``ssl.keystore.location``, ``ssl.keystore.password``,
``ssl.endpoint.identification.algorithm``), else the environment
(``STATEOPS_KAFKA_BOOTSTRAP_SERVERS``, ``STATEOPS_KAFKA_SECURITY_PROTOCOL``, ... each key in
upper case with ``_`` for ``.``). Spark's connector gets the same settings as ``kafka.``-prefixed
options in its own spelling (:func:`spark_options`). Inside an Airflow task the connection comes
from Airflow (a secrets backend, its database) and is handed to the Spark jobs in their
environment (:func:`publish_connection`).

``confluent_kafka`` is imported inside the functions that talk to a broker: the registry and
the DAG files read this module without it.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from stateops.core.errors import StateOpsError, Unreachable

__all__ = [
    "CONNECTION",
    "KafkaDown",
    "KafkaSettings",
    "Offsets",
    "broker_offsets",
    "kafka_settings",
    "offsets_text",
    "parse_offsets",
    "publish_connection",
    "spark_options",
    "topic_partitions",
]

CONNECTION = "kafka_default"
_ENV = "STATEOPS_KAFKA_"
# How long one question to a broker may take before it counts as down (seconds).
TIMEOUT = float(os.environ.get("STATEOPS_KAFKA_TIMEOUT", "5"))

Offsets = dict[str, dict[int, int]]
"""topic -> partition -> offset (in a checkpoint: the next offset to read)."""


class KafkaDown(Unreachable):
    """The brokers did not answer."""


@dataclass(frozen=True)
class KafkaSettings:
    bootstrap_servers: str
    security: dict[str, str] = field(default_factory=dict)
    """``security.protocol``, ``sasl.*``, ``ssl.*`` in librdkafka's spelling: never logged."""

    def __repr__(self) -> str:  # never a secret, not even in a traceback's locals
        return f"KafkaSettings(bootstrap_servers={self.bootstrap_servers!r})"

    def client_config(self) -> dict[str, str]:
        return {"bootstrap.servers": self.bootstrap_servers, **self.security}


_SASL_KEYS = ("sasl.mechanism", "sasl.username", "sasl.password")
_TLS_KEYS = (
    "ssl.ca.location",
    "ssl.certificate.location",
    "ssl.key.location",
    "ssl.key.password",
    "ssl.keystore.location",
    "ssl.keystore.password",
    "ssl.endpoint.identification.algorithm",
)
_SECURITY_KEYS = ("security.protocol", *_SASL_KEYS, *_TLS_KEYS)
PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
# The SASL mechanisms both clients take from settings alone (GSSAPI needs a Kerberos login,
# OAUTHBEARER a token callback: neither is a connection's field).
SASL_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")


def kafka_settings(
    bootstrap_servers: str | None = None, connection: str | None = None
) -> KafkaSettings:
    """The settings of a source or sink whose registry entry names ``bootstrap_servers`` (or
    none) and Airflow ``connection`` (None: ``kafka_default``). The security settings (TLS,
    SASL) of the connection or the environment go only to the brokers configured there: a
    source on another cluster gets none of them. Settings the Spark jobs could not use are
    refused here, in one line that names the connection."""
    connection = connection or CONNECTION
    extra = _connection_extra(connection)
    if "sasl.mechanisms" in extra:  # librdkafka's other spelling
        extra.setdefault("sasl.mechanism", extra.pop("sasl.mechanisms"))
    env = {
        key: os.environ[_ENV + key.upper().replace(".", "_")]
        for key in ("bootstrap.servers", *_SECURITY_KEYS)
        if os.environ.get(_ENV + key.upper().replace(".", "_"))
    }
    given = {**env, **extra}
    configured = given.get("bootstrap.servers")
    servers = bootstrap_servers or configured
    if not servers:
        raise StateOpsError(
            "no Kafka bootstrap servers: give the source's bootstrap_servers in the registry, "
            f"the Airflow connection {connection}, or STATEOPS_KAFKA_BOOTSTRAP_SERVERS"
        )
    if servers != configured:  # another cluster: its credentials are not these
        return KafkaSettings(servers)
    security = {k: str(given[k]) for k in _SECURITY_KEYS if k in given}
    problem = _security_problem(security)
    if problem:
        raise StateOpsError(f"Kafka connection {connection}: {problem}")
    return KafkaSettings(servers, security)


def _security_problem(security: dict[str, str]) -> str | None:
    protocol = security.get("security.protocol", "PLAINTEXT").upper()
    if protocol not in PROTOCOLS:
        return f"security.protocol {protocol!r}: expected one of {', '.join(PROTOCOLS)}"
    mechanism = security.get("sasl.mechanism")
    if protocol.startswith("SASL") and mechanism not in SASL_MECHANISMS:
        return (
            f"sasl.mechanism {mechanism or 'not given'}: the Spark jobs and the library take "
            f"{', '.join(SASL_MECHANISMS)} (with sasl.username and sasl.password)"
        )
    cert, key = security.get("ssl.certificate.location"), security.get("ssl.key.location")
    if (cert or key) and cert != key:
        return (
            "ssl.certificate.location and ssl.key.location: give the client's certificate "
            "chain and its PKCS#8 key in one PEM file, named by both (Spark's Kafka connector "
            "reads one PEM keystore), or a PKCS#12 file as ssl.keystore.location"
        )
    return None


def _connection_extra(connection: str) -> dict[str, Any]:
    name = f"AIRFLOW_CONN_{connection.upper()}"
    raw = os.environ.get(name)
    if not raw:
        return {}
    try:
        extra = json.loads(raw).get("extra") or {}
        return json.loads(extra) if isinstance(extra, str) else dict(extra)
    except (ValueError, AttributeError, TypeError):
        raise StateOpsError(
            f"{name} is not a JSON connection with an extra of client settings "
            "(bootstrap.servers, ...)"
        ) from None


def spark_options(settings: KafkaSettings) -> dict[str, str]:
    """The settings as Spark's Kafka connector takes them: ``kafka.`` + the Java client's
    key. TLS files are named, not read: each must be at its path on the driver and the
    executors (the usual way: a secret mounted at the same path on every node)."""
    options = {"kafka.bootstrap.servers": settings.bootstrap_servers}
    security = settings.security
    if "security.protocol" in security:
        options["kafka.security.protocol"] = security["security.protocol"].upper()
    if "sasl.mechanism" in security:
        options["kafka.sasl.mechanism"] = security["sasl.mechanism"]
    if "sasl.username" in security:
        module = (
            "org.apache.kafka.common.security.scram.ScramLoginModule"
            if security.get("sasl.mechanism", "").startswith("SCRAM")
            else "org.apache.kafka.common.security.plain.PlainLoginModule"
        )
        options["kafka.sasl.jaas.config"] = (
            f'{module} required username="{security["sasl.username"]}" '
            f'password="{security.get("sasl.password", "")}";'
        )
    if "ssl.ca.location" in security:  # librdkafka's CA file: a PEM trust store to Java
        options["kafka.ssl.truststore.type"] = "PEM"
        options["kafka.ssl.truststore.location"] = security["ssl.ca.location"]
    if "ssl.keystore.location" in security:
        options["kafka.ssl.keystore.type"] = "PKCS12"
        options["kafka.ssl.keystore.location"] = security["ssl.keystore.location"]
        if "ssl.keystore.password" in security:
            options["kafka.ssl.keystore.password"] = security["ssl.keystore.password"]
    elif "ssl.certificate.location" in security:  # one PEM file with the key and the chain
        options["kafka.ssl.keystore.type"] = "PEM"
        options["kafka.ssl.keystore.location"] = security["ssl.certificate.location"]
    if "ssl.key.password" in security:
        options["kafka.ssl.key.password"] = security["ssl.key.password"]
    if "ssl.endpoint.identification.algorithm" in security:
        algorithm = security["ssl.endpoint.identification.algorithm"]
        options["kafka.ssl.endpoint.identification.algorithm"] = (
            "" if algorithm.lower() == "none" else algorithm
        )
    return options


def _admin(settings: KafkaSettings) -> Any:
    from confluent_kafka.admin import AdminClient

    # librdkafka logs every failed connection attempt to stderr: a down broker is our one line.
    return AdminClient(settings.client_config() | {"log_level": 0})


def _down(settings: KafkaSettings, err: object) -> KafkaDown:
    return KafkaDown(
        f"Kafka at {settings.bootstrap_servers} does not answer ({err}); start the broker or "
        "fix the bootstrap servers"
    )


def topic_partitions(settings: KafkaSettings, topics: Iterable[str]) -> dict[str, list[int]]:
    """Each topic's partitions; a topic that does not exist is refused in one line."""
    from confluent_kafka import KafkaException

    try:
        metadata = _admin(settings).list_topics(timeout=TIMEOUT)
    except KafkaException as err:
        raise _down(settings, err.args[0].str() if err.args else err) from None
    found = {}
    for topic in topics:
        meta = metadata.topics.get(topic)
        if meta is None or meta.error is not None or not meta.partitions:
            raise StateOpsError(
                f"topic {topic!r} does not exist on {settings.bootstrap_servers}; create it or "
                "fix the topic's name"
            )
        found[topic] = sorted(meta.partitions)
    return found


def broker_offsets(
    settings: KafkaSettings, partitions: Mapping[str, Iterable[int]], at: str | int
) -> Offsets:
    """Per topic and partition: the ``earliest`` offset the broker still holds, the ``latest``
    (the next offset it will write), or, for an int, the first offset whose record's timestamp
    is at or after that time (epoch ms; the latest where no record is)."""
    from confluent_kafka import KafkaException, TopicPartition
    from confluent_kafka.admin import OffsetSpec

    spec = (
        OffsetSpec.earliest()
        if at == "earliest"
        else OffsetSpec.latest()
        if at == "latest"
        else OffsetSpec.for_timestamp(int(at))
    )
    wanted = [TopicPartition(t, p) for t, ps in partitions.items() for p in ps]
    if not wanted:
        return {}
    admin = _admin(settings)  # held until the answers are in: its futures die with it
    try:
        futures = admin.list_offsets({tp: spec for tp in wanted}, request_timeout=TIMEOUT)
        answers = {tp: future.result() for tp, future in futures.items()}
    except KafkaException as err:
        raise _down(settings, err.args[0].str() if err.args else err) from None
    found: Offsets = {}
    latest = None
    for tp, info in answers.items():
        offset = info.offset
        if offset < 0:  # no record at or after that time: the end
            latest = latest or broker_offsets(settings, partitions, "latest")
            offset = latest[tp.topic][tp.partition]
        found.setdefault(tp.topic, {})[tp.partition] = offset
    return {t: dict(sorted(ps.items())) for t, ps in sorted(found.items())}


def parse_offsets(raw: object) -> Offsets | None:
    """A Kafka source's entry of ``offsets/N`` or ``sources/<i>/0`` (``{"topic": {"0": 12}}``)
    as ints; None where ``raw`` is not one (a file source's ``{"logOffset": 3}``, ``-``)."""
    if isinstance(raw, str):
        try:
            raw = json.loads(raw)
        except ValueError:
            return None
    if not isinstance(raw, dict) or not raw or "logOffset" in raw:
        return None
    try:
        return {
            str(topic): {int(p): int(o) for p, o in parts.items()} for topic, parts in raw.items()
        }
    except (AttributeError, TypeError, ValueError):
        return None


def offsets_text(offsets: Offsets) -> str:
    """``topic[0]=12 topic[1]=40``: offsets as a person reads them."""
    return " ".join(f"{t}[{p}]={o}" for t, ps in offsets.items() for p, o in ps.items())


# --- E: a Kafka connection kept in Airflow (its database, a secrets backend)


def publish_connection(connection: str, lookup: Callable[[str], Mapping[str, Any] | None]) -> bool:
    """Make Airflow connection ``connection`` (from its database or a secrets backend) what
    :func:`kafka_settings` reads in this process and in the jobs it starts: its extra as
    ``AIRFLOW_CONN_<ID>``'s JSON in the environment. ``lookup(conn_id)`` returns a
    connection's extra, None where there is none. A variable already set wins (it is what
    Airflow itself would find first). Returns whether it set the variable; nothing is logged
    (the extra may hold ``sasl.password``)."""
    name = f"AIRFLOW_CONN_{connection.upper()}"
    if os.environ.get(name):
        return False
    extra = lookup(connection)
    if not extra:
        return False
    os.environ[name] = json.dumps({"conn_type": "kafka", "extra": dict(extra)})
    return True
