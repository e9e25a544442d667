"""Which model a target serves, as far as vLLM and its files tell: the key its baseline is stored under.

The key leaves out the speculative config: speculative decoding is lossless at temperature 0, so an engine
with a draft model is compared with the same baseline as without one (that comparison is the
draft-equivalence check).
"""

from __future__ import annotations

import hashlib
import json
import re
import struct
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

MAX_SAFETENSORS_FILES = 256
MAX_HEADER_BYTES = 16 << 20  # a safetensors JSON header (a few hundred KiB on large models)
MAX_CONFIG_BYTES = 1 << 20
_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]+")


@dataclass(frozen=True)
class ModelIdentity:
    """A served model: what /v1/models and /version say, the launch flags, and its weights' fingerprint."""

    served_name: str
    root: str = ""
    version: str = ""
    max_model_len: int = 0
    dtype: str = ""  # from the launch command, where the watchdog launches the target
    quantization: str = ""
    speculative_config: str = ""  # recorded, not part of the key
    weights: str = ""  # digest of config.json and the safetensors headers; "" where unreadable

    @property
    def key(self) -> str:
        """The file-name-safe key of its baseline: served name and a digest of everything but the draft."""
        fields = asdict(self)
        del fields["speculative_config"]
        digest = hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:16]
        name = _UNSAFE.sub("_", self.served_name)[:64].strip("._") or "model"
        return f"{name}-{digest}"

    def to_json(self) -> dict[str, object]:
        """The identity as a JSON object (a baseline file records it)."""
        return asdict(self)


def launch_flags(command: Sequence[str]) -> dict[str, str]:
    """--dtype, --quantization and --speculative-config from a vLLM command line (`--x v` or `--x=v`)."""
    wanted = {"--dtype": "dtype", "--quantization": "quantization", "-q": "quantization"}
    wanted["--speculative-config"] = "speculative_config"
    out: dict[str, str] = {}
    for i, arg in enumerate(command):
        flag, eq, value = arg.partition("=")
        if flag in wanted:
            if not eq:
                value = command[i + 1] if i + 1 < len(command) else ""
            out[wanted[flag]] = value[:1024]
    return out


def weights_fingerprint(root: str) -> str:
    """A digest of a model directory's config.json and each *.safetensors file's size and JSON header (never
    the tensors); "" when the directory cannot be read."""
    directory = Path(root)
    try:
        if not root or not directory.is_dir():
            return ""
        files = sorted(p for p in directory.iterdir() if p.suffix == ".safetensors")[:MAX_SAFETENSORS_FILES]
        digest = hashlib.sha256()
        config = directory / "config.json"
        if config.is_file() and config.stat().st_size <= MAX_CONFIG_BYTES:
            digest.update(config.read_bytes())
        for path in files:
            digest.update(f"{path.name}:{path.stat().st_size}:".encode())
            digest.update(_safetensors_header(path))
    except OSError:
        return ""
    return digest.hexdigest()[:16]


def _safetensors_header(path: Path) -> bytes:
    """The JSON header of a safetensors file (8-byte little-endian length, then the header), bounded."""
    with path.open("rb") as f:
        head = f.read(8)
        if len(head) != 8:
            return b""
        (size,) = struct.unpack("<Q", head)
        return f.read(min(size, MAX_HEADER_BYTES))
