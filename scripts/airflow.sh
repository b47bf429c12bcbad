#!/usr/bin/env bash
# `make airflow`: every lifecycle DAG in a local Airflow, on loopback, from the project's own
# environment: `airflow standalone` (SQLite, LocalExecutor, login admin / $STATEOPS_ADMIN_PASSWORD),
# a Spark standalone master and worker, the embedded S3 endpoint (SeaweedFS) and the
# embedded Kafka broker, with the connections pointing at them and sample data in place (landing
# files, and the Kafka queries' topics). Ctrl-C (or `make airflow-stop` from
# another shell) stops all of it.
set -euo pipefail
source "$(dirname "$0")/env.sh"
source "$(dirname "$0")/sessions.sh"
cd "$STATEOPS_HOME"

DATA="${STATEOPS_DATA_DIR:-$STATEOPS_HOME/data}"
RUN="$DATA/_stateops/airflow"          # pid files and logs of what this script started
PORT="${STATEOPS_AIRFLOW_PORT:-8080}"
SPARK_PORT="${STATEOPS_SPARK_PORT:-7077}"
S3_PORT="${STATEOPS_S3_PORT:-9000}"
KAFKA_PORT="${STATEOPS_KAFKA_PORT:-${STATEOPS_KAFKA_BOOTSTRAP_SERVERS##*:}}"
PASSWORD="${STATEOPS_ADMIN_PASSWORD:-admin}"
# The people who may sign in (space-separated; each an admin, each with that password): a
# query whose approvals refuse the triggerer (approvers.not_the_triggerer) needs two.
USERS="${STATEOPS_AIRFLOW_USERS:-admin}"
export STATEOPS_DATA_DIR="$DATA"

stop_all() {  # newest first: Airflow (Ctrl-C, as in a terminal), then the services it uses
  touch "$RUN/stopping"
  stop_session airflow INT
  for name in kafka s3 spark-worker spark-master; do stop_session "$name"; done
  rm -f "$RUN/stopping"
}

if [ "${1:-}" = "stop" ]; then
  stop_all
  echo "stopped"
  exit 0
fi

rm -f "$RUN/stopping"
if compgen -G "$RUN/*.pid" > /dev/null; then
  echo "error: already running (pid files in $RUN); stop it first: make airflow-stop" >&2
  exit 2
fi
mkdir -p "$RUN"

trap 'echo; echo "stopping..."; stop_all; echo "stopped"' EXIT
trap 'exit 130' INT TERM

if [ -z "$(ls -A "$DATA/landing" 2>/dev/null)" ]; then
  echo "sample events into $DATA/landing"
  stateops generate --round 0 --events 250 --files 4 --users 40 > /dev/null
fi

echo "Spark standalone master spark://127.0.0.1:$SPARK_PORT and a worker (2 cores)"
export SPARK_LOCAL_IP=127.0.0.1
start spark-master spark-class org.apache.spark.deploy.master.Master --host 127.0.0.1 \
  --port "$SPARK_PORT" --webui-port "${STATEOPS_SPARK_UI_PORT:-8081}"
SPARK_WORKER_DIR="$RUN/spark-work" start spark-worker spark-class \
  org.apache.spark.deploy.worker.Worker "spark://127.0.0.1:$SPARK_PORT" --cores 2 --memory 4g \
  --webui-port "${STATEOPS_SPARK_WORKER_UI_PORT:-8082}"

export STATEOPS_S3_ENDPOINT_URL="http://127.0.0.1:$S3_PORT"
echo "S3 endpoint $STATEOPS_S3_ENDPOINT_URL (SeaweedFS, its objects in $DATA/s3)"
start s3 python -m stateops.dev.s3server "$DATA/s3"

