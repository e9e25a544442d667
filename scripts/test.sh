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
rm -f .pytest_cache/v/cache/lastfailed  # so that what the rerun below reads is this run's failures only
set +e
.venv/bin/python -m pytest -n "${VLLM_WATCHDOG_TEST_WORKERS:-5}" --dist loadgroup "$@"
rc=$?
set -e
# On 2 cores five workers, three real vLLMs and their daemons sometimes stall each other for seconds, and then
# a test that waits on a schedule can miss it. The tests that failed (in at most 10 files) run once more, alone
# in one process: if they pass there they are reported as flaky under load and the run passes; a test that fails
# again fails the run. VLLM_WATCHDOG_TEST_RERUN=0 turns this off.
if [ "$rc" -eq 1 ] && [ "${VLLM_WATCHDOG_TEST_RERUN:-1}" != 0 ]; then
  if mapfile -t failed < <(.venv/bin/python scripts/failed-tests.py) && [ "${#failed[@]}" -gt 0 ]; then
    echo "== ${#failed[@]} tests failed under the parallel run's load; running them again alone ==" >&2
    printf '   %s\n' "${failed[@]}" >&2
    set +e
    .venv/bin/python -m pytest -n 0 -p no:cacheprovider "${failed[@]}"
    rc=$?
    set -e
    if [ "$rc" -eq 0 ]; then
      echo "== FLAKY UNDER LOAD: these ${#failed[@]} tests failed in the parallel run and passed alone: ==" >&2
      printf '   %s\n' "${failed[@]}" >&2
    fi
  fi
fi
exit "$rc"
