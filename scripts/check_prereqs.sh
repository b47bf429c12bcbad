#!/usr/bin/env bash
# Checks what `make demo` and `make test` need before anything is installed.
set -u
missing=0
if ! command -v python3 >/dev/null; then
  echo "missing: python3 (Python 3.11 or newer): install it, e.g. apt-get install python3 python3-venv"; missing=1
elif ! python3 -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
  echo "missing: Python 3.11 or newer (found $(python3 --version 2>&1))"; missing=1
elif ! python3 -c 'import venv, ensurepip' 2>/dev/null; then
  echo "missing: the venv module with ensurepip (apt-get install python3-venv)"; missing=1
fi
if ! command -v java >/dev/null; then
  echo "missing: java (Java 17, which Spark 4 needs): apt-get install openjdk-17-jre-headless"; missing=1
else
  v=$(java -version 2>&1 | sed -n 's/.*version "\([0-9]*\).*/\1/p' | head -1)
  if [ -z "$v" ] || [ "$v" -lt 17 ]; then
    echo "missing: Java 17 or newer for Spark 4 (found: $(java -version 2>&1 | head -1))"; missing=1
  fi
fi
if ! command -v javac >/dev/null; then
  echo "missing: javac (a JDK 17 compiles the project's S3 checkpoint file manager): apt-get install openjdk-17-jdk-headless"; missing=1
fi
if ! command -v mvn >/dev/null; then
  echo "missing: mvn (Maven fetches Spark's Kafka connector and the Kafka broker): apt-get install maven"; missing=1
fi
[ "$missing" -eq 0 ] || { echo "Install what is missing above, then run the command again."; exit 1; }
