#!/usr/bin/env bash
# `make fleet`: the production shape, as processes on loopback. Postgres as Airflow's metadata
# database; Airflow's api-server, scheduler, dag-processor and triggerer; the CeleryExecutor
# with Redis as its broker and two Celery workers, each with its own empty data folder, home
# and temp folder (they share what two hosts would: the control store, checkpoints and sinks
# in S3, Kafka, the Spark cluster); a Spark standalone master with two workers; a Kafka broker
# and the S3 endpoint. The registry is the project's Kafka queries with their state in S3
# (stateops.dev.fleet). `make fleet-stop` (or Ctrl-C) stops every process it started.
set -euo pipefail
source "$(dirname "$0")/env.sh"
source "$(dirname "$0")/sessions.sh"
cd "$STATEOPS_HOME"

FLEET="${STATEOPS_FLEET_DIR:-$STATEOPS_HOME/build/fleet}"
RUN="$FLEET/run"                     # pid files and logs of what this script started
PG="$FLEET/postgres"                 # its data, socket and log, owned by whoever runs it
PORT="${STATEOPS_FLEET_PORT:-8180}"  # the UI and API (make airflow's is 8080)
PG_PORT="${STATEOPS_FLEET_PG_PORT:-55432}"
REDIS_PORT="${STATEOPS_FLEET_REDIS_PORT:-56379}"
SPARK_PORT="${STATEOPS_FLEET_SPARK_PORT:-7177}"
S3_PORT="${STATEOPS_FLEET_S3_PORT:-9200}"
KAFKA_PORT="${STATEOPS_FLEET_KAFKA_PORT:-9292}"
BUCKET=stateops-fleet
PASSWORD="${STATEOPS_ADMIN_PASSWORD:-admin}"
WORKERS="w1 w2"
# Stopped newest first: the workers (a warm shutdown ends their tasks), then what they use.
ORDER="worker-w2 worker-w1 triggerer dag-processor scheduler api-server kafka s3
  spark-worker-2 spark-worker-1 spark-master redis"   # and Postgres, last

