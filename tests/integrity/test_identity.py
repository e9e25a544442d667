"""A model's identity: the launch flags, the weights' fingerprint, and a key that ignores the draft."""

from __future__ import annotations

import json
import struct
from dataclasses import replace
from pathlib import Path

from vllm_watchdog.integrity.identity import ModelIdentity, launch_flags, weights_fingerprint


def _safetensors(path: Path, header: dict[str, object], body: bytes = b"\0" * 16) -> None:
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + body)


def test_launch_flags_in_both_spellings() -> None:
    cmd = [
        "vllm",
        "serve",
        "m",
        "--dtype",
        "bfloat16",
        "--quantization=fp8",
        "--speculative-config",
        '{"method": "ngram"}',
    ]
    assert launch_flags(cmd) == {
        "dtype": "bfloat16",
        "quantization": "fp8",
        "speculative_config": '{"method": "ngram"}',
    }
    assert launch_flags(["vllm", "serve", "m", "--dtype"]) == {"dtype": ""}


def test_the_fingerprint_reads_headers_and_sizes_not_tensors(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text('{"hidden_size": 64}')
    _safetensors(
        tmp_path / "model.safetensors", {"w": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]}}
    )
    first = weights_fingerprint(str(tmp_path))
    assert first and weights_fingerprint(str(tmp_path)) == first
    _safetensors(
        tmp_path / "model.safetensors",
        {"w": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]}},
        b"\1" * 16,
    )
    assert weights_fingerprint(str(tmp_path)) == first  # same size and header: tensors are never read
    _safetensors(
        tmp_path / "model.safetensors", {"w": {"dtype": "F16", "shape": [2, 4], "data_offsets": [0, 16]}}
    )
    assert weights_fingerprint(str(tmp_path)) != first
    assert weights_fingerprint(str(tmp_path / "absent")) == "" and weights_fingerprint("org/model") == ""


def test_the_key_ignores_the_draft_and_nothing_else() -> None:
    base = ModelIdentity("tiny-llama", "/models/tiny", "0.32.0", 2048, weights="abc")
    assert replace(base, speculative_config='{"method": "ngram"}').key == base.key
    for changed in (
        replace(base, version="0.33.0"),
        replace(base, dtype="half"),
        replace(base, weights="abd"),
    ):
        assert changed.key != base.key
    assert base.key.startswith("tiny-llama-")
    assert ModelIdentity("../../etc/passwd").key.startswith("etc_passwd-")  # a safe file name
