"""What starts, stops and reads a vLLM server: Docker, a child process, systemd, NVML power limits."""

from __future__ import annotations
