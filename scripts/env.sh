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
