#!/usr/bin/env bash
# Makes the wheelhouse scripts/gpu-check.sh needs on a GPU host without network: the nvidia-ml-py wheel
# (pure Python, about 60 KB). Usage: scripts/gpu-wheelhouse.sh DIR; then, on the GPU host,
# GPU_CHECK_WHEELS=DIR scripts/gpu-check.sh [--set-power-limit]
set -euo pipefail
DIR=${1:?usage: gpu-wheelhouse.sh DIR}
PY=${PYTHON:-python3}
"$PY" -m pip download -q --no-deps --only-binary=:all: -d "$DIR" "nvidia-ml-py>=12"
du -sh "$DIR"
