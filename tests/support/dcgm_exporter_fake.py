"""A stand-in for dcgm-exporter on 127.0.0.1 (there is no GPU here): serves a fixture payload at /metrics."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

from tests.support.faultserver import FaultServer

FIXTURE = Path(__file__).parent.parent / "fixtures" / "dcgm" / "dcgm-exporter-4.2.3-4.1.3-h100x2.txt"


@contextlib.contextmanager
def dcgm_exporter(payload: Path = FIXTURE) -> Iterator[FaultServer]:
    """Serve `payload` as dcgm-exporter's /metrics for the duration of a with-block."""
    server = FaultServer()
    server.set("/metrics", payload.read_text())
    try:
        yield server
    finally:
        server.close()
