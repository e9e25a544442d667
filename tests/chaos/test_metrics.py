"""Chaos: one target's /metrics misbehaves in every way a real endpoint can, next to a healthy target.

A real watchdog process scrapes two targets every second: a FaultServer with a captured vLLM payload, and a
raw socket server on 127.0.0.1 (below) that answers each fault in turn: a hang longer than scrape_timeout, a
body trickled slower than the deadline, a 500, a body cut short, binary and text garbage, 50 MB bodies with
and without a Content-Length, and a series explosion beyond sample_limit. Each fault must give the faulty
target up=0 with a last_error naming the cause, must not touch the healthy target (still up, still scraped),
and must leave the watchdog's RSS within a generous bound; after each one the faulty target recovers. A phase
in which the healthy target only missed its deadline runs again, up to twice: a 2-core machine shared with
other tests can leave the watchdog unscheduled for a second (CI saw both targets time out together while the
faulty one answered a tiny body), and a fault that blocks the watchdog would miss the deadline every time.
"""

from __future__ import annotations

import contextlib
import socket
import socketserver
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from tests.support.apitargets import targets
from tests.support.configs import FAST, target, watchdog_yaml
from tests.support.faultserver import FaultServer
from tests.support.vllm_server import free_port
from tests.support.watchdogproc import poll, start_watchdog

SCRAPE_TIMEOUT = 1.0
HANG = 3.0  # seconds a "hang" answer waits before its headers: well past the scrape timeout
BIG = 50 * 1024 * 1024  # the 50 MB bodies (body_size_limit stays at its default 16 MiB)
EXPLOSION = 300_000  # series in the explosion body, 15x the default sample_limit of 20000
RSS_HEADROOM_MB = 150.0  # RSS after the big bodies and the explosion stays below baseline + this
PHASE_LIMIT = 30.0
STALL_RETRIES = 2  # a phase in which the healthy target missed a deadline (and nothing else) runs again
RECOVERED = "chaos_recovered 1\n"


def _explosion(variant: int) -> bytes:
    """A body of EXPLOSION distinct series; each variant has other label values (a target churning them)."""
    return "".join(f'chaos_exploded{{shard="{variant}",i="{i}"}} 1\n' for i in range(EXPLOSION)).encode()


