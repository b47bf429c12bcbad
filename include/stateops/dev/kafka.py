"""The embedded Kafka broker: one single-node KRaft broker (Kafka 4, from ``make jars``) on
loopback, for the demo, ``make airflow`` and the tests, as the embedded S3 endpoint is for S3.

Its storage is formatted on first start; its log goes to ``<dir>/broker.log`` (a file: a pipe
nobody reads fills up and blocks the broker). :func:`start_broker` returns once the broker
answers an admin request; :meth:`Broker.stop` stops it cleanly (SIGTERM, a controlled shutdown).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from stateops.core.errors import StateOpsError
from stateops.core.registry import PROJECT_ROOT
from stateops.dev.s3server import free_port

__all__ = ["BROKER_JARS", "Broker", "TlsListener", "start_broker"]

BROKER_JARS = PROJECT_ROOT / "build" / "jars" / "broker"
# Short-lived test and demo brokers: C1 only and the serial collector start it fastest.
JVM_OPTIONS = ["-Xmx512m", "-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC"]

_LOG4J = """\
rootLogger.level = info
rootLogger.appenderRef.file.ref = file
appender.file.type = File
appender.file.name = file
appender.file.fileName = {log}
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = [%d] %p %m (%c{{1}})%n
logger.state.name = state.change.logger
logger.state.level = warn
"""


@dataclass(frozen=True)
class TlsListener:
    """A second listener, TLS on 127.0.0.1:``port``: the broker's PKCS#8 key and certificate
    chain in one PEM file (``keystore``), the CA its clients' certificates are checked against
    (``truststore``, PEM) when ``client_auth`` is ``required`` (mutual TLS)."""

    port: int
    keystore: Path
    truststore: Path
    client_auth: str = "required"


@dataclass
class Broker:
    proc: subprocess.Popen
    port: int
    root: Path
    tls: TlsListener | None = None

    @property
    def bootstrap_servers(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def tls_bootstrap_servers(self) -> str:
        assert self.tls is not None, "a broker started without a TLS listener"
        return f"127.0.0.1:{self.tls.port}"

    @property
    def log(self) -> Path:
        return self.root / "broker.log"

    def stop(self, timeout: float = 30) -> None:
        """A controlled shutdown (SIGTERM); killed when it takes longer than ``timeout``."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def _properties(root: Path, port: int, controller: int, tls: TlsListener | None) -> str:
    listeners = f"PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{controller}"
    protocols = "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT"
    secured = {}
    if tls is not None:
        listeners += f",SSL://127.0.0.1:{tls.port}"
        protocols += ",SSL:SSL"
        secured = {
            "ssl.keystore.type": "PEM",
            "ssl.keystore.location": str(tls.keystore),
            "ssl.truststore.type": "PEM",
            "ssl.truststore.location": str(tls.truststore),
            "ssl.client.auth": tls.client_auth,
        }
    settings = {
        "process.roles": "broker,controller",
        "node.id": "1",
        "controller.quorum.bootstrap.servers": f"127.0.0.1:{controller}",
        "listeners": listeners,
        "advertised.listeners": listeners,
        "controller.listener.names": "CONTROLLER",
        "inter.broker.listener.name": "PLAINTEXT",
        "listener.security.protocol.map": protocols,
        "log.dirs": str(root / "data"),
        "num.partitions": "1",
        "offsets.topic.replication.factor": "1",
        "transaction.state.log.replication.factor": "1",
        "transaction.state.log.min.isr": "1",
        "share.coordinator.state.topic.replication.factor": "1",
        "share.coordinator.state.topic.min.isr": "1",
        "group.initial.rebalance.delay.ms": "0",
        # No time-based retention by default: sample and test events carry fixed past times,
        # which the default 7 days would delete as they land. A topic that wants retention
        # sets retention.ms; it is checked every 5 s (default 5 min), so it acts soon.
        "log.retention.ms": "-1",
        "log.retention.check.interval.ms": "5000",
        **secured,
    }
    return "".join(f"{k}={v}\n" for k, v in settings.items())


def _java(*args: str) -> list[str]:
    java = shutil.which("java")
    if java is None:
        raise StateOpsError("java is missing: the Kafka broker needs Java 17")
    if not any(BROKER_JARS.glob("kafka_2.13-*.jar")):
        raise StateOpsError(
            f"the Kafka broker's jars are not in {BROKER_JARS}: run `make jars` (it fetches "
            "them with mvn)"
        )
    return [java, *JVM_OPTIONS, "-cp", f"{BROKER_JARS}/*", *args]


