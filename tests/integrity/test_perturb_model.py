"""scripts/perturb-model.py, the silent fault of the integrity tests and bench, on a small model written here:
one tensor scaled, everything else (the other tensors, the header's layout, the other files) byte for byte
as it was, the same bytes every time, and the source never written."""

from __future__ import annotations

import json
import struct
import subprocess
from pathlib import Path

import pytest

from tests.support.perturbed import vllm_python
from tests.support.vllm_server import ROOT

pytestmark = pytest.mark.spread

SCRIPT = str(ROOT / "scripts" / "perturb-model.py")
TENSORS = {"a.weight": [1.0, -2.0, 0.5, 4.0], "b.weight": [3.0, 3.0, -1.0, 0.25]}


def _write_model(directory: Path) -> None:
    """A model directory: config.json and one F32 safetensors file (8-byte header size, JSON header, data)."""
    directory.mkdir()
    (directory / "config.json").write_text('{"model_type": "llama"}')
    header: dict[str, object] = {"__metadata__": {"format": "pt"}}
    data = b""
    for name, values in TENSORS.items():
        header[name] = {"dtype": "F32", "shape": [2, 2], "data_offsets": [len(data), len(data) + 16]}
        data += struct.pack("<4f", *values)
    raw = json.dumps(header).encode()
    (directory / "model.safetensors").write_bytes(struct.pack("<Q", len(raw)) + raw + data)


def _read(path: Path) -> tuple[dict[str, object], dict[str, list[float]]]:
    blob = path.read_bytes()
    (size,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8 : 8 + size])
    tensors = {}
    for name, spec in header.items():
        if name != "__metadata__":
            start, end = spec["data_offsets"]
            tensors[name] = list(struct.unpack("<4f", blob[8 + size + start : 8 + size + end]))
    return header, tensors


def _run(src: Path, out: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    cmd = [vllm_python(), SCRIPT, "--src", str(src), "--out", str(out), *extra]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)


def test_one_tensor_is_scaled_and_nothing_else_changes(tmp_path: Path) -> None:
    src = tmp_path / "model"
    _write_model(src)
    before = (src / "model.safetensors").read_bytes()
    done = _run(src, tmp_path / "x2", "--tensor", "a.weight", "--scale", "2.0")
    assert done.returncode == 0, done.stderr
    assert "100.0% of its elements changed" in done.stdout
    header, tensors = _read(tmp_path / "x2" / "model.safetensors")
    assert tensors == {"a.weight": [2.0, -4.0, 1.0, 8.0], "b.weight": TENSORS["b.weight"]}
    assert header == _read(src / "model.safetensors")[0]  # names, shapes, dtypes, offsets and metadata
    assert (tmp_path / "x2" / "config.json").read_bytes() == (src / "config.json").read_bytes()
    assert (src / "model.safetensors").read_bytes() == before
    assert _run(src, tmp_path / "again", "--tensor", "a.weight", "--scale", "2.0").returncode == 0
    again = (tmp_path / "again" / "model.safetensors").read_bytes()
    assert again == (tmp_path / "x2" / "model.safetensors").read_bytes()  # deterministic
    record = json.loads((tmp_path / "x2" / "perturbation.json").read_text())
    assert record["tensor"] == "a.weight" and record["scale"] == 2.0 and record["changed_fraction"] == 1.0


def test_the_source_and_foreign_directories_are_never_written(tmp_path: Path) -> None:
    src = tmp_path / "model"
    _write_model(src)
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine")
    for out, why in ((src, "source model directory"), (src / "sub", "inside it"), (foreign, "not made by")):
        done = _run(src, out, "--tensor", "a.weight")
        assert done.returncode == 2 and why in done.stderr, (out, done.stderr)
    assert sorted(p.name for p in src.iterdir()) == ["config.json", "model.safetensors"]
    assert (foreign / "notes.txt").read_text() == "mine" and len(list(foreign.iterdir())) == 1
    missing = _run(src, tmp_path / "none", "--tensor", "no.such.weight")
    assert missing.returncode == 2 and "no.such.weight" in missing.stderr
    assert not (tmp_path / "none").exists()
