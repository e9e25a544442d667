"""A stand-in for vLLM that starts in a fraction of a second, for chaos tests that restart servers often.

It answers what the watchdog asks of vLLM: `/health`, `/metrics` (vLLM's queue gauges), `/v1/models` and
`/v1/completions` (one generated token), plus `GET /args` (its command line and pid). Its flags:

- `--port P` (required);
- `--term-delay S`: on SIGTERM, `/health` answers 503 and the server exits S seconds later, like a vLLM
  finishing its requests; a test kills the watchdog inside that window to hit the middle of a stop;
- `--term-delay-file F`: the same, S read from F at SIGTERM (when F exists), so that tests sharing one
  watchdog can each set how long a stop takes;
- `--crash-file F`: if F exists at start, exit with status 1 as many seconds after start as F says;
- `--hold-file F`: on SIGTERM, `/health` answers 503 and the server exits only once F exists (a stop that
  lasts exactly until the test lets it end);
- anything else (`--speculative-config ...`) is accepted and ignored, so actions can edit it.

Only the standard library: in Docker it runs on the host's /usr/bin/python3 through read-only bind mounts.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import httpx

from tests.support.docker_engine import host_binds, remove_container, session_labels, unique_name, wait_http
from tests.support.procs import command_lines
from tests.support.vllm_server import free_port
from vllm_watchdog.actions.runtimes.procfs import read_stat

STUB = r"""
import http.server, json, os, signal, sys, threading, time
args = sys.argv[1:]
def opt(name, default=None):
    return args[args.index(name) + 1] if name in args else default
stopping = threading.Event()
def later(seconds, code):
    timer = threading.Timer(seconds, lambda: os._exit(code))
    timer.daemon = True
    timer.start()
def hold(path):
    while not os.path.exists(path):
        time.sleep(0.05)
    os._exit(0)
def on_term(*_):
    stopping.set()
    delay_file = opt("--term-delay-file")
    if opt("--hold-file"):
        threading.Thread(target=hold, args=(opt("--hold-file"),), daemon=True).start()
    elif delay_file and os.path.exists(delay_file):
        later(float(open(delay_file).read().strip() or "0"), 0)
    else:
        later(float(opt("--term-delay", "0")), 0)
signal.signal(signal.SIGTERM, on_term)
crash = opt("--crash-file")
if crash and os.path.exists(crash):
    later(float(open(crash).read().strip() or "0"), 1)
METRICS = (
    "# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{model_name=\"stub\"} 0\n"
    "# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting{model_name=\"stub\"} 0\n"
)
COMPLETION = {
    "id": "cmpl-stub", "object": "text_completion", "model": "stub",
    "choices": [{"index": 0, "text": " ok", "finish_reason": "length"}],
    "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
}
class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def reply(self, status, body, kind="application/json"):
        data = body.encode() if isinstance(body, str) else json.dumps(body).encode()
        self.send_response(status)
        self.send_header("content-type", kind)
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)
    def do_GET(self):
        if self.path == "/health":
            self.reply(503 if stopping.is_set() else 200, "")
        elif self.path == "/metrics":
            self.reply(200, METRICS, "text/plain; version=0.0.4")
        elif self.path == "/v1/models":
            self.reply(200, {"object": "list", "data": [{"id": "stub", "object": "model"}]})
        else:
            self.reply(200, {"args": args, "pid": os.getpid()})
    def do_POST(self):
        self.rfile.read(int(self.headers.get("content-length") or 0))
        if stopping.is_set():
            self.reply(503, {"error": "stopping"})
        else:
            self.reply(200, COMPLETION)
    def log_message(self, *_):
        pass
http.server.ThreadingHTTPServer(("127.0.0.1", int(opt("--port"))), Handler).serve_forever()
"""

WAIT = 60.0  # bound on a stub answering or going quiet; never asserted on


def write_stub(directory: Path) -> Path:
    """The stub as a script file (process mode runs it with the test's interpreter)."""
    path = directory / "stub_server.py"
    path.write_text(STUB)
    return path


class StubContainers:
    """Stub containers on the host network, run with the host's python; close() removes them and backups."""

    def __init__(self, client: Any, image: str) -> None:
        self.client = client
        self.image = image
        self.names: list[str] = []

    def run(
        self,
        args: Sequence[str],
        *,
        rw: Sequence[Path] = (),
        labels: Mapping[str, str] | None = None,
        port: int | None = None,
    ) -> tuple[str, int]:
        """Start one with `args` after `--port P` (and `rw` host folders bound writable, `labels` besides the
        session's); its name and port (`port`, else a free one)."""
        name, port = unique_name("stub"), port or free_port()
        self.names += [name, name + ".watchdog-previous"]
        self.client.containers.run(
            self.image,
            name=name,
            entrypoint=["/usr/bin/python3", "-c", STUB],
            command=["--port", str(port), *args],
            volumes=[*host_binds(), *(f"{p}:{p}" for p in rw)],
            network_mode="host",
            labels=session_labels(**(labels or {})),
            detach=True,
        )
        wait_http(self.client, name, f"http://127.0.0.1:{port}/health", timeout=WAIT)
        return name, port

    def close(self) -> None:
        """Remove every container this helper created, whatever state they are in."""
        for name in self.names:
            remove_container(self.client, name)


def stub_args(port: int) -> dict[str, Any]:
    """What the stub on `port` says about itself (GET /args): its args and pid."""
    answer: dict[str, Any] = httpx.get(f"http://127.0.0.1:{port}/args", timeout=5).json()
    return answer


def wait_status(url: str, status: int, limit: float = WAIT) -> None:
    """Poll `url` until it answers `status`; AssertionError after `limit` seconds."""
    deadline = time.monotonic() + limit
    last: object = None
    while time.monotonic() < deadline:
        try:
            last = httpx.get(url, timeout=2).status_code
            if last == status:
                return
        except httpx.HTTPError as exc:
            last = exc
        time.sleep(0.05)
    raise AssertionError(f"{url} never answered {status} within {limit}s; last: {last}")


def stubs_on(port: int, script: Path) -> list[int]:
    """Live processes running the stub script on `port` (process mode)."""
    pids = []
    for pid, argv in command_lines():
        stat = read_stat(pid)
        if str(script).encode() in argv and str(port).encode() in argv and stat and not stat.gone:
            pids.append(pid)
    return pids