def start_broker(
    root: Path, port: int | None = None, timeout: float = 60, tls: TlsListener | None = None
) -> Broker:
    """A broker on 127.0.0.1:``port`` (default: a free one) keeping its data under ``root``
    (formatted on first start, kept across restarts), and a TLS listener where ``tls`` says;
    returns once it answers."""
    root.mkdir(parents=True, exist_ok=True)
    port = port or free_port()
    config, log = root / "server.properties", root / "broker.log"
    (root / "log4j2.properties").write_text(_LOG4J.format(log=log))
    config.write_text(_properties(root, port, free_port(), tls))
    logging = f"-Dlog4j2.configurationFile={root / 'log4j2.properties'}"
    if not (root / "data" / "meta.properties").exists():
        formatted = subprocess.run(
            _java(logging, "kafka.tools.StorageTool", "format", "--standalone")
            # One argument: a base64 id may begin with "-", which a separate one is not.
            + [f"--cluster-id={_cluster_id()}", "-c", str(config), "--ignore-formatted"],
            capture_output=True,
            text=True,
        )
        if formatted.returncode != 0:
            raise StateOpsError(
                f"formatting the broker's storage failed: {formatted.stderr.strip()[-300:]}"
            )
    with open(root / "broker.out", "ab") as out:
        proc = subprocess.Popen(
            _java(logging, "kafka.Kafka", str(config)),
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
    broker = Broker(proc, port, root, tls)
    _wait_until_it_answers(broker, timeout)
    return broker


def _cluster_id() -> str:
    """A new cluster id (what ``kafka-storage random-uuid`` prints: 16 random bytes, base64)."""
    import base64
    import uuid

    return base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")


def _wait_until_it_answers(broker: Broker, timeout: float) -> None:
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": broker.bootstrap_servers, "log_level": 0})
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if broker.proc.poll() is not None:
            raise StateOpsError(
                f"the Kafka broker exited with {broker.proc.returncode}; its log: {broker.log}"
            )
        try:
            if admin.list_topics(timeout=1).brokers:
                return
        except Exception:  # noqa: BLE001 - not up yet: KafkaException of any kind
            pass
        time.sleep(0.2)
    broker.stop()
    raise StateOpsError(
        f"the Kafka broker did not answer on {broker.bootstrap_servers} within {timeout:.0f} s; "
        f"its log: {broker.log}"
    )


def main(argv: list[str] | None = None) -> int:
    """``python -m stateops.dev.kafka [--dir DIR] [--port N]``: serve until stopped (Ctrl-C or
    SIGTERM)."""
    import argparse
    import signal
    from urllib.parse import urlparse

    from stateops.core.errors import one_line

    parser = argparse.ArgumentParser(
        prog="python -m stateops.dev.kafka", description="The embedded Kafka broker."
    )
    parser.add_argument(
        "--dir",
        type=Path,
        default=PROJECT_ROOT / "build" / "kafka",
        help="its storage and log (default: build/kafka; formatted on first start)",
    )
    parser.add_argument(
        "--port",
        type=int,
        help="on 127.0.0.1 (default: the port of STATEOPS_KAFKA_BOOTSTRAP_SERVERS, else 9092)",
    )
    args = parser.parse_args(argv)
    configured = os.environ.get("STATEOPS_KAFKA_BOOTSTRAP_SERVERS", "")
    port = args.port or urlparse(f"//{configured.split(',')[0]}").port or 9092
    try:
        broker = start_broker(args.dir, port)
    except StateOpsError as err:
        print(f"error: {one_line(err)}", file=sys.stderr)
        return 2
    signal.signal(signal.SIGTERM, lambda *_: broker.proc.terminate())
    print(f"Kafka broker {broker.bootstrap_servers} (log: {broker.log})", flush=True)
    if configured != broker.bootstrap_servers:
        print(
            f"for the CLI: export STATEOPS_KAFKA_BOOTSTRAP_SERVERS={broker.bootstrap_servers}",
            flush=True,
        )
    try:
        return broker.proc.wait()
    except KeyboardInterrupt:
        broker.stop()
        return broker.proc.returncode


if __name__ == "__main__":
    sys.exit(main())
