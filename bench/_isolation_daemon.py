"""The daemon of bench/isolation.py: its config, start, restart after a crash, and its gateway's end.

Besides the upstream (target vllm-0, behind the gateway) and the fake targets, the config of a daemon with
rules carries a probe: an alert that is true for the last 8 s of every 10 s of wall time (`for: 4.5s`, so
that a few ms of scheduling jitter never push its firing by a whole 1 s interval) and a webhook that tells
the bench when it fired. How long after its condition turned true it fired is the probe's measurement.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

PROBE_ALERT = "BenchProbe"
PROBE_GROUP = "bench-probe"
PROBE_CYCLE = 10.0  # seconds of wall time
PROBE_TRUE_FROM = 2.0  # the condition holds from this second of each cycle to its end
PROBE_FOR = 4.5
PROBE_PATH = "/probe"
PROBE_RULES = f"""groups:
  - name: {PROBE_GROUP}
    rules:
      - alert: {PROBE_ALERT}
        expr: vector(time() % {PROBE_CYCLE:g}) >= {PROBE_TRUE_FROM:g}
        for: {PROBE_FOR * 1000:.0f}ms
"""


@dataclass
class Daemon:
    """A running daemon and its gateway."""

    proc: subprocess.Popen[bytes]
    api: int
    gw: int
    gw_pid: int
    cfg: Path
    log: Path

    def alive(self) -> bool:
        """The daemon's process still runs."""
        return self.proc.poll() is None


def daemon_config(
    tmp: Path,
    api: int,
    gw: int,
    upstream: int,
    tports: list[int],
    rules: bool,
    webhook: str | None = None,
    hostile: int | None = None,
) -> Path:
    """The watchdog's config: the upstream as target vllm-0 behind the gateway, plus the fake targets (and
    the hostile one); with rules, the bundled rules, and the probe if a webhook receives it."""
    targets = [
        {"name": "vllm-0", "url": f"http://127.0.0.1:{upstream}", "canary": False, "health_probe": False}
    ]
    targets += [
        {"name": f"t{i:03d}", "url": f"http://127.0.0.1:{p}", "canary": False, "health_probe": False}
        for i, p in enumerate(tports)
    ]
    if hostile is not None:
        url = f"http://127.0.0.1:{hostile}"
        targets.append({"name": "hostile", "url": url, "canary": False, "health_probe": False})
    rule_files = ["bundled:vllm.rules.yml"] if rules else []
    cfg: dict[str, object] = {
        "global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
        "listen": f"127.0.0.1:{api}",
        "state_dir": str(tmp / f"state-{api}"),
        "targets": targets,
        "gateway": {"listen": f"127.0.0.1:{gw}", "target": "vllm-0"},
    }
    if rules and webhook is not None:
        probe = tmp / "probe.rules.yml"
        probe.write_text(PROBE_RULES)
        rule_files.append(str(probe))
        match = {"alertname": PROBE_ALERT}
        cfg["notifiers"] = [{"type": "webhook", "name": "probe", "url": webhook + PROBE_PATH, "match": match}]
    cfg["rule_files"] = rule_files
    path = tmp / f"watchdog-{api}.yml"
    path.write_text(json.dumps(cfg, indent=1))
    return path


def start_daemon(cfg: Path, api: int, log: Path) -> tuple[subprocess.Popen[bytes], int]:
    """The daemon (which starts its gateway); (daemon, gateway pid) once the gateway answers."""
    with log.open("ab") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "vllm_watchdog", "run", "--config", str(cfg), "--log-level", "warning"],
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the daemon exited with {proc.returncode}; see {log}")
        try:
            data = httpx.get(f"http://127.0.0.1:{api}/api/v1/gateway", timeout=2).json()["data"]
            return proc, int(data["pid"])
        except (httpx.HTTPError, KeyError, ValueError, TypeError):
            time.sleep(0.2)
    raise RuntimeError(f"no gateway after 120 s; see {log}")


def launch(cfg: Path, api: int, gw: int, log: Path) -> Daemon:
    """start_daemon, as a Daemon."""
    proc, pid = start_daemon(cfg, api, log)
    return Daemon(proc, api, gw, pid, cfg, log)


def kill_gateway(pid: int) -> None:
    """The gateway outlives a killed daemon by design: stop it explicitly."""
    try:
        os.kill(pid, signal.SIGTERM)
        for _ in range(100):
            os.kill(pid, 0)
            time.sleep(0.1)
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        return


def gateway_pid(api: int) -> int | None:
    """The gateway's pid as the daemon reports it now; None if the daemon does not say."""
    try:
        return int(httpx.get(f"http://127.0.0.1:{api}/api/v1/gateway", timeout=10).json()["data"]["pid"])
    except (httpx.HTTPError, KeyError, ValueError, TypeError):
        return None


def stop_daemon(d: Daemon) -> None:
    """SIGTERM the daemon's group (SIGKILL after 30 s), then its gateway."""
    if d.proc.poll() is None:
        os.killpg(d.proc.pid, signal.SIGTERM)
        try:
            d.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(d.proc.pid, signal.SIGKILL)
            d.proc.wait(timeout=30)
    kill_gateway(d.gw_pid)


def relaunch(d: Daemon, settle: float) -> Daemon:
    """A fresh daemon on the same config and ports, after the old one (or its gateway) died."""
    with_group_gone(d)
    fresh = launch(d.cfg, d.api, d.gw, d.log)
    time.sleep(settle)
    return fresh


def with_group_gone(d: Daemon) -> None:
    """Make sure nothing of the old daemon is left: its process group and its gateway (as it last said)."""
    last = gateway_pid(d.api) if d.alive() else None
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(d.proc.pid, signal.SIGKILL)
    d.proc.wait(timeout=30)
    for pid in {d.gw_pid, last or d.gw_pid}:
        kill_gateway(pid)
