from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from tests.support.apitargets import targets
from tests.support.configs import AUTH, target, watchdog_yaml
from tests.support.faultserver import FaultServer
from tests.support.vllm_server import free_port
from vllm_watchdog.service.daemon import Daemon, DaemonOptions

pytestmark = pytest.mark.anyio
PAYLOAD = 'vllm:num_requests_waiting{model_name="m"} 3\nvllm:num_requests_running{model_name="m"} 1\n'


def daemon_config(tmp_path: Path, target_url: str, port: int, rest: str = "") -> Path:
    """`tmp_path`/watchdog.yml: the shared header, the canary on every second, and no state_dir (alert state
    in memory); then `rest`."""
    path = tmp_path / "watchdog.yml"
    canary = {"interval": "1s", "timeout": "2s"}
    path.write_text(watchdog_yaml(target(target_url, canary=canary), port=port, rest=rest, integrity=True))
    return path


async def wait_for(client: httpx.AsyncClient, url: str, pred: object, limit: float = 20.0) -> object:
    """Poll a JSON endpoint until pred(json) is true; bounded."""
    deadline = time.monotonic() + limit
    last: object = None
    while time.monotonic() < deadline:
        try:
            last = (await client.get(url)).json()
            if pred(last):  # type: ignore[operator]
                return last
        except (httpx.HTTPError, ValueError):
            pass
        await asyncio.sleep(0.2)
    raise AssertionError(f"condition not met within {limit}s; last: {last}")


@pytest.fixture
async def daemon(tmp_path: Path, fault: FaultServer) -> AsyncIterator[tuple[Daemon, str, Path]]:
    fault.vllm_like(PAYLOAD)
    port = free_port()
    cfg = daemon_config(tmp_path, fault.url, port)
    d = Daemon.load(DaemonOptions(str(cfg), env={}))
    ready = asyncio.Event()
    task = asyncio.create_task(d.run(ready))
    await asyncio.wait([task, asyncio.create_task(ready.wait())], timeout=20, return_when="FIRST_COMPLETED")
    if task.done():
        task.result()  # surface the start-up error
    assert ready.is_set()
    yield d, f"http://127.0.0.1:{port}", cfg
    d.stop()
    await asyncio.wait_for(task, 10)


async def test_api_shows_targets_series_metrics(daemon: tuple[Daemon, str, Path], fault: FaultServer) -> None:
    _, base, _ = daemon
    async with httpx.AsyncClient() as client:
        answer = await wait_for(
            client,
            base + "/api/v1/targets",
            lambda j: (
                targets(j)[0]["up"] and targets(j)[0]["canary"]["success"] and targets(j)[0]["health"]["up"]
            ),
        )
        row = targets(answer)[0]
        assert row["name"] == "vllm-0" and row["last_error"] == "" and row["samples"] == 2
        r = await client.get(
            base + "/api/v1/samples", params={"match": 'vllm:num_requests_waiting{target="vllm-0"}'}
        )
        (series,) = r.json()["data"]
        hostport = fault.url.removeprefix("http://").rstrip("/")  # as Prometheus labels a scrape of it
        assert series["labels"] == {
            "__name__": "vllm:num_requests_waiting",
            "instance": hostport,
            "job": "vllm",
            "target": "vllm-0",
            "model_name": "m",
        }
        assert series["samples"][-1][1] == "3.0"
        health = await client.get(base + "/api/v1/samples", params={"match": "vllm_watchdog_health_up"})
        assert health.json()["data"][0]["samples"][-1][1] == "1.0"
        bad = await client.get(base + "/api/v1/samples", params={"match": "rate(x[1m])"})
        assert bad.status_code == 400 and "not a plain series selector" in bad.json()["error"]
        assert (await client.get(base + "/api/v1/series")).status_code == 400
        metrics = (await client.get(base + "/metrics")).text
        assert f'vllm_watchdog_target_up{{instance="{hostport}",job="vllm",target="vllm-0"}} 1.0' in metrics
        assert (
            f'vllm_watchdog_canary_success{{instance="{hostport}",job="vllm",target="vllm-0"}} 1.0' in metrics
        )
        assert f'vllm_watchdog_target_info{{instance="{hostport}",job="vllm",target="vllm-0"}} 1.0' in metrics
        assert "vllm_watchdog_build_info{" in metrics and "vllm_watchdog_store_series" in metrics
        assert (await client.get(base + "/healthz")).json() == {"status": "ok"}


async def test_jobs_start_within_one_interval_and_missed_deadlines_are_exported(
    daemon: tuple[Daemon, str, Path],
) -> None:
    d, base, _ = daemon
    due = d.schedule.due_times()
    assert set(due) >= {"scrape:vllm-0", "health:vllm-0", "canary:vllm-0", "gc"}
    # gc, the longest interval but the known-answer check's (60 s), is 15 s
    assert all(t - d.monotonic() <= (60.0 if k.startswith("integrity:") else 15.0) for k, t in due.items())
    assert "integrity:vllm-0" in due
    # The API's Date header is refreshed by the upkeep, in its wake-up: uvicorn keeps no timer of its own.
    assert due["api"] == due["notify"] == due["gc"]
    d.server.server_state.default_headers = []
    await d.server.tick()
    assert b"date" in dict(d.server.server_state.default_headers)
    d.counters.missed("scrape")
    d.counters.missed("scrape")
    async with httpx.AsyncClient() as client:
        metrics = (await client.get(base + "/metrics")).text
    assert 'vllm_watchdog_missed_deadlines_total{job="scrape"} 2.0' in metrics


