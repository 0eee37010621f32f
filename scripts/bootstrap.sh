#!/usr/bin/env bash
# Installs what a fresh machine lacks for Skiplock's demo and tests, then the project itself
# into .venv. Safe to run again: each step checks before it installs.
#   scripts/bootstrap.sh          PostgreSQL server binaries + .venv with the project
#   scripts/bootstrap.sh --test   ... plus Chromium for the browser tests, Prometheus (with promtool)
#                                 for the metrics tests, and the test extras
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

PY=${PYTHON:-python3}
if ! command -v "$PY" >/dev/null; then
  echo "installing Python 3"
  apt_install python3
fi
if ! "$PY" -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
  echo "Skiplock needs Python 3.11 or newer; $PY is $("$PY" -V 2>&1). Set PYTHON=/path/to/python3.11." >&2
  exit 1
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
