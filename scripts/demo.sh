#!/usr/bin/env bash
# The main job on this machine: a real CPU vLLM on 127.0.0.1:8000 and the watchdog watching it
# with the embedded defaults (own API on 127.0.0.1:9460). Ctrl-C stops both.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
bash scripts/setup.sh
LOG=${VLLM_LOG:-/tmp/vllm-watchdog-demo-vllm.log}
echo "demo: starting vLLM on 127.0.0.1:8000 (log: $LOG)" >&2
setsid bash scripts/serve-vllm.sh --port 8000 >"$LOG" 2>&1 &
VLLM_PID=$!
trap 'kill -TERM -- -$VLLM_PID 2>/dev/null || true; wait $VLLM_PID 2>/dev/null || true' EXIT
for _ in $(seq 1 300); do
  if .venv/bin/python -c "import httpx,sys; sys.exit(httpx.get('http://127.0.0.1:8000/health', timeout=2).status_code != 200)" 2>/dev/null; then break; fi
  kill -0 $VLLM_PID 2>/dev/null || { echo "demo: vLLM exited; see $LOG" >&2; exit 1; }
  sleep 1
done
echo "demo: vLLM is up; watchdog API on http://127.0.0.1:9460 (/metrics, /api/v1/targets)" >&2
.venv/bin/vllm-watchdog run "$@" &
WATCHDOG_PID=$!
trap 'kill -TERM $WATCHDOG_PID 2>/dev/null || true' INT TERM
wait $WATCHDOG_PID || wait $WATCHDOG_PID  # the second wait covers an interrupted first one
