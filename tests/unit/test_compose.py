"""docker-compose.yaml and its Dockerfile, checked without Docker (Docker cannot run here): the
file parses, every image is pinned, mounted paths exist, published ports do not clash, the
Airflow services are all there on one metadata database with the CeleryExecutor, the
environment matches what the code reads (connections, the S3 endpoint and its bucket), and the
topology is the one `make fleet` starts as processes (scripts/fleet.sh), which the fleet's
tests run (tests/e2e/test_fleet.py)."""

from __future__ import annotations

import json
import os
import re
import subprocess
from urllib.parse import urlparse

import pytest
import yaml

from stateops.core.registry import load_registry
from tests.conftest import ROOT

pytestmark = pytest.mark.unit

COMPOSE = yaml.safe_load((ROOT / "docker-compose.yaml").read_text())
SERVICES = COMPOSE["services"]
DOCKERFILE = (ROOT / "Dockerfile").read_text()
AIRFLOW = ["airflow-apiserver", "airflow-scheduler", "airflow-dag-processor", "airflow-triggerer"]
WORKERS = ["airflow-worker-w1", "airflow-worker-w2"]  # the Celery workers: the tasks' hosts
SPARK = ["spark-master", "spark-worker-1", "spark-worker-2"]
FLEET_SH = (ROOT / "scripts" / "fleet.sh").read_text()
CODE = [ROOT / d for d in ("include", "plugins", "dags", "scripts")]


def _env_sh_defaults() -> dict[str, str]:
    script = f"env -i bash -c 'source {ROOT}/scripts/env.sh && env'"
    out = subprocess.run(script, shell=True, capture_output=True, text=True, check=True).stdout
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def _command(service: str) -> str:
    command = SERVICES[service]["command"]
    return " ".join(command) if isinstance(command, list) else command


def _read_by_code(name: str) -> bool:
    return any(
        name in p.read_text(errors="replace")
        for d in CODE
        for p in d.rglob("*")
        if p.is_file() and p.suffix in (".py", ".sh")
    )


def test_every_image_is_pinned_and_spark_is_the_pinned_pyspark():
    from stateops import __version__ as version

    for name, service in SERVICES.items():
        repo, _, tag = service["image"].rpartition(":")
        assert repo and tag and tag != "latest", f"{name}: {service['image']} is not pinned"
        if "build" in service:  # the project's image, tagged with the project's version
            assert service["image"] == f"stateops:{version}", name
    base = re.search(r"^FROM (\S+)$", DOCKERFILE, re.M).group(1)
    assert re.fullmatch(r"[\w./-]+:\d+\.\d+\.\d+[\w.-]*", base), f"Dockerfile FROM {base}"
    # Spark runs from PySpark's own spark-class in the image that installs requirements.txt:
    # the cluster's Spark is the pinned one, and the executors' Python is the driver's.
    assert "pip install --no-cache-dir -r /tmp/requirements.txt" in DOCKERFILE
    assert "pip install --no-cache-dir --no-deps -r /tmp/requirements-fleet.txt" in DOCKERFILE
    assert "COPY requirements.txt requirements-fleet.txt /tmp/" in DOCKERFILE
    requirements = (ROOT / "requirements.txt").read_text()
    assert "pyspark==4.2.0" in requirements and "apache-airflow==3.3.2" in requirements
    images = {SERVICES[s]["image"] for s in AIRFLOW + WORKERS + SPARK + ["airflow-init"]}
    assert len(images) == 1, images
    for service in SPARK:
        assert _command(service).startswith("spark-class org.apache.spark.deploy."), service