export STATEOPS_KAFKA_BOOTSTRAP_SERVERS="127.0.0.1:$KAFKA_PORT"
export AIRFLOW_CONN_KAFKA_DEFAULT="{\"conn_type\":\"kafka\",\"extra\":{\"bootstrap.servers\":\"$STATEOPS_KAFKA_BOOTSTRAP_SERVERS\"}}"
echo "Kafka broker $STATEOPS_KAFKA_BOOTSTRAP_SERVERS (storage and log in $DATA/kafka)"
start kafka python -m stateops.dev.kafka --dir "$DATA/kafka" --port "$KAFKA_PORT"
wait_until kafka 60 grep -q "^Kafka broker" "$RUN/kafka.log"
# The registry's Kafka queries read their topics: sample page views into each new one.
for topic in $(python -c 'from stateops.core.registry import load_registry
print(*sorted({t for q in load_registry().queries.values() for s in q.inputs.values()
               for t in s.subscribed}))'); do
  python -m stateops.dev.sampledata --topic "$topic" --users 40 --if-missing | sed 's/^/  /'
done

export AIRFLOW_CONN_SPARK_DEFAULT="{\"conn_type\":\"spark\",\"host\":\"spark://127.0.0.1\",\"port\":$SPARK_PORT}"
export AIRFLOW_CONN_AWS_DEFAULT="{\"conn_type\":\"aws\",\"login\":\"$AWS_ACCESS_KEY_ID\",\"password\":\"$AWS_SECRET_ACCESS_KEY\",\"extra\":{\"endpoint_url\":\"$STATEOPS_S3_ENDPOINT_URL\"}}"
export AIRFLOW__API__HOST=127.0.0.1
export AIRFLOW__API__PORT="$PORT"
export AIRFLOW__CORE__EXECUTION_API_SERVER_URL="http://127.0.0.1:$PORT/execution/"
export AIRFLOW__CORE__EXECUTOR=LocalExecutor
# Tasks report to the API server over HTTP, 5 s a call by default: on a small machine busy with
# Spark jobs (2 cores here) the server answered too late 4 times in a row and a task failed
# before it ran ("Workload execution failed ... httpx.ReadTimeout"). 30 s rides that out.
export AIRFLOW__WORKERS__EXECUTION_API_TIMEOUT="${AIRFLOW__WORKERS__EXECUTION_API_TIMEOUT:-30}"
AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS=$(printf '%s:admin,' $USERS)
export AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS="${AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS%,}"
export AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE="$RUN/passwords.json"
python -c 'import json, sys; print(json.dumps(dict.fromkeys(sys.argv[2:], sys.argv[1])))' \
  "$PASSWORD" $USERS > "$RUN/passwords.json"
airflow db migrate > "$RUN/db-migrate.log" 2>&1
echo "airflow standalone"
start airflow airflow standalone
wait_until airflow 180 curl -s -o /dev/null "http://127.0.0.1:$PORT/api/v2/version"
# Every lifecycle DAG unpaused, once the DAG processor has stored them (a paused DAG's manual
# runs would only queue). STATEOPS_UNPAUSE: the DAGs to unpause (default: all; an unpaused
# scheduled DAG runs once at once, for its latest interval). Over the REST API: an `airflow`
# command costs seconds of CPU a call, on the cores the DAG processor is parsing with.
python -m stateops.dev.airflow_dags "http://127.0.0.1:$PORT" "$RUN/passwords.json" \
  --expect "$(ls dags/stream_*.py | wc -l)" --unpause "${STATEOPS_UNPAUSE:-}"

cat <<EOF

  Airflow UI    http://127.0.0.1:$PORT   (login: ${USERS// /, } / $PASSWORD)
  Spark master  http://127.0.0.1:${STATEOPS_SPARK_UI_PORT:-8081}
  S3 endpoint   $STATEOPS_S3_ENDPOINT_URL   (key $AWS_ACCESS_KEY_ID)
  Kafka broker  $STATEOPS_KAFKA_BOOTSTRAP_SERVERS   (connection kafka_default)
  Data          $DATA     Logs: $RUN
  CLI           export STATEOPS_KAFKA_BOOTSTRAP_SERVERS=$STATEOPS_KAFKA_BOOTSTRAP_SERVERS; source scripts/env.sh; export STATEOPS_REGISTRY=${STATEOPS_REGISTRY:-$STATEOPS_HOME/registry.yaml} STATEOPS_DATA_DIR=$DATA STATEOPS_S3_ENDPOINT_URL=$STATEOPS_S3_ENDPOINT_URL

Ctrl-C (or \`make airflow-stop\` in another shell) stops everything.
EOF
watch_sessions
