"""A silent fault on a real vLLM: copies of the tiny model with one tensor scaled (scripts/perturb-model.py),
made once per test run and shared by its workers, and vLLM's dev-mode `reload_weights`, which loads a
directory's weights into the running engine in place (`/health` stays 200; only the answers change)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import httpx

from tests.support import runshare
from tests.support.vllm_server import ROOT

DEFAULT_TENSOR = "model.layers.2.mlp.down_proj.weight"
DEV_MODE_ENV = {"VLLM_SERVER_DEV_MODE": "1"}  # /collective_rpc, /pause, /is_paused... exist only with it
MAKE_TIMEOUT = 300.0  # bounds a hang: a copy takes about 2 s here
RELOAD_TIMEOUT = 120.0  # bounds a hang: a reload of the tiny model answers in about 0.2 s here


def _last_line(script: str) -> str:
    out = subprocess.run(["bash", str(ROOT / "scripts" / script)], check=True, capture_output=True, text=True)
    return out.stdout.strip().splitlines()[-1]


def vllm_python() -> str:
    """The vLLM venv's python (it has torch and safetensors); installs it on first use."""
    return _last_line("setup-vllm.sh")


def model_dir() -> Path:
    """The tiny random Llama's directory (what scripts/serve-vllm.sh serves); made on first use."""
    return Path(_last_line("setup-model.sh"))


def perturbed_model(scale: float, tensor: str = DEFAULT_TENSOR, root: Path | None = None) -> Path:
    """A copy of the model with `tensor` scaled by `scale`, under `root` (default: the test run's shared
    directory, removed when the run ends); made once, whatever worker or caller asks first."""
    base = (root or runshare.run_dir()) / "perturbed-models"
    out = base / f"{tensor}-x{scale:g}"
    with runshare.exclusive("perturbed-models"):
        if not (out / ".complete").is_file():
            base.mkdir(parents=True, exist_ok=True)
            cmd = [vllm_python(), str(ROOT / "scripts" / "perturb-model.py"), "--src", str(model_dir())]
            cmd += ["--out", str(out), "--tensor", tensor, "--scale", repr(scale)]
            subprocess.run(cmd, check=True, capture_output=True, timeout=MAKE_TIMEOUT)
    return out


def reload_weights(url: str, weights: Path, timeout: float = RELOAD_TIMEOUT) -> None:
    """Load the weights in directory `weights` into the running vLLM at `url` (started in dev mode)."""
    body = {"method": "reload_weights", "kwargs": {"weights_path": str(weights)}}
    resp = httpx.post(url + "/collective_rpc", json=body, timeout=timeout)
    if resp.status_code != 200:
        raise RuntimeError(f"reload_weights({weights}) answered HTTP {resp.status_code}: {resp.text[:300]}")