def test_airflow_runs_every_component_on_postgres_with_the_celery_executor():
    commands = {s: _command(s) for s in AIRFLOW + WORKERS}
    assert commands == {
        "airflow-apiserver": "airflow api-server --port 8080",
        "airflow-scheduler": "airflow scheduler",
        "airflow-dag-processor": "airflow dag-processor",
        "airflow-triggerer": "airflow triggerer",
        "airflow-worker-w1": "airflow celery worker --celery-hostname w1 --queues default,w1",
        "airflow-worker-w2": "airflow celery worker --celery-hostname w2 --queues default,w2",
    }
    assert SERVICES["postgres"]["image"].startswith("postgres:")
    assert SERVICES["redis"]["image"].startswith("redis:")
    for service in AIRFLOW + WORKERS:
        env = SERVICES[service]["environment"]
        assert env["AIRFLOW__CORE__EXECUTOR"] == "CeleryExecutor"
        db = urlparse(env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"])
        assert (db.scheme, db.hostname) == ("postgresql+psycopg2", "postgres")
        assert db.username == SERVICES["postgres"]["environment"]["POSTGRES_USER"]
        backend = urlparse(env["AIRFLOW__CELERY__RESULT_BACKEND"])
        assert (backend.scheme, backend.hostname) == ("db+postgresql+psycopg2", "postgres")
        broker = urlparse(env["AIRFLOW__CELERY__BROKER_URL"])
        assert (broker.scheme, broker.hostname) == ("redis", "redis")
        api = urlparse(env["AIRFLOW__CORE__EXECUTION_API_SERVER_URL"])
        assert (api.hostname, api.port) == ("airflow-apiserver", 8080)
        assert SERVICES[service]["depends_on"]["airflow-init"]["condition"] == (
            "service_completed_successfully"
        )
    assert "airflow db migrate" in _command("airflow-init")
    assert "python -m zipfile -c build/stateops.zip include/stateops" in _command("airflow-init")


def _fleet_sh_exports() -> dict[str, str]:
    return dict(re.findall(r"^ *export (AIRFLOW__\w+)=\"?([^\"\n]*)\"?$", FLEET_SH, re.M))


def test_compose_runs_the_topology_that_make_fleet_runs_as_processes():
    """One topology, two forms: each part of scripts/fleet.sh is a service here, with the same
    settings where a setting is not the machine's (ports and names on loopback)."""
    hosts = re.search(r'^WORKERS="([^"]+)"$', FLEET_SH, re.M).group(1).split()
    assert [SERVICES[s]["hostname"] for s in WORKERS] == hosts
    assert 'airflow celery worker --celery-hostname "$host" --queues "default,$host"' in FLEET_SH
    for service, host in zip(WORKERS, hosts, strict=True):
        assert _command(service).endswith(f"--celery-hostname {host} --queues default,{host}")
        assert SERVICES[service]["networks"]["default"]["aliases"] == [host]  # drivers' address
    # The workers share no folder: each its own data volume; nothing mounts the host's ./data.
    data = SERVICES["airflow-worker-w1"]["environment"]["STATEOPS_DATA_DIR"]
    volumes = [
        next(v.split(":")[0] for v in SERVICES[s]["volumes"] if v.split(":")[1] == data)
        for s in WORKERS
    ]
    assert len(set(volumes)) == len(WORKERS) and all(v in COMPOSE["volumes"] for v in volumes)
    for name, service in SERVICES.items():
        assert not [v for v in service.get("volumes", []) if v.startswith("./data")], name
    # Airflow's settings: every one fleet.sh exports, but where it is this machine's.
    machine = {  # loopback ports, and one machine's name that both workers share
        "AIRFLOW__API__HOST", "AIRFLOW__API__PORT", "AIRFLOW__API__BASE_URL",
        "AIRFLOW__CORE__HOSTNAME_CALLABLE",
    }  # fmt: skip
    exported = _fleet_sh_exports()
    secrets = set(re.findall(r"export (AIRFLOW__\w+)=", FLEET_SH)) - set(exported)
    env = SERVICES["airflow-scheduler"]["environment"]
    assert set(exported) - machine <= set(env), set(exported) - machine - set(env)
    assert secrets <= set(env), secrets - set(env)  # drawn once per fleet folder by fleet.sh
    for key in ("AIRFLOW__CORE__EXECUTOR", "AIRFLOW__CELERY__WORKER_CONCURRENCY"):
        assert env[key] == exported[key], key
    for key in ("AIRFLOW__DATABASE__SQL_ALCHEMY_CONN", "AIRFLOW__CELERY__BROKER_URL",
                "AIRFLOW__CELERY__RESULT_BACKEND"):  # fmt: skip
        assert urlparse(env[key]).scheme == urlparse(exported[key]).scheme, key
    # Spark: a master and as many workers, each of the same size.
    workers = re.search(r"^for n in ([\d ]+); do\n  SPARK_WORKER_DIR", FLEET_SH, re.M).group(1)
    assert len(SPARK) - 1 == len(workers.split())
    size = re.search(r"(--cores \d+ \\?\s*--memory \w+)", FLEET_SH).group(1)
    for service in SPARK[1:]:
        assert " ".join(size.replace("\\", "").split()) in _command(service), service
    # Redis: its queues kept across a restart, in both.
    redis = re.search(r"(--save \S+ --appendonly \w+)", FLEET_SH).group(1)
    assert _command("redis").endswith(redis) and redis.endswith("yes"), redis
    assert SERVICES["redis"]["volumes"][0].endswith(":/data")  # the image's working folder
    cores = re.search(r'SPARK_MASTER_OPTS="([^"]+)" start spark-master', FLEET_SH).group(1)
    assert SERVICES["spark-master"]["environment"]["SPARK_MASTER_OPTS"] == cores
    # The registry, its bucket and the sample data: made the same way.
    bucket = re.search(r"^BUCKET=(\S+)$", FLEET_SH, re.M).group(1)
    assert "stateops.dev.fleet registry" in FLEET_SH
    init = _command("airflow-init")
    assert (
        f'python -m stateops.dev.fleet registry registry.yaml "$$STATEOPS_REGISTRY" {bucket}'
        in init
    )
    assert f"mc mb --ignore-existing local/{bucket}" in SERVICES["minio-init"]["entrypoint"]
    assert re.search(r"stateops\.dev\.sampledata --topic \S+ --users 40 --if-missing", FLEET_SH)
    assert "stateops.dev.sampledata --topic page-visits --users 40 --if-missing" in init


def test_mounted_paths_exist_and_ports_do_not_clash():
    published = []
    for name, service in SERVICES.items():
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            if source.startswith("."):
                assert (ROOT / source).exists(), f"{name}: {source}"
            else:
                assert source in COMPOSE["volumes"], f"{name}: named volume {source}"
        published += [port.rsplit(":", 1)[0] for port in service.get("ports", [])]
    assert len(published) == len(set(published)), published
    assert all(port.startswith("127.0.0.1:") for port in published)  # loopback only
    for copied in re.findall(r"^COPY (\S+) ", DOCKERFILE, re.M):
        assert (ROOT / copied).exists(), f"Dockerfile copies {copied}"


def test_the_environment_is_what_the_code_reads():
    env = SERVICES["airflow-scheduler"]["environment"]
    project = next(
        v.split(":")[1] for v in SERVICES["airflow-scheduler"]["volumes"] if v.startswith("./:")
    )
    for key in ("AIRFLOW__CORE__DAGS_FOLDER", "AIRFLOW__CORE__PLUGINS_FOLDER"):
        assert env[key].startswith(project + "/")
        assert (ROOT / env[key].removeprefix(project + "/")).is_dir(), key
    assert f"STATEOPS_HOME={project}" in DOCKERFILE
    assert f"PYTHONPATH={project}/include" in DOCKERFILE
    for name in [*env, *re.findall(r"\b(STATEOPS_\w+)=", DOCKERFILE)]:
        if name.startswith("STATEOPS_"):
            assert _read_by_code(name), f"{name} is set but nothing reads it"
    # The registry every Airflow process reads: the file airflow-init writes to the config
    # volume (the fleet's: the control store and the checkpoints in S3).
    config = env["STATEOPS_REGISTRY"].rsplit("/", 1)[0]
    for service in AIRFLOW + WORKERS:
        assert f"stateops-config:{config}:ro" in SERVICES[service]["volumes"], service
    assert f"stateops-config:{config}" in SERVICES["airflow-init"]["volumes"]
    assert env["AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE"].startswith(config + "/")

    # Connections: the ids the code uses, pointing at the services.
    registry = load_registry(ROOT / "registry.yaml")
    tasks = (ROOT / "include" / "stateops_airflow" / "tasks.py").read_text()
    assert 'conn_id="spark_default"' in tasks
    spark = json.loads(env["AIRFLOW_CONN_SPARK_DEFAULT"])
    assert spark["host"] == "spark://spark-master"
    assert f"--port {spark['port']}" in _command("spark-master")
    for service in SPARK[1:]:
        assert f"spark://spark-master:{spark['port']}" in _command(service)
    aws = json.loads(env[f"AIRFLOW_CONN_{registry.backups.conn_id.upper()}"])
    minio = SERVICES["minio"]["environment"]
    assert (aws["login"], aws["password"]) == (
        minio["MINIO_ROOT_USER"],
        minio["MINIO_ROOT_PASSWORD"],
    )
    assert aws["extra"]["endpoint_url"] == "http://minio:9000"


def test_minio_is_the_backup_endpoint_the_code_reads():
    env = _env_sh_defaults()
    minio = SERVICES["minio"]
    assert minio["environment"]["MINIO_ROOT_USER"] == env["AWS_ACCESS_KEY_ID"]
    assert minio["environment"]["MINIO_ROOT_PASSWORD"] == env["AWS_SECRET_ACCESS_KEY"]
    port = re.search(r":(\d+)$", env["STATEOPS_S3_ENDPOINT_URL"]).group(1)
    assert f"127.0.0.1:{port}:9000" in minio["ports"]
    init = SERVICES["minio-init"]["entrypoint"]
    assert "mc mb --ignore-existing local/stateops-fleet" in init  # the fleet's registry's
    assert f"{env['AWS_ACCESS_KEY_ID']} {env['AWS_SECRET_ACCESS_KEY']}" in init
    airflow = SERVICES["airflow-scheduler"]["environment"]
    conn_id = load_registry(ROOT / "registry.yaml").backups.conn_id
    assert airflow["STATEOPS_CHECKPOINT_CONN_ID"] == conn_id


def test_kafka_is_one_kraft_node_the_airflow_services_and_the_executors_reach():
    kafka = SERVICES["kafka"]
    env = kafka["environment"]
    # The image's Kafka is the embedded broker's (maven/broker/pom.xml): one version in tests,
    # the demo and deployments.
    pom = (ROOT / "maven" / "broker" / "pom.xml").read_text()
    version = re.search(r"<artifactId>kafka_2\.13</artifactId>\s*<version>([^<]+)<", pom)[1]
    assert kafka["image"] == f"apache/kafka:{version}"
    assert SERVICES["kafka-init"]["image"] == kafka["image"]
    # KRaft, one node: broker and its own controller, every internal topic on one replica.
    assert env["KAFKA_PROCESS_ROLES"] == "broker,controller"
    assert env["KAFKA_CONTROLLER_QUORUM_VOTERS"] == f"{env['KAFKA_NODE_ID']}@kafka:9093"
    assert "CONTROLLER://:9093" in env["KAFKA_LISTENERS"].split(",")
    for key, value in env.items():
        if key.endswith(("_REPLICATION_FACTOR", "_MIN_ISR")):
            assert value == 1, key
    advertised = dict(
        listener.split("://") for listener in env["KAFKA_ADVERTISED_LISTENERS"].split(",")
    )
    listeners = dict(listener.split("://") for listener in env["KAFKA_LISTENERS"].split(","))
    for name, address in advertised.items():
        assert listeners[name] == ":" + address.rsplit(":", 1)[1], name
    assert kafka["hostname"] == "kafka"
    # Inside: the Airflow tasks (connection and environment) and the Spark executors.
    internal = advertised[env["KAFKA_INTER_BROKER_LISTENER_NAME"]]
    for service in AIRFLOW + WORKERS + ["airflow-init"]:
        airflow = SERVICES[service]["environment"]
        conn = json.loads(airflow["AIRFLOW_CONN_KAFKA_DEFAULT"])
        assert conn["conn_type"] == "kafka"
        assert (
            conn["extra"]["bootstrap.servers"]
            == internal
            == (airflow["STATEOPS_KAFKA_BOOTSTRAP_SERVERS"])
        )
    # Outside: the host's CLI at scripts/env.sh's default, on loopback.
    host = _env_sh_defaults()["STATEOPS_KAFKA_BOOTSTRAP_SERVERS"]
    assert host in advertised.values()
    assert f"{host}:{host.rsplit(':', 1)[1]}" in kafka["ports"]
    assert SERVICES["airflow-init"]["depends_on"]["kafka-init"]["condition"] == (
        "service_completed_successfully"
    )
    assert SERVICES["kafka-init"]["depends_on"]["kafka"]["condition"] == "service_healthy"
    assert internal in " ".join(kafka["healthcheck"]["test"])


def test_kafka_init_creates_every_topic_the_registry_reads():
    registry = yaml.safe_load((ROOT / "registry.yaml").read_text())
    topics = {
        topic
        for query in registry["queries"].values()
        for source in [query.get("source")] + list(query.get("sources", {}).values())
        if source and source["format"] == "kafka"
        for topic in [source.get("topic")] + source.get("topics", [])
        if topic
    }
    assert topics, "registry.yaml has a Kafka query (the demo's)"
    init = SERVICES["kafka-init"]["entrypoint"]
    env = SERVICES["kafka"]["environment"]
    internal = dict(x.split("://") for x in env["KAFKA_ADVERTISED_LISTENERS"].split(","))
    created = re.findall(r"--create --if-not-exists --topic (\S+)", init)
    assert set(created) == topics
    assert f"--bootstrap-server {internal[env['KAFKA_INTER_BROKER_LISTENER_NAME']]}" in init


def test_env_sh_sets_the_kafka_connection_from_the_bootstrap_servers_overridable():
    defaults = _env_sh_defaults()
    conn = json.loads(defaults["AIRFLOW_CONN_KAFKA_DEFAULT"])
    assert conn == {"conn_type": "kafka", "extra": {"bootstrap.servers": "127.0.0.1:9092"}}
    script = (
        f"env -i STATEOPS_KAFKA_BOOTSTRAP_SERVERS=b:1 bash -c 'source {ROOT}/scripts/env.sh && env'"
    )
    out = subprocess.run(script, shell=True, capture_output=True, text=True, check=True).stdout
    env = dict(line.split("=", 1) for line in out.splitlines() if "=" in line)
    assert json.loads(env["AIRFLOW_CONN_KAFKA_DEFAULT"])["extra"]["bootstrap.servers"] == "b:1"


def test_spark_gets_its_s3_jars_from_the_image_mvn_on_the_same_path_everywhere():
    # airflow-init fetches them as `make jars` does, before any Airflow service (any driver)
    # starts, with the Maven the image installs; no artifact repository is named here.
    init = _command("airflow-init")
    assert "PY=python scripts/fetch_jars.sh spark s3" in init
    assert init.index("fetch_jars.sh") < init.index("stateops.zip")
    assert re.search(r"apt-get install .*\bmaven\b", DOCKERFILE)
    for text in (DOCKERFILE, (ROOT / "docker-compose.yaml").read_text()):
        assert not re.search(r"https?://[^\s\"']*(maven|repo1|repository)", text, re.I)
    assert "maven-cache:/home/stateops/.m2" in SERVICES["airflow-init"]["volumes"]
    assert "useradd --uid 50000" in DOCKERFILE and "mkdir -p /home/stateops/.m2" in DOCKERFILE
    # The class path a job names (stateops.spark.jobs.S3_JARS, under the project) is the
    # mounted project's build/jars/s3 on the driver (Airflow) and on the executors (worker).
    from stateops.spark.jobs import PROJECT_ROOT, S3_JARS

    home = re.search(r"STATEOPS_HOME=(\S+)", DOCKERFILE).group(1)
    for service in ["airflow-init", *AIRFLOW, *WORKERS, *SPARK]:
        mounts = [v for v in SERVICES[service]["volumes"] if v.startswith("./:")]
        assert mounts and mounts[0].split(":")[1] == home, service
    assert S3_JARS.relative_to(PROJECT_ROOT).as_posix() == "build/jars/s3"
    assert "build/jars/$set" in (ROOT / "scripts" / "fetch_jars.sh").read_text()


def test_every_service_that_runs_spark_has_the_s3_settings_of_minio(monkeypatch):
    from stateops.core.s3 import checkpoint_settings, spark_s3_conf

    minio = SERVICES["minio"]["environment"]
    for service in [*AIRFLOW, *WORKERS, *SPARK]:
        env = SERVICES[service]["environment"]
        for key in [k for k in os.environ if k.startswith(("AIRFLOW_CONN_", "STATEOPS_", "AWS_"))]:
            monkeypatch.delenv(key)
        for key, value in env.items():
            monkeypatch.setenv(key, str(value))
        conf = spark_s3_conf(checkpoint_settings())  # what a job sets in its session
        assert conf["spark.hadoop.fs.s3a.endpoint"] == "http://minio:9000", service
        assert conf["spark.hadoop.fs.s3a.path.style.access"] == "true"
        assert conf["spark.hadoop.fs.s3a.connection.ssl.enabled"] == "false"
        assert (conf["spark.hadoop.fs.s3a.access.key"], conf["spark.hadoop.fs.s3a.secret.key"]) == (
            minio["MINIO_ROOT_USER"],
            minio["MINIO_ROOT_PASSWORD"],
        )
    # No S3 setting of Spark's own on a command line, where ps and task logs would show it.
    for service in SERVICES:
        assert "fs.s3a" not in str(SERVICES[service].get("command", "")), service
