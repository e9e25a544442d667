"""The daemon against a real vLLM 0.32 (CPU build, tiny random Llama) shared by the session.

The outage is a cut loopback proxy between the daemon and vLLM, not a killed server: the session's vLLM keeps
serving the other tests (a start costs 45 CPU-seconds), and a real vLLM killed and started again under the
watchdog's eyes is tests/chaos/test_engine.py's SIGKILL."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.service.test_daemon import wait_for
from tests.support.apitargets import targets
from tests.support.configs import target, watchdog_yaml
from tests.support.tcpproxy import TcpProxy
from tests.support.vllm_server import VllmServer, free_port
from vllm_watchdog.service.daemon import Daemon, DaemonOptions

pytestmark = [pytest.mark.anyio, pytest.mark.vllm]


def last(series: dict[str, Any]) -> str:
    return str(series["samples"][-1][1])


async def test_daemon_scrapes_real_vllm_and_sees_it_go_away_and_come_back(
    tmp_path: Path, vllm_server: VllmServer
) -> None:
    port = free_port()
    proxy = TcpProxy(vllm_server.port)
    cfg = tmp_path / "c.yml"
    cfg.write_text(
        watchdog_yaml(
            target(proxy.url, canary={"interval": "2s", "timeout": "20s"}),
            port=port,
            token=None,
            global_settings=None,  # the default intervals
            rest="rule_files: ['bundled:vllm.rules.yml']\n",
        )
    )
    d = Daemon.load(DaemonOptions(str(cfg), env={}))
    ready = asyncio.Event()
    task = asyncio.create_task(d.run(ready))
    await asyncio.wait_for(ready.wait(), 30)
    base = f"http://127.0.0.1:{port}"
    series_url = base + "/api/v1/samples"
    try:
        async with httpx.AsyncClient(timeout=10) as client:
            answer = await wait_for(
                client,
                base + "/api/v1/targets",
                lambda j: targets(j)[0]["up"] and targets(j)[0]["canary"]["success"],
                limit=90,
            )
            assert targets(answer)[0]["health"]["up"] is True
            running = (await client.get(series_url, params={"match": "vllm:num_requests_running"})).json()
            (series,) = running["data"]
            labels = series["labels"]
            hostport = proxy.url.removeprefix("http://")  # Prometheus' instance of the scrape address
            assert (labels["job"], labels["instance"], labels["target"]) == ("vllm", hostport, "vllm-0")
            assert labels["model_name"] == "tiny-llama" and last(series) == "0.0"
            # only the families the bundled rules read are stored
            assert (await client.get(series_url, params={"match": "vllm:request_params_n_bucket"})).json()[
                "data"
            ] == []
            ttft = (
                await client.get(series_url, params={"match": "vllm:time_to_first_token_seconds_bucket"})
            ).json()
            assert len(ttft["data"]) > 5

            proxy.cut()  # a partition: connections hang, scrapes and probes time out
            await wait_for(
                client,
                series_url + "?match=up",
                lambda j: last(j["data"][0]) == "0.0",
                limit=30,
            )
            gone = (await client.get(series_url, params={"match": "vllm:num_requests_running"})).json()
            assert last(gone["data"][0]) == "stale"
            await wait_for(
                client,
                series_url + "?match=vllm_watchdog_health_up",
                lambda j: last(j["data"][0]) == "0.0",
                limit=30,
            )

            proxy.heal()
            await wait_for(
                client,
                series_url + "?match=vllm:num_requests_running",
                lambda j: last(j["data"][0]) == "0.0",
                limit=60,
            )
            await wait_for(
                client,
                base + "/api/v1/targets",
                lambda j: targets(j)[0]["up"] and targets(j)[0]["canary"]["success"],
                limit=90,
            )
    finally:
        d.stop()
        await asyncio.wait_for(task, 10)
        proxy.close()


def test_targets_command_against_real_vllm(tmp_path: Path, vllm_server: VllmServer) -> None:
    cfg = tmp_path / "c.yml"
    cfg.write_text(
        watchdog_yaml(
            target(vllm_server.url, canary={"timeout": "30s"}),
            target("http://127.0.0.1:9", name="nothing-here"),
            token=None,
            global_settings=None,
        )
    )
    out = subprocess.run(
        [sys.executable, "-m", "vllm_watchdog", "targets", "--config", str(cfg)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 1, out.stderr  # one target is down (exitcodes.py: problems found)
    header, real, down = out.stdout.splitlines()
    assert header.split()[:4] == ["TARGET", "URL", "UP", "SAMPLES"]
    cols = real.split()
    assert cols[0] == "vllm-0" and cols[2] == "1" and int(cols[3]) > 400 and "ok" in real
    assert down.split()[:3] == ["nothing-here", "http://127.0.0.1:9", "0"] and "ConnectError" in down
