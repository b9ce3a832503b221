#!/usr/bin/env bash
# Installs the Debian packages tidelog needs (ZooKeeper, kcat, a C compiler and the Python
# headers for its C accelerators, Maven for the reference Kafka) when they are missing. PYTHON
# is the interpreter of the venv.
set -euo pipefail
missing=()
[ -x /usr/share/zookeeper/bin/zkServer.sh ] || missing+=(zookeeper)
command -v kcat >/dev/null 2>&1 || missing+=(kcat)
command -v java >/dev/null 2>&1 || missing+=(default-jre-headless)
command -v gcc >/dev/null 2>&1 || missing+=(gcc)
command -v mvn >/dev/null 2>&1 || missing+=(maven)  # fetches Apache Kafka for `make interop`
command -v javac >/dev/null 2>&1 || missing+=(default-jdk-headless)  # compiles its Java harness
command -v npm >/dev/null 2>&1 || missing+=(npm)  # installs KafkaJS for the compatibility suite
python="${PYTHON:-python3}"
"$python" -c 'import os, sys, sysconfig; sys.exit(not os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h")))' \
  || missing+=(python3-dev)
[ ${#missing[@]} -eq 0 ] && exit 0
if [ "$(id -u)" -ne 0 ]; then
  echo "tidelog needs the Debian packages: ${missing[*]}" >&2
  echo "run as root: apt-get update && apt-get install -y ${missing[*]}" >&2
  exit 1
fi
echo "installing Debian packages: ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
