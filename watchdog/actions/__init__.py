"""Remediation actions: runtimes that relaunch vLLM, the rails that limit them, and their state."""

from __future__ import annotations

from . import kinds  # noqa: F401  (registers every action kind before any config is parsed)