as_postgres() {  # Postgres refuses to run as root: as the postgres user where we are root
  if [ "$(id -u)" -eq 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi
}
stop_all() {
  touch "$RUN/stopping"
  for name in $ORDER; do stop_session "$name"; done
  if [ -e "$RUN/postgres.pid" ]; then  # pg_ctl's daemon, not a session of ours
    as_postgres "$PG_BIN/pg_ctl" -D "$PG/data" -m fast -w -t 60 stop > /dev/null 2>&1 \
      || kill -QUIT "$(cat "$RUN/postgres.pid")" 2>/dev/null || true
    rm -f "$RUN/postgres.pid"
  fi
  rm -f "$RUN/stopping"
}

# As root, each worker is a host of its own name: its own UTS and mount namespaces, with its
# name in its own /etc/hosts. A lease names its holder by host name, and only a holder on the
# taker's own host can be seen dead at once; on another host it is taken over when its lease
# expires, as on a real fleet. (Without root both keep this host's name; Airflow still shows
# each worker's own name, through the hostname callable.)
start_worker() {  # start_worker HOST: a Celery worker on an empty host of that name
  local host="$1" root="$FLEET/hosts/$1" isolated=()
  if [ "$(id -u)" -eq 0 ] && unshare --uts --mount true 2> /dev/null; then
    isolated=(unshare --uts --mount sh -c \
      'hostname "$1" && mount --bind "$2" /etc/hosts && shift 2 && exec "$@"' sh)
  fi
  echo "Celery worker $host: data, home and temp in $root (queues default, $host)"
  rm -rf "$root" && mkdir -p "$root/data" "$root/home" "$root/tmp"
  printf '127.0.0.1 localhost %s\n::1 localhost\n' "$host" > "$root/etc-hosts"
  (cd "$root" && STATEOPS_FLEET_HOST="$host" STATEOPS_DATA_DIR="$root/data" HOME="$root/home" \
    TMPDIR="$root/tmp" start "worker-$host" \
    ${isolated[@]+"${isolated[@]}" "$host" "$root/etc-hosts"} \
    airflow celery worker --celery-hostname "$host" --queues "default,$host" --skip-serve-logs)
}

worker_ready() { wait_until "worker-$1" 180 grep -q "celery@$1 ready" "$RUN/worker-$1.log"; }

# The broker keeps its queues in an append-only file: a restart loses no queued task.
start_redis() {
  start redis redis-server --bind 127.0.0.1 --port "$REDIS_PORT" --dir "$RUN" \
    --save "" --appendonly yes
  wait_until redis 30 redis-cli -p "$REDIS_PORT" ping
}

fleet_env() {  # what every process of the fleet sees: the endpoints, the registry, and
  # Airflow, configured by its environment only (with the secrets drawn for this folder)
  source "$FLEET/secrets.env"
  export SPARK_LOCAL_IP=127.0.0.1
  export STATEOPS_S3_ENDPOINT_URL="http://127.0.0.1:$S3_PORT"
  export AIRFLOW_CONN_AWS_DEFAULT="{\"conn_type\":\"aws\",\"login\":\"$AWS_ACCESS_KEY_ID\",\"password\":\"$AWS_SECRET_ACCESS_KEY\",\"extra\":{\"endpoint_url\":\"$STATEOPS_S3_ENDPOINT_URL\"}}"
  export STATEOPS_KAFKA_BOOTSTRAP_SERVERS="127.0.0.1:$KAFKA_PORT"
  export AIRFLOW_CONN_KAFKA_DEFAULT="{\"conn_type\":\"kafka\",\"extra\":{\"bootstrap.servers\":\"$STATEOPS_KAFKA_BOOTSTRAP_SERVERS\"}}"
  export STATEOPS_REGISTRY="$FLEET/registry.yaml"
  export AIRFLOW_HOME="$FLEET/airflow"
  export AIRFLOW__CORE__EXECUTOR=CeleryExecutor
  export AIRFLOW__DATABASE__SQL_ALCHEMY_CONN="postgresql+psycopg2://airflow:airflow@127.0.0.1:$PG_PORT/airflow"
  export AIRFLOW__CELERY__BROKER_URL="redis://127.0.0.1:$REDIS_PORT/0"
  # (+psycopg2: SQLAlchemy 2.1 would pick psycopg 3 for a plain postgresql:// URL)
  export AIRFLOW__CELERY__RESULT_BACKEND="db+postgresql+psycopg2://airflow:airflow@127.0.0.1:$PG_PORT/airflow"
  export AIRFLOW__CELERY__WORKER_CONCURRENCY=2
  export AIRFLOW__API__HOST=127.0.0.1
  export AIRFLOW__API__PORT="$PORT"
  export AIRFLOW__API__BASE_URL="http://127.0.0.1:$PORT"
  export AIRFLOW__CORE__EXECUTION_API_SERVER_URL="http://127.0.0.1:$PORT/execution/"
  export AIRFLOW__WORKERS__EXECUTION_API_TIMEOUT="${AIRFLOW__WORKERS__EXECUTION_API_TIMEOUT:-30}"
  export AIRFLOW__CORE__HOSTNAME_CALLABLE=stateops.dev.fleet.hostname
  export AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS=admin:admin
  export AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE="$RUN/passwords.json"
  export AIRFLOW_CONN_SPARK_DEFAULT="{\"conn_type\":\"spark\",\"host\":\"spark://127.0.0.1\",\"port\":$SPARK_PORT}"
}

PG_BIN="$(dirname "$(command -v pg_ctl 2>/dev/null || ls /usr/lib/postgresql/*/bin/pg_ctl 2>/dev/null | tail -1 || echo /nonexistent/pg_ctl)")"
if [ "${1:-}" = "stop" ]; then
  [ -d "$RUN" ] && stop_all
  echo "stopped"
  exit 0
fi
# A part of a running fleet again: `worker w1` puts a new, empty host in a lost worker's
# place; `redis` restarts the broker (the workers reconnect, queued tasks are kept).
if [ "${1:-}" = worker ] || [ "${1:-}" = redis ]; then
  if ! running api-server; then
    echo "error: the fleet is not running; start it: make fleet" >&2; exit 2
  fi
  fleet_env
  if [ "$1" = redis ]; then
    stop_session redis && start_redis
    echo "Redis restarted on 127.0.0.1:$REDIS_PORT"
    exit 0
  fi
  host="${2:-}"
  case " $WORKERS " in *" $host "*) ;; *) echo "error: no worker '$host'; the fleet's: $WORKERS" >&2; exit 2 ;; esac
  if running "worker-$host"; then
    echo "error: worker $host is running; stop it first (or make fleet-stop)" >&2; exit 2
  fi
  start_worker "$host"
  worker_ready "$host"
  echo "celery@$host is back: an empty host of that name, taking its queues again"
  exit 0
fi

# What the fleet needs that `make` cannot install (it needs root): named, not installed.
missing=()
[ -x "$PG_BIN/pg_ctl" ] && [ -x "$PG_BIN/initdb" ] || missing+=("PostgreSQL (apt-get install postgresql)")
command -v redis-server > /dev/null || missing+=("Redis (apt-get install redis-server)")
if [ "$(id -u)" -eq 0 ] && ! id postgres > /dev/null 2>&1; then
  missing+=("a postgres user to run PostgreSQL as (Debian's postgresql package creates it)")
elif [ "$(id -u)" -eq 0 ] && ! runuser -u postgres -- test -x "$(dirname "$FLEET")"; then
  echo "error: the postgres user cannot reach $(dirname "$FLEET"); set STATEOPS_FLEET_DIR to a folder it can (e.g. under /tmp)" >&2
  exit 2
fi
if [ "${#missing[@]}" -gt 0 ]; then
  echo "error: make fleet needs $(IFS=,; echo "${missing[*]}" | sed 's/,/, /g'); install as root, then run it again" >&2
  exit 2
fi
rm -f "$RUN/stopping"
if compgen -G "$RUN/*.pid" > /dev/null; then
  echo "error: already running (pid files in $RUN); stop it first: make fleet-stop" >&2
  exit 2
fi
for port in "$PORT" "$PG_PORT" "$REDIS_PORT" "$SPARK_PORT" "$S3_PORT" "$KAFKA_PORT"; do
  if (exec 3<> "/dev/tcp/127.0.0.1/$port") 2> /dev/null; then
    echo "error: port $port on 127.0.0.1 is taken; free it or set STATEOPS_FLEET_*_PORT" >&2
    exit 2
  fi
done
mkdir -p "$RUN"

# Secrets the api-server and every worker share, drawn once for this fleet folder.
if [ ! -s "$FLEET/secrets.env" ]; then
  umask 077
  python - > "$FLEET/secrets.env" <<'EOF'
import base64, os, secrets
print(f"export AIRFLOW__API_AUTH__JWT_SECRET={secrets.token_hex(32)}")
print(f"export AIRFLOW__API__SECRET_KEY={secrets.token_hex(32)}")
print(f"export AIRFLOW__CORE__FERNET_KEY={base64.urlsafe_b64encode(os.urandom(32)).decode()}")
EOF
  umask 022
fi
fleet_env
printf '{"admin": "%s"}\n' "$PASSWORD" > "$RUN/passwords.json"

trap 'echo; echo "stopping..."; stop_all; echo "stopped"' EXIT
trap 'exit 130' INT TERM


echo "PostgreSQL on 127.0.0.1:$PG_PORT (Airflow's metadata database, in $PG)"
mkdir -p "$PG"
[ "$(id -u)" -ne 0 ] || chown postgres "$PG"
if [ ! -s "$PG/data/PG_VERSION" ]; then
  as_postgres "$PG_BIN/initdb" -D "$PG/data" -U postgres -E UTF8 --auth-local=trust \
    --auth-host=scram-sha-256 > "$RUN/initdb.log" 2>&1 || { tail -5 "$RUN/initdb.log" >&2; exit 1; }
fi
as_postgres mkdir -p "$PG/socket"
as_postgres "$PG_BIN/pg_ctl" -D "$PG/data" -l "$PG/postgres.log" -w -t 60 start \
  -o "-p $PG_PORT -c listen_addresses=127.0.0.1 -c unix_socket_directories=$PG/socket" \
  > /dev/null || { tail -5 "$PG/postgres.log" >&2; exit 1; }
head -1 "$PG/data/postmaster.pid" > "$RUN/postgres.pid"
psql_admin() { psql -h "$PG/socket" -p "$PG_PORT" -U postgres -d postgres -qAt -v ON_ERROR_STOP=1 "$@"; }
if [ -z "$(psql_admin -c "select 1 from pg_roles where rolname = 'airflow'")" ]; then
  psql_admin -c "create role airflow login password 'airflow'"
  psql_admin -c "create database airflow owner airflow"
fi

echo "Redis on 127.0.0.1:$REDIS_PORT (the Celery broker)"
start_redis

echo "Spark standalone master spark://127.0.0.1:$SPARK_PORT and two workers (1 core each)"
# One core per application unless it asks for more: a continuous query leaves the other core
# to the jobs of an operation on it (the migration's drain, export, first batch).
SPARK_MASTER_OPTS="-Dspark.deploy.defaultCores=1" start spark-master spark-class org.apache.spark.deploy.master.Master --host 127.0.0.1 \
  --port "$SPARK_PORT" --webui-port "${STATEOPS_FLEET_SPARK_UI_PORT:-8181}"
for n in 1 2; do
  SPARK_WORKER_DIR="$FLEET/spark-worker-$n" start "spark-worker-$n" spark-class \
    org.apache.spark.deploy.worker.Worker "spark://127.0.0.1:$SPARK_PORT" --cores 1 \
    --memory 2g --webui-port "$(( ${STATEOPS_FLEET_SPARK_UI_PORT:-8181} + n ))"
done

echo "S3 endpoint $STATEOPS_S3_ENDPOINT_URL (bucket $BUCKET: checkpoints, sinks, control store)"
start s3 python -m stateops.dev.s3server "$FLEET/s3" --port "$S3_PORT" --bucket "$BUCKET"
wait_until s3 120 grep -q "^S3 endpoint" "$RUN/s3.log"

echo "Kafka broker $STATEOPS_KAFKA_BOOTSTRAP_SERVERS"
start kafka python -m stateops.dev.kafka --dir "$FLEET/kafka" --port "$KAFKA_PORT"
wait_until kafka 120 grep -q "^Kafka broker" "$RUN/kafka.log"

queries="$(python -m stateops.dev.fleet registry "$STATEOPS_HOME/registry.yaml" "$STATEOPS_REGISTRY" "$BUCKET")"
echo "Registry $STATEOPS_REGISTRY: $queries, state in s3://$BUCKET/"
for topic in $(python -c 'from stateops.core.registry import load_registry
print(*sorted({t for q in load_registry().queries.values() for s in q.inputs.values()
               for t in s.subscribed}))'); do
  python -m stateops.dev.sampledata --topic "$topic" --users 40 --if-missing | sed 's/^/  /'
done

mkdir -p "$AIRFLOW_HOME"
airflow db migrate > "$RUN/db-migrate.log" 2>&1 || { tail -15 "$RUN/db-migrate.log" >&2; exit 1; }

echo "Airflow api-server http://127.0.0.1:$PORT, scheduler, dag-processor, triggerer"
start api-server airflow api-server
wait_until api-server 180 curl -sf "http://127.0.0.1:$PORT/api/v2/monitor/health"
start scheduler airflow scheduler
start dag-processor airflow dag-processor
# (no log server: it would listen on every interface, on one fixed port for both workers)
start triggerer airflow triggerer --skip-serve-logs
for host in $WORKERS; do start_worker "$host"; done
for host in $WORKERS; do worker_ready "$host"; done
python -m stateops.dev.airflow_dags "http://127.0.0.1:$PORT" "$RUN/passwords.json" \
  --expect "$(ls dags/stream_*.py | wc -l)" --unpause "${STATEOPS_UNPAUSE:-}"

cat <<EOF

  Airflow UI    http://127.0.0.1:$PORT   (login: admin / $PASSWORD)
  Workers       $(airflow celery list-workers 2>/dev/null | grep -o 'celery@[a-z0-9-]*' | sort | tr '\n' ' ')(Celery, broker redis://127.0.0.1:$REDIS_PORT)
  Database      postgresql://127.0.0.1:$PG_PORT/airflow
  Spark master  spark://127.0.0.1:$SPARK_PORT   (UI http://127.0.0.1:${STATEOPS_FLEET_SPARK_UI_PORT:-8181})
  S3 endpoint   $STATEOPS_S3_ENDPOINT_URL   (bucket $BUCKET)
  Kafka broker  $STATEOPS_KAFKA_BOOTSTRAP_SERVERS
  Registry      $STATEOPS_REGISTRY     Logs: $RUN

Ctrl-C (or \`make fleet-stop\` in another shell) stops everything. A worker lost (Celery's or
Spark's) is a host lost: its work is retried on the other one, and the rest goes on;
\`scripts/fleet.sh worker w1\` puts a new, empty host in a lost Celery worker's place, and
\`scripts/fleet.sh redis\` restarts a lost broker (queued tasks are kept).
EOF
watch_sessions "worker-w1 worker-w2 spark-worker-1 spark-worker-2 redis"
