#!/usr/bin/env bash
# Runs a real (CPU) vLLM in the foreground on the tiny random Llama, on 127.0.0.1.
# Usage: scripts/serve-vllm.sh [--port 8000] [extra vLLM args...]
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
PORT=8000
if [ "${1:-}" = "--port" ]; then PORT=${2:?--port needs a value}; shift 2; fi
PY=$(bash "$HERE/setup-vllm.sh" | tail -n 1)
MODEL=$(bash "$HERE/setup-model.sh" | tail -n 1)
export HF_HUB_OFFLINE=1 VLLM_CPU_KVCACHE_SPACE=1 VLLM_CPU_OMP_THREADS_BIND=0
# Keep all traffic local: no usage-stats reporting.
export VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1
exec "$PY" -m vllm.entrypoints.openai.api_server --model "$MODEL" \
  --served-model-name tiny-llama --host 127.0.0.1 --port "$PORT" \
  --max-model-len 2048 --enforce-eager "$@"
