#!/usr/bin/env bash
# The watchdog's NVML code against the real GPUs of this host (scripts/gpu_check.py says what it checks).
# Needs python3 and the nvidia-ml-py module (`pip install nvidia-ml-py`, or a wheel dir in GPU_CHECK_WHEELS).
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PY=${PYTHON:-python3}
if ! "$PY" -c "import pynvml" 2>/dev/null; then
  if [ -n "${GPU_CHECK_WHEELS:-}" ]; then
    "$PY" -m pip install -q --no-index --find-links "$GPU_CHECK_WHEELS" nvidia-ml-py >&2
  else
    echo "gpu-check: the pynvml module is missing: pip install nvidia-ml-py" >&2
    exit 2
  fi
fi
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,power.limit,temperature.gpu --format=csv
exec "$PY" "$ROOT/scripts/gpu_check.py" "$@"
