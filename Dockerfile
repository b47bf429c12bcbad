# One image for Airflow and for the Spark master and workers of docker-compose.yaml: the same
# Python, PySpark (whose spark-class runs the standalone cluster: the Spark of requirements.txt)
# and libraries on the driver and the executors, as transformWithStateInPandas needs.
# The project itself is mounted at /opt/stateops, not copied.
FROM python:3.11.7-slim-bookworm

# Maven and a JDK: docker-compose's airflow-init fetches Spark's jars (Kafka's connector, and
# S3A with the AWS SDK bundle) into the mounted project's build/jars with scripts/fetch_jars.sh
# and compiles the project's checkpoint file manager for s3a:// checkpoints beside them
# (scripts/build_checkpoint_jar.sh), as `make jars` does on a machine; Maven's own settings say
# where artifacts come from.
RUN apt-get update \
    && apt-get install -y --no-install-recommends openjdk-17-jdk-headless procps curl maven \
    && rm -rf /var/lib/apt/lists/*
ENV JAVA_HOME=/usr/lib/jvm/java-17-openjdk-amd64

COPY requirements.txt requirements-fleet.txt /tmp/
# The pinned set `make test` runs with, and what `make fleet` adds to it: Airflow's
# CeleryExecutor with Redis, the drivers of its Postgres metadata database (new packages only,
# so --no-deps changes nothing the first set installed).
RUN pip install --no-cache-dir -r /tmp/requirements.txt \
    && pip install --no-cache-dir --no-deps -r /tmp/requirements-fleet.txt

RUN useradd --uid 50000 --gid 0 --create-home stateops
USER 50000
# mvn's cache: a volume in docker-compose, which takes this folder's owner (the user's own).
RUN mkdir -p /home/stateops/.m2
ENV PYTHONPATH=/opt/stateops/include \
    STATEOPS_HOME=/opt/stateops \
    SPARK_CONF_DIR=/opt/stateops/conf \
    PYSPARK_PYTHON=python \
    AIRFLOW_HOME=/opt/airflow
WORKDIR /opt/stateops
