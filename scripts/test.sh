#!/usr/bin/env bash
# Runs the whole test suite after installing whatever is missing. Extra args go to pytest.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
bash scripts/setup.sh
# Known vulnerable dependencies fail the run: pip-audit via PyPI when both answer, else the committed snapshot.
.venv/bin/python scripts/audit-deps.py >&2
# The suite starts hundreds of Python processes (daemons, gateways, CLI runs): compiled once here, each reads the
# bytecode instead of compiling the package again, about 0.3 s of CPU per start where PYTHONDONTWRITEBYTECODE
# is set (Python still reads .pyc files then; it only stops writing them).
.venv/bin/python -m compileall -q -j 0 watchdog tests bench >/dev/null
# Most of the suite waits on servers (vLLM, Docker, Prometheus), not on the CPU, so it runs on a few xdist
# workers; tests that share the session's vLLM keep to one worker (tests/support/runshare.py), the longest
# groups go first and at most three start real vLLMs at once (tests/support/longest_first.py).
# VLLM_WATCHDOG_TEST_WORKERS=0 runs it in one process.
exec .venv/bin/python -m pytest -n "${VLLM_WATCHDOG_TEST_WORKERS:-5}" --dist loadgroup "$@"
