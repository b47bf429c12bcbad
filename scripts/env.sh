# Sourced by the project's scripts: the embedded defaults (local Spark, SQLite Airflow).
# Every value can be overridden from the calling environment.
STATEOPS_HOME="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export STATEOPS_HOME
export PATH="$STATEOPS_HOME/.venv/bin:$PATH"
export PYSPARK_PYTHON="${PYSPARK_PYTHON:-$STATEOPS_HOME/.venv/bin/python}"
export SPARK_CONF_DIR="${SPARK_CONF_DIR:-$STATEOPS_HOME/conf}"
export AIRFLOW_HOME="${AIRFLOW_HOME:-$STATEOPS_HOME/.airflow}"
export AIRFLOW__CORE__DAGS_FOLDER="$STATEOPS_HOME/dags"
export AIRFLOW__CORE__PLUGINS_FOLDER="$STATEOPS_HOME/plugins"
export AIRFLOW__CORE__LOAD_EXAMPLES=False
export AIRFLOW__CORE__UNIT_TEST_MODE="${AIRFLOW__CORE__UNIT_TEST_MODE:-False}"
# (A literal default inside ${VAR:-...} would end at its first '}'.)
_stateops_spark_conn='{"conn_type":"spark","host":"local[2]"}'
export AIRFLOW_CONN_SPARK_DEFAULT="${AIRFLOW_CONN_SPARK_DEFAULT:-$_stateops_spark_conn}"
# The embedded S3 endpoint (`python -m stateops.dev.s3server`: SeaweedFS on loopback) with
# demo-only credentials; real ones set in the calling environment win.
export STATEOPS_S3_ENDPOINT_URL="${STATEOPS_S3_ENDPOINT_URL:-http://127.0.0.1:9000}"
export AWS_ACCESS_KEY_ID="${AWS_ACCESS_KEY_ID:-stateops-demo}"
export AWS_SECRET_ACCESS_KEY="${AWS_SECRET_ACCESS_KEY:-stateops-demo-secret}"
_stateops_aws_conn="{\"conn_type\":\"aws\",\"login\":\"$AWS_ACCESS_KEY_ID\",\"password\":\"$AWS_SECRET_ACCESS_KEY\",\"extra\":{\"endpoint_url\":\"$STATEOPS_S3_ENDPOINT_URL\"}}"
export AIRFLOW_CONN_AWS_DEFAULT="${AIRFLOW_CONN_AWS_DEFAULT:-$_stateops_aws_conn}"
# The embedded Kafka broker (`python -m stateops.dev.kafka`, started by `make demo` and `make
# airflow`) and the Airflow connection kafka_default pointing at it (type kafka; its extra holds
# the client's settings: bootstrap.servers, and security.protocol / sasl.* for a secured cluster).
export STATEOPS_KAFKA_BOOTSTRAP_SERVERS="${STATEOPS_KAFKA_BOOTSTRAP_SERVERS:-127.0.0.1:9092}"
_stateops_kafka_conn="{\"conn_type\":\"kafka\",\"extra\":{\"bootstrap.servers\":\"$STATEOPS_KAFKA_BOOTSTRAP_SERVERS\"}}"
export AIRFLOW_CONN_KAFKA_DEFAULT="${AIRFLOW_CONN_KAFKA_DEFAULT:-$_stateops_kafka_conn}"
