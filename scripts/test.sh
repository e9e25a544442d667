#!/usr/bin/env bash
# Runs the whole test suite after installing whatever is missing. Extra args go to pytest.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
bash scripts/setup.sh
# Known vulnerable dependencies fail the run: pip-audit via PyPI when both answer, else the committed snapshot.
.venv/bin/python scripts/audit-deps.py >&2
exec .venv/bin/python -m pytest "$@"
