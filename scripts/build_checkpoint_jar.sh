#!/usr/bin/env bash
# `make jars`: the project's checkpoint file manager for s3a:// checkpoints
# (spark_jobs/java/stateops/ConditionalCheckpointFileManager.java) compiled by the machine's
# javac against PySpark's own jars and the fetched hadoop-aws, into build/jars/s3 (on the class
# path of every driver and executor, beside the S3 connector it uses). Redone when its source
# is newer than the jar.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
src=spark_jobs/java/stateops/ConditionalCheckpointFileManager.java
jar=build/jars/s3/stateops-checkpoint.jar
if [ -f "$jar" ] && [ "$jar" -nt "$src" ]; then
  exit 0
fi
if ! command -v javac >/dev/null || ! command -v jar >/dev/null; then
  echo "error: javac is missing (the S3 checkpoint file manager is compiled here): install a JDK 17, e.g. apt-get install openjdk-17-jdk-headless, then run make again" >&2
  exit 2
fi
spark_home=$("$PY" -c 'import os, pyspark; print(os.path.dirname(pyspark.__file__))')
aws=$(ls build/jars/s3/hadoop-aws-*.jar)
classes=$(mktemp -d)
trap 'rm -rf "$classes"' EXIT
echo "Compiling the S3 checkpoint file manager into $jar..."
javac --release 17 -nowarn -d "$classes" -cp "$spark_home/jars/*:$aws" "$src"
jar cf "$jar.tmp" -C "$classes" .
mv "$jar.tmp" "$jar"
