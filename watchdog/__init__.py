"""vllm-watchdog: a sidecar that watches vLLM servers and GPUs, evaluates rules and remediates."""

from __future__ import annotations

__version__ = "0.1.0"