async def test_reload_needs_bearer_token(daemon: tuple[Daemon, str, Path]) -> None:
    _, base, _ = daemon
    async with httpx.AsyncClient() as client:
        none = await client.post(base + "/-/reload")
        assert none.status_code == 401 and none.headers["www-authenticate"].startswith("Bearer")
        wrong = await client.post(base + "/-/reload", headers={"Authorization": "Bearer nope"})
        assert wrong.status_code == 403
        big = await client.post(base + "/-/reload", headers=AUTH, content=b"x" * 100_000)
        assert big.status_code == 413
        ok = await client.post(base + "/-/reload", headers=AUTH)
        assert ok.status_code == 200 and ok.json() == {"status": "success"}


async def test_invalid_reload_keeps_old_config_and_reports(daemon: tuple[Daemon, str, Path]) -> None:
    d, base, cfg = daemon
    good = cfg.read_text()
    cfg.write_text(good + "bogus: 1\n")
    ok, problems = await d.reload()
    line = len(good.splitlines()) + 1
    assert not ok and problems == [
        f"{cfg}:{line}: bogus: unknown key (allowed: actions, api_token, docker_sd_configs, dry_run, external_url, "
        "file_sd_configs, fleet, gateway, global, gpus, incidents, include, integrity, listen, notifiers, routes, rule_backend, rule_files, "
        "rule_overrides, "
        "runbook_base_url, state_dir, targets)"
    ]
    assert [t for t in d.monitor.targets] == ["vllm-0"]
    async with httpx.AsyncClient() as client:
        metrics = (await client.get(base + "/metrics")).text
    assert "vllm_watchdog_config_last_reload_successful 0.0" in metrics
    assert "vllm_watchdog_config_errors 1.0" in metrics
    cfg.write_text(good.replace("vllm-0", "vllm-renamed"))  # the target's name, its one mention
    ok, _ = await d.reload()
    assert ok and list(d.monitor.targets) == ["vllm-renamed"]


def test_run_sigterm_sighup_sdnotify_and_json_logs(tmp_path: Path, fault: FaultServer) -> None:
    fault.vllm_like(PAYLOAD)
    port = free_port()
    cfg = daemon_config(tmp_path, fault.url, port)
    sock_path = str(tmp_path / "notify.sock")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(sock_path)
    sock.settimeout(20)
    env = {**os.environ, "NOTIFY_SOCKET": sock_path, "WATCHDOG_USEC": "1000000"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "vllm_watchdog", "run", "--config", str(cfg)],
        env=env,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert sock.recv(200) == b"READY=1"
        first = [sock.recv(200) for _ in range(4)]  # pings every 0.5 s, the status line each time it changes
        assert b"WATCHDOG=1" in first
        assert any(m.startswith(b"STATUS=") and b"targets up" in m for m in first), first
        cfg.write_text(cfg.read_text() + "bogus: 1\n")
        proc.send_signal(signal.SIGHUP)
        deadline = time.monotonic() + 20
        metrics = ""
        while time.monotonic() < deadline and 'reloads_total{result="failure"} 1.0' not in metrics:
            time.sleep(0.2)
            metrics = httpx.get(f"http://127.0.0.1:{port}/metrics").text
        assert 'vllm_watchdog_config_reloads_total{result="failure"} 1.0' in metrics
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 0
        messages = []
        sock.settimeout(0.5)
        while True:
            try:
                messages.append(sock.recv(100))
            except TimeoutError:
                break
        assert b"STOPPING=1" in messages
        # The rejected reload was announced (with the monotonic time systemd 253 wants) and ended by READY=1.
        reloading = next(i for i, m in enumerate(messages) if m.startswith(b"RELOADING=1\nMONOTONIC_USEC="))
        assert b"READY=1" in messages[reloading:]
    finally:
        proc.kill()
        sock.close()
    logs = [json.loads(line) for line in proc.stderr.read().splitlines() if line.startswith("{")]  # type: ignore[union-attr]
    msgs = [entry["msg"] for entry in logs]
    assert "watchdog started" in msgs and "shutting down" in msgs
    rejected = [e for e in logs if e["msg"] == "reload rejected; keeping the old config"]
    assert rejected and "bogus: unknown key" in rejected[0]["problem"]


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    """Run the CLI to completion (bounded)."""
    return subprocess.run(
        [sys.executable, "-m", "vllm_watchdog", *args], capture_output=True, text=True, timeout=60
    )


def test_run_with_invalid_config_exits_nonzero(tmp_path: Path) -> None:
    cfg = tmp_path / "c.yml"
    cfg.write_text("listen: nope\n")
    out = run_cli("run", "--config", str(cfg))
    assert out.returncode == 3 and f"{cfg}:1: listen: must be host:port" in out.stderr


def test_port_in_use_is_a_clear_error(tmp_path: Path, fault: FaultServer) -> None:
    cfg = daemon_config(tmp_path, fault.url, fault.port)  # the fault server holds this port
    out = run_cli("run", "--config", str(cfg))
    assert out.returncode == 1 and f"cannot listen on 127.0.0.1:{fault.port}" in out.stderr
