#!/usr/bin/env bash
# `make jars`: the Maven artifacts of maven/<set>/pom.xml copied, with what they need, into
# build/jars/<set>/ by the machine's own mvn (its settings say where artifacts come from).
#   spark:  Spark's Kafka connector at the installed PySpark's version, minus every jar PySpark
#           already ships (two builds of one library on a class path fail at run time).
#   broker: the embedded Kafka broker's jars, in a folder of their own.
#   s3:     Hadoop's S3A connector at PySpark's own Hadoop version and the AWS SDK bundle it
#           was built with (about 500 MB); the project's checkpoint file manager is compiled
#           beside them (scripts/build_checkpoint_jar.sh).
# Each set is fetched once: a stamp beside the jars says it is complete and which pom made it.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
if ! command -v mvn >/dev/null; then
  echo "error: mvn is missing: install Maven (apt-get install maven), then run make again" >&2
  exit 2
fi
spark_home=$("$PY" -c 'import os, pyspark; print(os.path.dirname(pyspark.__file__))')
spark_version=$("$PY" -c 'import pyspark; print(pyspark.__version__)')
# Hadoop's version as PySpark ships it: "hadoop-client-api-3.5.0.jar" -> "3.5.0"
hadoop_version=$(ls "$spark_home/jars" | sed -nE 's/^hadoop-client-api-(.*)\.jar$/\1/p')
if [ -z "$hadoop_version" ]; then
  echo "error: no hadoop-client-api jar in $spark_home/jars: reinstall pyspark (make clean; make)" >&2
  exit 2
fi
for set in "$@"; do
  out=build/jars/$set
  stamp="$out/.fetched"
  want="$(sha256sum "maven/$set/pom.xml" | cut -c1-64) spark=$spark_version hadoop=$hadoop_version"
  if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
    continue
  fi
  exclude=""
  if [ "$set" != broker ]; then
    # artifactIds of PySpark's jars: "scala-library-2.13.18.jar" -> "scala-library"
    exclude=$(ls "$spark_home/jars" | sed -E 's/-[0-9][^-]*(-[^-]*)?\.jar$//' | sort -u | paste -sd, -)
  fi
  echo "Fetching the $set jars with mvn into $out (once per machine and pom)..."
  rm -rf "$out.tmp" && mkdir -p "$out.tmp"
  if ! mvn -q -B -f "maven/$set/pom.xml" dependency:copy-dependencies -DincludeScope=runtime \
      -Dspark.version="$spark_version" -Dhadoop.version="$hadoop_version" \
      ${exclude:+-DexcludeArtifactIds="$exclude"} \
      -DoutputDirectory="$PWD/$out.tmp" > "build/jars-$set.log" 2>&1; then
    tail -20 "build/jars-$set.log" >&2
    echo "error: mvn could not fetch the $set jars (log: build/jars-$set.log); check the network and Maven's settings, then run make again" >&2
    exit 2
  fi
  rm -rf "$out" && mv "$out.tmp" "$out" && echo "$want" > "$stamp"
done
