"""Chaos: the Docker engine dies in the middle of a restart, stays down a while, and comes back.

This test starts a private dockerd of its own (own socket, data root, exec root and pidfile under a short /tmp
directory; no bridge, no iptables), never touching the shared engine of tests/support/docker_engine.py. It runs one
container there: a small server on the host network that answers like vLLM (/health, /metrics, the canary)
and ignores SIGTERM, so that `docker stop` takes its whole `stop_timeout`. A watchdog pointed at the private
engine (DOCKER_HOST) restarts the container on an inbound alert; while `docker stop` is in flight the test
kills dockerd with SIGKILL. Then:

- the action fails cleanly: outcome `failed`, the reason names the unreachable engine, the target is not left
  drained, the watchdog keeps running and scraping, and `VLLMWatchdogActionFailed` fires;
- the failed action is retried while its alert fires (it was sent once, as an Alertmanager would), spaced
  by the backoff rail (`/api/v1/actions` shows the pending retry and its retry_at, and each attempt);
- dockerd comes back (without live-restore it kills the container left running); the next retry starts the
  container, and then exactly one container of that name runs, no backup is left, no action is unfinished,
  no target drained, and no more retries are pending.
"""

from __future__ import annotations

import contextlib
import io
import itertools
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import docker
import httpx
from docker.errors import DockerException, NotFound

from tests.support.apitargets import targets
from tests.support.configs import AUTH, target, write_config
from tests.support.docker_engine import host_binds
from tests.support.vllm_server import free_port
from tests.support.watchdogproc import inbound_alert, poll
from vllm_watchdog.actions.runtimes.docker import BACKUP_SUFFIX

IMAGE = "chaos/hostroot:1"
ENGINE_LIMIT = 60.0
LIMIT = 90.0
BACKOFF = 2.0  # backoff_initial; backoff_max is 4x
STOP_TIMEOUT = 8  # seconds `docker stop` waits for the container that ignores SIGTERM

# Answers like a vLLM server: /health, /metrics, /v1/models and a one-token completion; ignores SIGTERM.
SERVER = """
import http.server, json, signal, sys
signal.signal(signal.SIGTERM, signal.SIG_IGN)
port = int(sys.argv[1])
METRICS = b'vllm:num_requests_running{model_name="tiny"} 0\\nvllm:num_requests_waiting{model_name="tiny"} 0\\n'
MODELS = json.dumps({"object": "list", "data": [{"id": "tiny", "object": "model"}]}).encode()
DONE = json.dumps({"choices": [{"text": "x"}], "usage": {"prompt_tokens": 1, "completion_tokens": 1}}).encode()
class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def reply(self, body, kind="application/json"):
        self.send_response(200)
        self.send_header("content-type", kind)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def do_GET(self):
        if self.path == "/metrics":
            self.reply(METRICS, "text/plain; version=0.0.4")
        else:
            self.reply(MODELS if self.path == "/v1/models" else b"")
    def do_POST(self):
        self.rfile.read(int(self.headers.get("content-length") or 0))
        self.reply(DONE)
    def log_message(self, *args):
        pass
http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler).serve_forever()
"""