class ChaosTarget:
    """A raw HTTP/1.1 server on 127.0.0.1 whose GET answer is `mode`; counts the requests it got."""

    def __init__(self) -> None:
        self.mode = "ok"
        self.requests = 0
        self._explosions = [_explosion(0), _explosion(1)]
        outer = self

        class Handler(socketserver.BaseRequestHandler):
            def handle(self) -> None:
                self.request.settimeout(10)
                data = b""
                while b"\r\n\r\n" not in data:
                    chunk = self.request.recv(4096)
                    if not chunk:
                        return
                    data += chunk
                outer.requests += 1
                with contextlib.suppress(OSError):  # the watchdog gave up on this answer, as it should
                    outer.answer(self.request, outer.mode, outer.requests)

        self.server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(
            target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        ).start()

    def answer(self, sock: socket.socket, mode: str, n: int) -> None:
        """Write the answer of one fault mode."""

        def head(length: int | None, status: str = "200 OK") -> bytes:
            size = "" if length is None else f"Content-Length: {length}\r\n"
            return (
                f"HTTP/1.1 {status}\r\nContent-Type: text/plain\r\n{size}Connection: close\r\n\r\n".encode()
            )

        if mode == "ok":
            sock.sendall(head(len(RECOVERED)) + RECOVERED.encode())
        elif mode == "hang":
            time.sleep(HANG)
            sock.sendall(head(len(RECOVERED)) + RECOVERED.encode())
        elif mode == "trickle":  # one byte at a time: every read is quick, the whole answer is not
            sock.sendall(head(None))
            for byte in RECOVERED.encode() * 20:
                sock.sendall(bytes([byte]))
                time.sleep(0.3)
        elif mode == "status500":
            sock.sendall(head(5, "500 Internal Server Error") + b"oops\n")
        elif mode == "truncated":  # promises 1000 bytes, sends 20, hangs up
            sock.sendall(head(1000) + RECOVERED.encode())
        elif mode == "binary":
            body = bytes(range(256)) * 64
            sock.sendall(head(len(body)) + body)
        elif mode == "text":
            body = b"chaos_ok 1\nthis is { not valid exposition\n"
            sock.sendall(head(len(body)) + body)
        elif mode in ("declared50", "undeclared50"):
            sock.sendall(head(BIG if mode == "declared50" else None))
            line = b"chaos_big_body 1\n" * (1 << 16)  # 1 MiB of valid lines
            for _ in range(BIG // len(line)):
                sock.sendall(line)
        elif mode == "explosion":
            body = self._explosions[n % 2]
            sock.sendall(head(len(body)) + body)
        else:
            raise ValueError(mode)

    def close(self) -> None:
        """Stop serving."""
        self.server.shutdown()
        self.server.server_close()


# mode -> what last_error must say
FAULTS = [
    ("hang", f"timeout after {SCRAPE_TIMEOUT:g}s"),
    ("trickle", f"timeout after {SCRAPE_TIMEOUT:g}s (deadline exceeded)"),
    ("status500", "server returned HTTP status 500"),
    ("truncated", "RemoteProtocolError"),
    ("binary", "body is not UTF-8"),
    ("text", "parse error: line 2"),
    ("declared50", f"body size {BIG} exceeds body_size_limit {16 << 20}"),
    ("undeclared50", f"body exceeds body_size_limit {16 << 20}"),
    ("explosion", f"sample_limit exceeded: {EXPLOSION} samples > limit 20000"),
]
HEAVY = {"declared50", "undeclared50", "explosion"}  # the faults after which RSS is checked


def rss_mb(pid: int) -> float:
    """Resident set size of a process, from /proc."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError(f"no VmRSS for pid {pid}")


class Sampler:
    """Polls /api/v1/targets in the background; keeps every answer's view of one target."""

    def __init__(self, url: str, name: str) -> None:
        self.url, self.name = url, name
        self.rows: list[dict[str, Any]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.25):
            try:
                rows = targets(httpx.get(self.url, timeout=5).json())
            except (httpx.HTTPError, ValueError):
                continue
            self.rows += [r for r in rows if r["name"] == self.name]

    def since(self, index: int) -> list[dict[str, Any]]:
        """Rows sampled after `index` rows."""
        return self.rows[index:]

    def stop(self) -> None:
        """Stop polling."""
        self._stop.set()
        self._thread.join(5)


def _target(rows: list[dict[str, Any]], name: str) -> dict[str, Any]:
    return next(r for r in rows if r["name"] == name)


def test_metrics_faults_stay_with_their_target_and_memory_stays_bounded(
    tmp_path: Path, fault: FaultServer, vllm_payload: str, cleanup: list[Callable[[], None]]
) -> None:
    fault.vllm_like(vllm_payload)
    chaos = ChaosTarget()
    cleanup.append(chaos.close)
    port = free_port()
    cfg, log = tmp_path / "watchdog.yml", tmp_path / "watchdog.log"
    cfg.write_text(
        watchdog_yaml(
            target(fault.url, name="healthy", canary={"interval": "2s", "timeout": "5s"}),
            target(chaos.url, name="faulty", health_probe=False),
            port=port,
            token=None,
            global_settings={**FAST, "scrape_timeout": f"{SCRAPE_TIMEOUT:g}s", "keep_unreferenced": True},
        )
    )
    wd = start_watchdog(cfg, log)
    cleanup.append(lambda: (wd.kill(), wd.wait(10)))
    api = f"http://127.0.0.1:{port}/api/v1/targets"
    both_up = poll(api, lambda j: all(r["up"] for r in targets(j)), 30, "both targets up", log)
    assert _target(targets(both_up), "healthy")["samples"] > 400
    time.sleep(3)  # a few more scrapes of both: the baseline includes the steady state
    baseline = rss_mb(wd.pid)
    healthy = Sampler(api, "healthy")
    cleanup.append(healthy.stop)
    peaks: dict[str, float] = {}
    stalls: list[tuple[str, list[str]]] = []  # (mode, the healthy target's errors) of each phase run again

    def run(mode: str, message: str) -> list[dict[str, Any]]:
        """One fault phase and the faulty target's recovery after it; the healthy target's rows meanwhile."""
        mark, began = len(healthy.rows), chaos.requests
        chaos.mode = mode
        down = poll(
            api,
            lambda j: (not (t := _target(targets(j), "faulty"))["up"]) and message in (t["last_error"] or ""),
            PHASE_LIMIT,
            f"faulty target down with {message!r}",
            log,
        )
        seen = _target(targets(down), "healthy")["last_scrape"]
        poll(  # the healthy target goes on being scraped while the fault lasts
            api,
            lambda j: (t := _target(targets(j), "healthy"))["up"] and t["last_scrape"] >= seen + 1.5,
            PHASE_LIMIT,
            f"healthy target scraped during {mode}",
            log,
        )
        if mode in HEAVY:  # let the fault repeat: a leak would grow with every scrape
            deadline = time.monotonic() + PHASE_LIMIT
            while chaos.requests < began + 4 and time.monotonic() < deadline:
                time.sleep(0.2)
            assert chaos.requests >= began + 4, f"{mode}: the faulty target was not scraped again"
            peaks[mode] = rss_mb(wd.pid)
            assert peaks[mode] < baseline + RSS_HEADROOM_MB, (mode, baseline, peaks)
        chaos.mode = "ok"
        poll(
            api,
            lambda j: (
                (t := _target(targets(j), "faulty"))["up"] and not t["last_error"] and t["samples"] == 1
            ),
            PHASE_LIMIT,
            f"faulty target recovered after {mode}",
            log,
        )
        return healthy.since(mark)

    for mode, message in FAULTS:
        for _ in range(STALL_RETRIES + 1):
            during = run(mode, message)
            assert during, mode
            wrong = sorted({r["last_error"] for r in during if not r["up"] or r["last_error"]})
            if not wrong:
                break
            # Anything but a missed deadline is the fault reaching the healthy target: fail at once. A
            # missed deadline is also what a 2-core machine shared with other tests gives when it does not
            # run the watchdog (or both test servers) for a second: the phase runs again, and a fault that
            # blocks the watchdog's loop misses the healthy deadline on every run.
            assert all(e.startswith(f"timeout after {SCRAPE_TIMEOUT:g}s") for e in wrong), (mode, during[-3:])
            stalls.append((mode, wrong))
        else:
            raise AssertionError(f"{mode}: the healthy target missed its deadline on every run: {stalls}")

    healthy.stop()
    assert wd.poll() is None, log.read_text()[-3000:]
    metrics = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
    errors: dict[tuple[str, str], float] = {}  # (target, kind) -> count; every series exists from 0
    for family in text_string_to_metric_families(metrics):
        for sample in family.samples:
            if sample.name == "vllm_watchdog_scrape_errors_total":
                errors[(sample.labels.get("target", ""), sample.labels["kind"])] = sample.value
    for kind in ("timeout", "status", "connection", "encoding", "parse", "size", "sample_limit"):
        assert errors.get(("faulty", kind), 0) >= 1, (kind, errors)
    healthy_errors = {kind for (name, kind), n in errors.items() if name == "healthy" and n}
    assert healthy_errors <= ({"timeout"} if stalls else set()), (errors, stalls)
    print(f"\nwatchdog RSS: baseline {baseline:.0f} MB, after heavy faults {peaks}; run again: {stalls}")
