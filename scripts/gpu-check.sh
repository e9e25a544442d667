#!/usr/bin/env bash
# The watchdog's NVML code against the real GPUs of this host (scripts/gpu_check.py says what it checks).
# Needs python3, nvidia-smi and the nvidia-ml-py module: `pip install nvidia-ml-py`, or, with no network, a wheel
# dir made by scripts/gpu-wheelhouse.sh on another machine, named in GPU_CHECK_WHEELS (installed into a venv here).
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PY=${PYTHON:-python3}
if ! "$PY" -c "import pynvml" 2>/dev/null; then
  if [ -n "${GPU_CHECK_WHEELS:-}" ]; then
    VENV=${GPU_CHECK_VENV:-/tmp/vllm-watchdog-gpu-check}
    [ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV" >&2
    "$VENV/bin/python" -m pip install -q --no-index --find-links "$GPU_CHECK_WHEELS" nvidia-ml-py >&2
    PY=$VENV/bin/python
  else
    echo "gpu-check: the pynvml module is missing: pip install nvidia-ml-py" >&2
    exit 2
  fi
fi
nvidia-smi --query-gpu=name,driver_version,power.limit,temperature.gpu --format=csv
exec "$PY" "$ROOT/scripts/gpu_check.py" "$@"