class PrivateEngine:
    """A dockerd of this test's own under a short /tmp directory (a unix socket path must stay short)."""

    def __init__(self) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="chaosd-", dir="/tmp"))
        self.sock = self.root / "docker.sock"
        self.host = f"unix://{self.sock}"
        self.log_path = self.root / "dockerd.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        """Start dockerd and wait until it answers."""
        dockerd = shutil.which("dockerd") or "/usr/sbin/dockerd"
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                [
                    dockerd,
                    f"--host={self.host}",
                    f"--data-root={self.root / 'data'}",
                    f"--exec-root={self.root / 'exec'}",
                    f"--pidfile={self.root / 'docker.pid'}",
                    "--bridge=none",
                    "--iptables=false",
                    "--ip-masq=false",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        deadline = time.monotonic() + ENGINE_LIMIT
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, f"private dockerd exited: {self.log_tail()}"
            try:
                with contextlib.closing(self.client()) as client:
                    if client.ping():
                        return
            except (DockerException, OSError):
                pass
            time.sleep(0.3)
        raise AssertionError(f"private dockerd not answering after {ENGINE_LIMIT}s: {self.log_tail()}")

    def client(self) -> Any:
        """A Docker client on this engine."""
        return docker.DockerClient(base_url=self.host, version="1.41", timeout=60)

    def kill(self) -> None:
        """SIGKILL dockerd (its containerd goes with it; containers' shims stay)."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    def running(self) -> bool:
        """Whether dockerd runs."""
        return self.proc is not None and self.proc.poll() is None

    def close(self) -> None:
        """Remove every container (with dockerd started again if it is down: it kills what a dead one left
        running), stop dockerd, unmount what it mounted under the root, and delete the root."""
        try:
            if not self.running():
                self.start()
            with contextlib.closing(self.client()) as client:
                for found in client.containers.list(all=True):
                    found.remove(force=True)
        finally:
            if self.proc is not None and self.proc.poll() is None:
                os.killpg(self.proc.pid, signal.SIGTERM)
                try:
                    self.proc.wait(60)
                except subprocess.TimeoutExpired:
                    os.killpg(self.proc.pid, signal.SIGKILL)
                    self.proc.wait(30)
            mounts = [line.split()[1] for line in Path("/proc/mounts").read_text().splitlines()]
            for mount in sorted((m for m in mounts if m.startswith(str(self.root) + "/")), reverse=True):
                subprocess.run(["umount", "-l", mount], check=False)
            shutil.rmtree(self.root, ignore_errors=True)

    def log_tail(self, n: int = 3000) -> str:
        """The end of dockerd's log."""
        return self.log_path.read_text(errors="replace")[-n:] if self.log_path.exists() else ""


def _import_empty_image(client: Any) -> None:
    """The empty image containers fill with read-only bind mounts of the host (as scripts/vllm-image.sh)."""
    buf = io.BytesIO()
    tarfile.open(fileobj=buf, mode="w").close()
    repository, tag = IMAGE.split(":")
    client.api.import_image_from_data(buf.getvalue(), repository=repository, tag=tag)


def _history(base: str) -> list[dict[str, Any]]:
    return list(httpx.get(base + "/api/v1/actions", timeout=10).json()["data"]["history"])


def _restarts(base: str) -> list[dict[str, Any]]:
    """The restart rows that ran (oldest first)."""
    rows = [r for r in _history(base) if r["action"] == "restart" and r["outcome"] != "skipped"]
    return sorted(rows, key=lambda r: r["id"])


def test_docker_engine_down_mid_restart_fails_cleanly_retries_and_reconciles(
    tmp_path: Path, cleanup: list[Callable[[], None]]
) -> None:
    engine = PrivateEngine()
    cleanup.append(engine.close)
    engine.start()
    client = engine.client()
    cleanup.append(client.close)
    _import_empty_image(client)
    name, cport = f"chaos-vllm-{os.getpid()}", free_port()
    client.containers.run(
        IMAGE,
        name=name,
        entrypoint=["/usr/bin/python3", "-c", SERVER],
        command=[str(cport)],
        volumes=host_binds(),
        network_mode="host",
        detach=True,
    )
    target_url = f"http://127.0.0.1:{cport}"
    deadline = time.monotonic() + LIMIT
    while time.monotonic() < deadline:
        try:
            if httpx.get(target_url + "/health", timeout=2).status_code == 200:
                break
        except httpx.HTTPError:
            time.sleep(0.3)
    first_id = client.containers.get(name).id

    port = free_port()
    base = f"http://127.0.0.1:{port}"
    log = tmp_path / "watchdog.log"
    cfg = write_config(
        tmp_path,
        target(target_url, name="vllm-d", container=name),
        port=port,
        rest=f"""routes:
  - {{match: {{alertname: VLLMEngineHung}}, actions: [restart]}}
actions:
  restart:
    type: restart
    cooldown: 0s
    startup_grace: 0s
    max_per_window: {{count: 20, window: 1h}}
    backoff_initial: {BACKOFF:g}s
    backoff_max: {4 * BACKOFF:g}s
    drain_timeout: 1s
    stop_timeout: {STOP_TIMEOUT}s
    ready_timeout: 60s
""",
    )
    with log.open("ab") as out:
        wd = subprocess.Popen(
            [sys.executable, "-m", "vllm_watchdog", "run", "--config", str(cfg)],
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, "DOCKER_HOST": engine.host},
        )
    cleanup.append(lambda: (wd.kill(), wd.wait(10)))
    poll(base + "/api/v1/targets", lambda j: targets(j)[0]["up"], LIMIT, "target up", log)

    # The alert arrives once, as an Alertmanager sends it; the restart reaches `docker stop`.
    hung = inbound_alert("VLLMEngineHung", "vllm-d")
    resp = httpx.post(base + "/api/v1/alertmanager", json=hung, headers=AUTH, timeout=10)
    assert resp.status_code == 200 and resp.json()["queued"] == 1
    poll(
        base + "/api/v1/actions",
        lambda j: any(r["outcome"] == "running" and r["step"] == "stop" for r in j["data"]["history"]),
        LIMIT,
        "the restart in its stop step",
        log,
    )
    engine.kill()

    # 1. The action fails cleanly, the target is not left drained, the watchdog alerts and keeps scraping.
    data = poll(
        base + "/api/v1/actions",
        lambda j: any(r["outcome"] == "failed" for r in j["data"]["history"]),
        LIMIT,
        "the restart failed",
        log,
    )["data"]
    failed = next(r for r in data["history"] if r["outcome"] == "failed")
    assert failed["step"] == "stop" or "stop" in [s["step"] for s in failed["steps"]], failed
    assert "docker stop" in failed["reason"] and "no answer from the Docker engine" in failed["reason"], (
        failed
    )
    assert [s["step"] for s in failed["steps"]][-1] == "undrain", failed["steps"]
    assert data["drained"] == {}
    own = [(a["labels"]["alertname"], a["labels"]["target"]) for a in data["watchdog_alerts"]]
    assert ("VLLMWatchdogActionFailed", "vllm-d") in own
    scraped = targets(httpx.get(base + "/api/v1/targets", timeout=10).json())[0]["last_scrape"]
    poll(
        base + "/api/v1/targets",
        lambda j: targets(j)[0]["last_scrape"] > scraped + 1.5,
        LIMIT,
        "scrapes going on with the engine down",
        log,
    )

    # 2. Retried with backoff while the alert fires: two more attempts, each after its backoff. While an
    # attempt runs, its entry has no retry_at (the busy rail cannot say when): wait for one between attempts.
    pending = poll(
        base + "/api/v1/actions",
        lambda j: (
            [(p["action"], p["target"]) for p in j["data"].get("retries", [])] == [("restart", "vllm-d")]
            and j["data"]["retries"][0]["retry_at"] is not None
        ),
        LIMIT,
        "a pending retry with its time in /api/v1/actions",
        log,
    )["data"]["retries"][0]
    assert pending["until"] is None  # until the alert resolves
    poll(
        base + "/api/v1/actions",
        lambda j: len([r for r in j["data"]["history"] if r["outcome"] == "failed"]) >= 3,
        LIMIT,
        "two failed retries",
        log,
    )
    runs = _restarts(base)
    assert [r["trigger"] for r in runs[:3]] == ["inbound", "retry", "retry"], runs
    for n, (before, after) in enumerate(itertools.pairwise(runs[:3]), start=1):
        assert after["started_at"] >= before["finished_at"] + BACKOFF * 2 ** (n - 1) - 0.01, (n, runs)
        assert "no answer from the Docker engine" in after["reason"], after
    assert httpx.get(base + "/api/v1/actions", timeout=10).json()["data"]["drained"] == {}

    # 3. The engine comes back: the next retry restarts the container; nothing is left half-done.
    engine.start()
    done = poll(
        base + "/api/v1/actions",
        lambda j: any(r["outcome"] == "succeeded" for r in j["data"]["history"]) and not j["data"]["retries"],
        LIMIT,
        "a retry that succeeds once the engine is back",
        log,
    )["data"]
    ok = next(r for r in done["history"] if r["outcome"] == "succeeded")
    assert ok["trigger"] == "retry" and ok["reason"] == "restarted and ready", ok
    assert done["drained"] == {} and done["running"] == {} and done["queued"] == {}
    assert all(r["outcome"] != "running" for r in done["history"])
    with contextlib.closing(engine.client()) as fresh:
        named = [c for c in fresh.containers.list(all=True) if c.name in (name, name + BACKUP_SUFFIX)]
        assert [(c.name, c.status) for c in named] == [(name, "running")]
        assert named[0].id == first_id  # restarted, not recreated
        try:
            fresh.containers.get(name + BACKUP_SUFFIX)
            raise AssertionError("a backup container was left")
        except NotFound:
            pass
    assert httpx.get(target_url + "/health", timeout=5).status_code == 200
    settled = len(_restarts(base))
    time.sleep(3 * BACKOFF)  # long enough for a retry that should not happen
    assert len(_restarts(base)) == settled
    assert wd.poll() is None
    print(f"\nrestart attempts: {[(r['trigger'], r['outcome']) for r in _restarts(base)]}")
