#!/usr/bin/env bash
# Builds the sidecar image (deploy/Dockerfile) and prints its tag on the last line.
#
# No registry is needed: the base is a locally debootstrapped Debian (scripts/debian-base.sh), the wheels
# are built here on the host and installed offline in the image, and `docker build` runs with host
# networking. The host interpreter must be Python 3.11 like bookworm's python3: compiled dependencies
# (uvloop, httptools, aiohttp, pyyaml, promql-parser) are wheels for one Python version. Dependency
# versions are pinned to the ones installed in .venv (what the tests ran against); their wheels are
# kept in build/image-wheels/deps and only rebuilt when those pins change. The project's own wheel is
# built reproducibly (SOURCE_DATE_EPOCH), so an unchanged tree reuses every cached image layer.
#
# Environment: PYTHON (default .venv/bin/python), IMAGE (default vllm-watchdog:<version>), DOCKER.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
PY=${PYTHON:-$ROOT/.venv/bin/python}
DOCKER=${DOCKER:-docker}

if ! "$PY" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))'; then
  echo "build-image: $PY is not Python 3.11 (bookworm's python3): set PYTHON or run scripts/setup.sh" >&2
  exit 1
fi
version=$("$PY" -c 'import tomllib; print(tomllib.load(open("pyproject.toml", "rb"))["project"]["version"])')
IMAGE=${IMAGE:-vllm-watchdog:$version}
BASE=$(bash scripts/debian-base.sh | tail -1)

WHEELS=build/image-wheels
mkdir -p "$WHEELS"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

pip() {
  # This machine's pip.conf names local file indexes that lack most projects: drop those warnings.
  "$PY" -m pip "$@" 2> >(grep -v "is ignored: it is neither a file nor a directory" >&2)
}

# The project's wheel, byte-identical for an unchanged tree: built from a clean copy of what it packages
# (an in-tree build would also pack files that linger in build/lib), with fixed zip timestamps.
mkdir -p "$work/src"
tar --exclude=__pycache__ -cf - pyproject.toml README.md watchdog rules | tar -xf - -C "$work/src"
SOURCE_DATE_EPOCH=315532800 pip wheel -q --no-deps --no-cache-dir -w "$work/app" "$work/src" >&2
app=$(ls "$work"/app/vllm_watchdog-*.whl)

# Pins: the runtime closure of vllm-watchdog[gpu] as installed in the venv.
"$PY" - "$work/pins.txt" <<'EOF'
import re, sys
from importlib import metadata

try:
    from packaging.requirements import Requirement
except ImportError:  # a venv without the standalone package: pip's copy
    from pip._vendor.packaging.requirements import Requirement

seen, todo = {}, [("vllm-watchdog", {"gpu"})]
while todo:
    name, extras = todo.pop()
    dist = metadata.distribution(name)
    key = re.sub(r"[-_.]+", "-", dist.metadata["Name"]).lower()
    if key in seen and extras <= seen[key]:
        continue
    seen[key] = seen.get(key, set()) | extras
    for spec in dist.requires or []:
        req = Requirement(spec)
        env = [{"extra": e, "sys_platform": "linux"} for e in (extras or {""})]
        if req.marker is None or any(req.marker.evaluate(e) for e in env):
            todo.append((req.name, set(req.extras)))
del seen["vllm-watchdog"]
pins = sorted(f"{n}=={metadata.version(n)}" for n in seen)
open(sys.argv[1], "w").write("\n".join(pins) + "\n")
EOF
key=$( (cat "$work/pins.txt"; "$PY" -c 'import sys; print(sys.version_info[:2])') | sha256sum | cut -c1-16)
if [ "$(cat "$WHEELS/deps/.key" 2>/dev/null)" != "$key" ]; then
  echo "build-image: building dependency wheels ($(wc -l <"$work/pins.txt") pinned packages)" >&2
  rm -rf "$WHEELS/deps"
  pip wheel -q --no-deps -w "$work/deps" -r "$work/pins.txt" >&2
  cp "$work/pins.txt" "$work/deps/requirements.txt"
  echo "$key" >"$work/deps/.key"
  mv "$work/deps" "$WHEELS/deps"
fi
rm -rf "$WHEELS/app"
mkdir -p "$WHEELS/app"
cp "$app" "$WHEELS/app/"

echo "build-image: docker build $IMAGE on $BASE" >&2
"$DOCKER" build --network host --build-arg "BASE=$BASE" -f deploy/Dockerfile -t "$IMAGE" . >&2
echo "$IMAGE"
