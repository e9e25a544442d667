"""Copy a model directory with one tensor scaled: a silent fault to load into a running vLLM.

Usage (with the vLLM venv's python, which has torch and safetensors):
    $(bash scripts/setup-vllm.sh | tail -n1) scripts/perturb-model.py --src MODEL_DIR --out DIR \
        [--tensor model.layers.2.mlp.down_proj.weight] [--scale 2.0]

Every file of MODEL_DIR is copied to DIR; in the *.safetensors file that holds the tensor, that tensor is
multiplied by the scale (computed in float32, stored back in its own dtype) and the file written again with
the same tensor names, shapes, dtypes and metadata, so the header and sizes a weights fingerprint reads are
unchanged: only the answers move. Deterministic: the same source, tensor and scale give the same bytes.
DIR/perturbation.json records what was changed (and the fraction of elements that did); DIR/.complete is
written last, and a DIR that has it with the same perturbation recorded is left as it is (idempotent).
The source is never written: DIR must not be MODEL_DIR or lie inside it, and an existing DIR that this
script did not make is refused.

Load the copy into a vLLM started with VLLM_SERVER_DEV_MODE=1:
    curl -X POST localhost:8000/collective_rpc -H 'Content-Type: application/json' \
        -d '{"method": "reload_weights", "kwargs": {"weights_path": "DIR"}}'
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import save_file

DEFAULT_TENSOR = "model.layers.2.mlp.down_proj.weight"
RECORD = "perturbation.json"
DONE = ".complete"


def _record(src: Path, tensor: str, scale: float) -> dict[str, Any]:
    return {"source": str(src), "tensor": tensor, "scale": scale}


def _recorded(out: Path) -> dict[str, Any]:
    """What `out`'s record says was perturbed (without the measured fraction)."""
    data = json.loads((out / RECORD).read_text())
    return {k: data.get(k) for k in ("source", "tensor", "scale")}


def _check_paths(src: Path, out: Path) -> str | None:
    """Why `out` may not be written (None: it may)."""
    if not (src / "config.json").is_file():
        return f"{src} is not a model directory (no config.json)"
    if out == src or src in out.parents:
        return f"refusing to write {out}: it is the source model directory or inside it"
    if out in src.parents:
        return f"refusing to write {out}: the source model directory lies inside it"
    if out.exists() and any(out.iterdir()) and not (out / RECORD).is_file():
        return f"refusing to overwrite {out}: it exists and was not made by this script"
    return None


def _holder(src: Path, tensor: str) -> Path:
    """The *.safetensors file of `src` that holds `tensor` (KeyError if none does)."""
    for path in sorted(src.glob("*.safetensors")):
        with safe_open(str(path), framework="pt") as f:
            if tensor in f.keys():  # noqa: SIM118 (safe_open has keys(), not __contains__)
                return path
    raise KeyError(f"no *.safetensors file in {src} holds a tensor named {tensor!r}")


def _scaled(path: Path, tensor: str, scale: float, dest: Path) -> float:
    """Write `path` to `dest` with `tensor` multiplied by `scale` and everything else as it was; returns the
    fraction of the tensor's elements that changed (in 16 bits a scale near 1 rounds many back)."""
    with safe_open(str(path), framework="pt") as f:
        metadata = f.metadata()
        tensors = {name: f.get_tensor(name) for name in f.keys()}  # noqa: SIM118
    original = tensors[tensor]
    tensors[tensor] = (original.to(torch.float32) * scale).to(original.dtype).contiguous()
    save_file(tensors, str(dest), metadata=metadata)
    return float((tensors[tensor] != original).float().mean())


def perturb(src: Path, out: Path, tensor: str, scale: float) -> str:
    """Make `out` (see the module's docstring); returns what was done, in one line."""
    src, out = src.resolve(), out.resolve()
    refusal = _check_paths(src, out)
    if refusal:
        raise ValueError(refusal)
    wanted = _record(src, tensor, scale)
    if (out / DONE).is_file() and _recorded(out) == wanted:
        return f"{out} already holds {tensor} x {scale:g}"
    holder = _holder(src, tensor)
    if out.exists():
        shutil.rmtree(out)  # ours (it has our record) but unfinished or of another perturbation
    out.mkdir(parents=True)
    for path in sorted(src.iterdir()):
        if path.is_file() and path.name not in (DONE, RECORD) and path != holder:
            shutil.copyfile(path, out / path.name)
    changed = _scaled(holder, tensor, scale, out / holder.name)
    (out / RECORD).write_text(json.dumps(wanted | {"changed_fraction": changed}, indent=1) + "\n")
    (out / DONE).write_text("")
    return f"{out}: {tensor} x {scale:g} (in {holder.name}; {changed:.1%} of its elements changed)"


def main() -> int:
    """Parse the arguments and make the copy."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--src", type=Path, required=True, help="the model directory to copy (never written)")
    ap.add_argument("--out", type=Path, required=True, help="the perturbed copy's directory")
    ap.add_argument(
        "--tensor", default=DEFAULT_TENSOR, help=f"the tensor to scale (default {DEFAULT_TENSOR})"
    )
    ap.add_argument("--scale", type=float, default=2.0, help="the factor (default 2.0)")
    args = ap.parse_args()
    try:
        print(perturb(args.src, args.out, args.tensor, args.scale))
    except (ValueError, KeyError) as exc:
        print(f"perturb-model: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
