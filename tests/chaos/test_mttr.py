"""bench/mttr.py's parts that decide its numbers: when each baseline supervisor restarts vLLM (systemd's
Restart=on-failure, Docker's on-failure, Kubernetes' restartPolicy Always), and how a client request's end is
read (recovered, failed before its first byte or mid-stream). The bench itself runs real vLLMs: see
RELIABILITY.md."""

from __future__ import annotations

import signal
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"


@pytest.fixture(scope="module")
def bench() -> object:
    sys.path.insert(0, str(BENCH))
    try:
        import _mttr_clients
        import _mttr_supervisors

        return _mttr_clients, _mttr_supervisors
    finally:
        sys.path.remove(str(BENCH))


@pytest.mark.parametrize(
    ("code", "systemd", "docker"),
    [
        (0, False, False),  # a clean exit: neither restarts it (vLLM #48966 exits 0 after its engine died)
        (1, True, True),
        (-signal.SIGKILL, True, True),
        (-signal.SIGTERM, False, True),  # systemd counts SIGTERM as clean; Docker sees 143
        (-signal.SIGSEGV, True, True),
    ],
)
def test_the_baselines_restart_as_the_real_ones_do(
    bench: object, tmp_path: Path, code: int, systemd: bool, docker: bool
) -> None:
    _, sup = bench  # type: ignore[misc]
    assert sup.Supervisor("systemd", 1, tmp_path / "l")._restarts_on(code) is systemd
    assert sup.Supervisor("docker", 1, tmp_path / "l")._restarts_on(code) is docker
    assert sup.Supervisor("kubernetes", 1, tmp_path / "l")._restarts_on(code) is True


def test_recovery_is_the_first_success_sent_after_the_fault_and_failures_are_placed(bench: object) -> None:
    clients, _ = bench  # type: ignore[misc]
    R = clients.Request
    fault = 100.0
    requests = [
        R("plain", 90.0, first_byte=91.0, done=91.0, ok=True),  # before the fault
        R("stream", 99.0, first_byte=99.5, done=101.0, error="the stream ended without [DONE]"),  # mid-stream
        R("plain", 99.0, done=130.0, error="status 502"),  # in flight, no byte
        R("stream", 101.0, done=150.0, error="ReadError: "),  # no chunk yet
        R("plain", 99.5, first_byte=160.0, done=160.0, ok=True),  # held across the restart: sent before
        R("plain", 140.0, first_byte=170.0, done=170.0, ok=True),
        R("stream", 141.0, first_byte=165.0, done=168.0, ok=True),
        R("plain", 142.0, done=200.0, error="cancelled at the end of the run"),
    ]
    assert clients.recovered_at(requests, fault) == 168.0
    assert clients.errors(requests, fault) == {"before first byte": 2, "mid-stream": 1}
