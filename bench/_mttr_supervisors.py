"""Parts of bench/mttr.py: what an operator would otherwise run vLLM under, as small supervisor loops with
the semantics of the real thing (systemd is not PID 1 here, and Docker's restart policy and a kubelet cannot
run the bench's vLLM on this machine), and the faults.

- systemd, `Restart=on-failure` (RestartSec=100ms, systemd's default): restarts when the main process exits
  with a status other than 0 or is killed by a signal other than SIGHUP, SIGINT, SIGTERM and SIGPIPE (those
  and status 0 are a clean exit for systemd); it does not look at /health.
- Docker, `--restart on-failure`: restarts on a non-zero exit status (a signal's death is 128+n), after
  100 ms, doubling per restart; it does not act on a HEALTHCHECK (that only marks the container unhealthy).
- Kubernetes, `restartPolicy: Always` with a liveness probe `httpGet /health` (periodSeconds 10,
  timeoutSeconds 1, failureThreshold 3), started once the container has been ready (a startup probe's
  job): after 3 failures in a row the container gets SIGTERM, SIGKILL after terminationGracePeriodSeconds
  (30), and is restarted; any exit is restarted too, after the kubelet's back-off (10 s, doubling).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
CLEAN_SIGNALS = {signal.SIGHUP, signal.SIGINT, signal.SIGTERM, signal.SIGPIPE}


class Supervisor:
    """Runs scripts/serve-vllm.sh in a session of its own and restarts it as `kind` would."""

    def __init__(self, kind: str, port: int, log: Path) -> None:
        self.kind = kind
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        self.log = log
        self.proc: subprocess.Popen[bytes] | None = None
        self.exits: list[str] = []  # how each run ended, as the supervisor saw it
        self.restarts = 0
        self.down = False  # exited, and this supervisor does not restart it
        self._stop = asyncio.Event()

    def start(self) -> None:
        """Start vLLM."""
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                ["bash", str(ROOT / "scripts" / "serve-vllm.sh"), "--port", str(self.port)],
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def pid(self) -> int | None:
        """The API server's pid (serve-vllm.sh execs it)."""
        return self.proc.pid if self.proc is not None and self.proc.poll() is None else None

    async def run(self) -> None:
        """Supervise until stop()."""
        delay, ready, failures, next_probe = 0.1, False, 0, 0.0
        async with httpx.AsyncClient(trust_env=False) as client:
            while not self._stop.is_set():
                await asyncio.sleep(0.1)
                assert self.proc is not None
                code = self.proc.poll()
                if code is not None and self.down:
                    continue  # left down
                if code is not None:
                    self.exits.append(_status(code))
                    if not self._restarts_on(code):
                        self.down = True
                        continue
                    wait = 10.0 * 2 ** min(self.restarts, 5) if self.kind == "kubernetes" else delay
                    await asyncio.sleep(wait)
                    delay = delay * 2 if self.kind == "docker" else delay
                    await self._restart(kill=False)
                    ready, failures = False, 0
                    continue
                if self.kind != "kubernetes" or time.monotonic() < next_probe:
                    continue
                next_probe = time.monotonic() + (10.0 if ready else 1.0)
                healthy = await _healthy(client, self.url)
                ready = ready or healthy
                failures = 0 if healthy or not ready else failures + 1
                if failures >= 3:
                    self.exits.append("liveness probe failed 3 times: killed")
                    await self._restart(kill=True)
                    ready, failures = False, 0

    def _restarts_on(self, code: int) -> bool:
        if self.kind == "kubernetes":
            return True
        if self.kind == "docker":
            return code != 0
        return code > 0 or (code < 0 and signal.Signals(-code) not in CLEAN_SIGNALS)

    async def _restart(self, kill: bool) -> None:
        if self._stop.is_set():
            return
        if kill and self.proc is not None:
            await asyncio.to_thread(stop_group, self.proc.pid, 30.0)
        elif self.proc is not None:
            await asyncio.to_thread(stop_group, self.proc.pid, 5.0)  # its leftover engine processes
        self.restarts += 1
        if not self._stop.is_set():  # stop() may have come while the old one was being stopped
            self.start()

    def stop(self) -> None:
        """Stop supervising and stop vLLM."""
        self._stop.set()
        if self.proc is not None:
            stop_group(self.proc.pid, 15.0)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(5)


async def _healthy(client: httpx.AsyncClient, url: str) -> bool:
    with contextlib.suppress(httpx.HTTPError):
        return (await client.get(url + "/health", timeout=1.0)).status_code == 200
    return False


def _status(code: int) -> str:
    return f"killed by {signal.Signals(-code).name}" if code < 0 else f"exited {code}"


def stop_group(pid: int, grace: float) -> None:
    """SIGCONT + SIGTERM to a process group, SIGKILL if it outlives `grace` seconds."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGCONT)
        os.killpg(pid, signal.SIGTERM)
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline:
            os.killpg(pid, 0)
            time.sleep(0.2)
        os.killpg(pid, signal.SIGKILL)


def engine_core(server: int) -> int | None:
    """vLLM's EngineCore: a process in the API server's session titled VLLM::EngineCore."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2 :].split()
        if int(fields[3]) == server and cmdline.startswith(b"VLLM::EngineCore"):
            return int(entry.name)
    return None


FAULTS = {
    "freeze": signal.SIGSTOP,  # the engine hangs; /health stays 200
    "kill": signal.SIGKILL,  # the engine dies at once
    "exit0": signal.SIGTERM,  # the engine shuts itself down cleanly (its handler exits with status 0)
}


def gone(pid: int) -> bool:
    """Whether the process has exited (gone, or a zombie not yet reaped)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat[stat.rfind(")") + 2 :].startswith("Z")


def inject(fault: str, server: int) -> tuple[float, int]:
    """Send the fault's signal to the EngineCore under `server`; when (unix seconds, taken after the /proc
    scan that finds it, which takes a while on a loaded host: a request answered meanwhile is no recovery)."""
    engine = engine_core(server)
    if engine is None:
        raise RuntimeError(f"no VLLM::EngineCore in the session of {server}")
    at = time.time()
    os.kill(engine, FAULTS[fault])
    return at, engine
