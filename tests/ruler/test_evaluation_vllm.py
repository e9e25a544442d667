"""End to end: an in-process rule fires while a real vLLM's queue is flooded, and resolves afterwards."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.service.test_daemon import wait_for
from tests.support.apitargets import targets
from tests.support.configs import target, watchdog_yaml
from tests.support.vllm_server import VllmServer, free_port, holding_completion
from vllm_watchdog.service.daemon import Daemon, DaemonOptions

pytestmark = [pytest.mark.anyio, pytest.mark.vllm]
# The queue is held, not raced: one long completion (tests.support.vllm_server.holding_completion) runs in the
# engine (--max-num-seqs 1) until the test has seen the alert fire, while QUEUED short ones wait behind it; then
# the test hangs up on the long one (vLLM aborts it), the short ones run and the queue empties. The alert needs
# one scrape and the rule's 2 s `for:`, far less than the long one lasts.
QUEUED = 4  # waiting behind the held request: over the rule's 2
QUEUED_TOKENS = 16
RULES = """
groups:
  - name: queue
    rules:
      - alert: QueueBacklog
        expr: vllm:num_requests_waiting > 2
        for: 2s
        labels: {severity: warning}
        annotations:
          summary: "{{ $labels.instance }} has {{ $value }} requests waiting"
"""


def firing(alerts: Any, name: str) -> list[dict[str, Any]]:
    return [
        a for a in alerts["data"]["alerts"] if a["labels"]["alertname"] == name and a["state"] == "firing"
    ]


async def _complete(client: httpx.AsyncClient, url: str, seed: int) -> int:
    body = {
        "model": "tiny-llama",
        "prompt": "one two three",
        "max_tokens": QUEUED_TOKENS,
        "temperature": 1.0,
        "seed": seed,
        "ignore_eos": True,
    }
    return (await client.post(url + "/v1/completions", json=body, timeout=180)).status_code


async def _hold(client: httpx.AsyncClient, url: str, running: asyncio.Event, release: asyncio.Event) -> int:
    """A long completion, streamed: `running` is set at its first token (the engine runs it), and the client
    hangs up once `release` is set (vLLM aborts it). Its status."""
    body = holding_completion("one two three", seed=1000)
    async with client.stream("POST", url + "/v1/completions", json=body, timeout=180) as resp:
        async for line in resp.aiter_lines():
            if line.startswith("data: "):
                running.set()
            if release.is_set():
                break
        return resp.status_code


async def test_rule_fires_on_a_real_queue_and_resolves(tmp_path: Path, vllm_server: VllmServer) -> None:
    (tmp_path / "queue.rules.yml").write_text(RULES)
    port = free_port()
    cfg = tmp_path / "c.yml"
    cfg.write_text(
        watchdog_yaml(
            target(vllm_server.url),
            port=port,
            token=None,
            state_dir=tmp_path / "state",
            rest="rule_files: [queue.rules.yml]\n",
        )
    )
    d = Daemon.load(DaemonOptions(str(cfg), env={}))
    ready = asyncio.Event()
    task = asyncio.create_task(d.run(ready))
    await asyncio.wait_for(ready.wait(), 30)
    base = f"http://127.0.0.1:{port}"
    flood: list[asyncio.Task[int]] = []
    try:
        async with httpx.AsyncClient(timeout=10) as client:
            await wait_for(client, base + "/api/v1/targets", lambda j: targets(j)[0]["up"], limit=30)
            assert (await client.get(base + "/api/v1/alerts")).json()["data"]["alerts"] == []
            started = time.time()
            alerts: Any = None
            # A flood lasts as long as the held completion (tens of seconds). On a machine loaded by other real
            # vLLMs, CI saw every scrape of a flood time out, so the rule never saw the queue: a missed flood is
            # released and made again, up to three times, instead of waiting out the test's bound on a spent one.
            for _ in range(3):
                running, release = asyncio.Event(), asyncio.Event()
                wave = [asyncio.create_task(_hold(client, vllm_server.url, running, release))]
                await asyncio.wait_for(running.wait(), 120)  # the long one runs: what follows waits behind it
                wave += [asyncio.create_task(_complete(client, vllm_server.url, i)) for i in range(QUEUED)]
                flood += wave
                try:
                    alerts = await wait_for(
                        client, base + "/api/v1/alerts", lambda j: firing(j, "QueueBacklog"), 60
                    )
                    break
                except AssertionError:
                    release.set()
                    await asyncio.gather(*wave, return_exceptions=True)
            if alerts is None:
                listing = (await client.get(base + "/api/v1/targets")).json()
                found = (await client.get(base + "/api/v1/samples?match=vllm:num_requests_waiting")).json()
                waiting = [
                    max((float(v) for _, v in s["samples"] if v != "stale"), default=None)
                    for s in found["data"]
                ]
                raise AssertionError(
                    f"no alert; targets: {listing}; most waiting seen: {waiting}; {vllm_server.log_tail()}"
                )
            (alert,) = firing(alerts, "QueueBacklog")
            hostport = vllm_server.url.removeprefix("http://").rstrip("/")  # Prometheus' instance label
            assert alert["labels"]["instance"] == hostport and alert["labels"]["severity"] == "warning"
            assert alert["labels"]["job"] == "vllm" and alert["labels"]["target"] == "vllm-0"
            assert alert["annotations"]["summary"].startswith(f"{hostport} has ")
            assert float(alert["value"]) > 2
            metrics = (await client.get(base + "/metrics")).text
            assert 'ALERTS{alertname="QueueBacklog",alertstate="firing"' in metrics
            rules = (await client.get(base + "/api/v1/rules")).json()
            (rule,) = rules["data"]["groups"][0]["rules"]
            assert rule["health"] == "ok" and rule["state"] == "firing"
            print(f"firing {time.time() - started:.1f}s after the flood began")
            release.set()
            assert all(code == 200 for code in await asyncio.gather(*flood))
            await wait_for(
                client, base + "/api/v1/alerts", lambda j: not j["data"]["alerts"], limit=60
            )  # resolved alerts leave the active list
            assert 'alertstate="firing"' not in (await client.get(base + "/metrics")).text
    finally:
        for request in flood:  # a failed test leaves no request behind in the shared server
            request.cancel()
        d.stop()
        await asyncio.wait_for(task, 10)
