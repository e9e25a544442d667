#!/usr/bin/env bash
# Generates the tiny random Llama used with a real vLLM, cached outside the clone and
# keyed by the generator's hash. Prints the model dir on the last line of stdout.
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
CACHE=${VLLM_WATCHDOG_CACHE:-$HOME/.cache/vllm-watchdog}
PY=$(bash "$HERE/setup-vllm.sh" | tail -n 1)
KEY=$(sha256sum "$HERE/make_model.py" | cut -c1-12)
MODEL="$CACHE/models/tiny-llama-$KEY"
if [ ! -f "$MODEL/.complete" ]; then
  echo "setup-model: generating $MODEL" >&2
  "$PY" "$HERE/make_model.py" --out "$MODEL" >&2
fi
echo "$MODEL"
