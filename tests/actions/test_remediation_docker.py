"""Docker mode end to end, through a running watchdog, on one real vLLM container with ngram speculation:
graceful restart on an alert (the container's EngineCore SIGSTOPped first: its incident bundle holds the
Python stacks of both processes, read from the host, the `docker logs` tail and importable metrics), a
flapping alert inside the cooldown, a rule on the draft acceptance rate that disables the draft, a forced
failure that rolls back, and enable_draft putting the exact spec back.

Each step that starts vLLM costs a real start (45-110 s on 2 cores), so the restart budget is left to the
stub containers of tests/chaos/test_engine.py (a crash loop in Docker mode stopped at the budget, with its
alert), where a restart costs a second."""

from __future__ import annotations

import asyncio
import json
import os
import signal
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import docker
import httpx
import pytest

from tests.service.test_daemon import wait_for
from tests.support.apitargets import targets
from tests.support.configs import AUTH, target, write_config
from tests.support.docker_engine import VllmRuntime, remove_container, unique_name, wait_http
from tests.support.faultserver import FaultServer
from tests.support.incidents import bundle, part_status, promtool_import, stack_functions
from tests.support.vllm_server import free_port
from vllm_watchdog.actions.incidents.procs import cmdline, process_tree
from vllm_watchdog.service.daemon import Daemon, DaemonOptions

pytestmark = [pytest.mark.anyio, pytest.mark.vllm]
SPEC = '{"method":"ngram","num_speculative_tokens":4,"prompt_lookup_max":4}'
RULES = """
groups:
  - name: spec
    rules:
      - alert: VLLMSpecAcceptanceLow   # a test threshold: any real acceptance ratio is below 1.01
        expr: >
          rate(vllm:spec_decode_num_accepted_tokens_total[20s])
            / rate(vllm:spec_decode_num_draft_tokens_total[20s]) < 1.01
        labels: {severity: warning}
"""


def _config(tmp_path: Path, port: int, container: str, vport: int, hook: str) -> Path:
    (tmp_path / "spec.rules.yml").write_text(RULES)
    # ready_timeout bounds a hang, not a speed: a container's vLLM took over 4 minutes at load average 25
    fast = "startup_grace: 0s, drain_timeout: 5s, stop_timeout: 30s, ready_timeout: 10m"
    return write_config(
        tmp_path,
        target(f"http://127.0.0.1:{vport}", name="vllm-d", container=container),
        port=port,
        rest=f"""rule_files: [spec.rules.yml]
routes:
  - {{match: {{alertname: VLLMEngineHung}}, actions: [restart]}}
  - {{match: {{alertname: VLLMSpecAcceptanceLow}}, actions: [draft_off]}}
actions:
  restart: {{type: restart, cooldown: 15m, {fast}}}
  draft_off: {{type: disable_draft, {fast}}}
  draft_on: {{type: enable_draft, {fast}}}
  broken: {{type: reconfigure, set: {{--not-a-vllm-flag: "1"}}, startup_grace: 0s, stop_timeout: 30s, ready_timeout: 10m}}
notifiers:
  - {{type: webhook, url: "{hook}"}}
""",
    )


def _engine_core(client: Any, name: str) -> tuple[int, int]:
    """(API server, EngineCore) of the container, as host pids (its first process is docker-init)."""
    tree = process_tree(int(client.containers.get(name).attrs["State"]["Pid"]))
    (server,) = [p for p in tree if cmdline(p)[1:3] == ["-m", "vllm.entrypoints.openai.api_server"]]
    (engine,) = [p for p in tree if cmdline(p)[:1] == ["VLLM::EngineCore"]]
    return server, engine


@pytest.fixture
async def stack(
    tmp_path: Path,
    fault: FaultServer,
    docker_client: Any,
    hostroot_image: str,
    vllm_runtime: VllmRuntime,
) -> AsyncIterator[tuple[str, str, int, Any]]:
    """A vLLM container with ngram speculation, and a watchdog acting on it."""
    name, vport, port = unique_name("vllm-e2e"), free_port(), free_port()
    fault.set("/hook", b"ok")
    kwargs = vllm_runtime.create_kwargs(
        hostroot_image, name, vport, ["--max-num-seqs", "2", "--speculative-config", SPEC]
    )
    d: Daemon | None = None
    task: asyncio.Task[None] | None = None
    try:
        docker_client.containers.run(**kwargs)
        await asyncio.to_thread(wait_http, docker_client, name, f"http://127.0.0.1:{vport}/health", 600)
        cfg = _config(tmp_path, port, name, vport, f"{fault.url}/hook")
        d = Daemon.load(DaemonOptions(str(cfg), env={}, docker_client=lambda: docker.from_env(timeout=120)))
        ready = asyncio.Event()
        task = asyncio.create_task(d.run(ready))
        await asyncio.wait_for(ready.wait(), 30)
        yield f"http://127.0.0.1:{port}", name, vport, docker_client
    finally:
        if d is not None and task is not None:
            d.stop()
            await asyncio.wait_for(task, 15)
        for ref in (name, f"{name}.watchdog-previous"):
            remove_container(docker_client, ref)


async def _alert(c: httpx.AsyncClient, base: str, name: str) -> None:
    body = {"alerts": [{"status": "firing", "labels": {"alertname": name, "instance": "vllm-d"}}]}
    resp = await c.post(base + "/api/v1/alertmanager", json=body, headers=AUTH)
    assert resp.status_code == 200, resp.text


async def _settled(
    c: httpx.AsyncClient, base: str, action: str, count: int, limit: float = 700
) -> list[dict[str, Any]]:
    """The audit rows of `action` once there are `count` of them and none is running."""

    def done(j: Any) -> bool:
        rows = [h for h in j["data"]["history"] if h["action"] == action]
        return len(rows) >= count and all(r["outcome"] != "running" for r in rows)

    status: Any = await wait_for(c, base + "/api/v1/actions", done, limit)
    return [h for h in status["data"]["history"] if h["action"] == action]


async def _complete(vport: int, tokens: int = 1) -> None:
    """A completion; one token comes from the prefill alone, so it proposes no drafts and the acceptance
    rule stays quiet; longer ones on a repetitive prompt make ngram speculation propose and accept."""
    prompt = "one two three one two three one two three"
    body = {
        "model": "tiny-llama",
        "prompt": prompt,
        "max_tokens": tokens,
        "ignore_eos": True,
        "temperature": 0,
    }
    async with httpx.AsyncClient(timeout=120) as c:
        resp = await c.post(f"http://127.0.0.1:{vport}/v1/completions", json=body)
        assert resp.status_code == 200, resp.text


def _state(client: Any, name: str) -> dict[str, Any]:
    return dict(client.containers.get(name).attrs)


async def test_restart_cooldown_draft_rollback(
    stack: tuple[str, str, int, Any], fault: FaultServer, tmp_path: Path
) -> None:
    base, name, vport, client = stack
    original = _state(client, name)
    async with httpx.AsyncClient(timeout=30) as c:
        # 1. The engine hangs (its EngineCore SIGSTOPped); an alert restarts the container gracefully, after
        #    collecting the evidence from the host; it serves again.
        await wait_for(c, base + "/api/v1/targets", lambda j: targets(j)[0]["up"], 60)  # series in the store
        server, engine = _engine_core(client, name)
        os.kill(engine, signal.SIGSTOP)
        await _alert(c, base, "VLLMEngineHung")
        (restart,) = await _settled(c, base, "restart", 1)
        assert restart["outcome"] == "succeeded", restart
        assert [s["step"] for s in restart["steps"]][:3] == ["drain", "drained", "stop"]
        after = _state(client, name)
        assert after["Id"] == original["Id"] and after["State"]["StartedAt"] != original["State"]["StartedAt"]
        await _complete(vport)
        files = bundle(tmp_path / "state", restart["details"]["incident"])
        stacks = stack_functions(files)
        assert "run_busy_loop" in stacks[engine] and stacks[server], (part_status(files), stacks)
        assert "INFO" in files["log.txt"].decode()  # docker logs of the container
        promtool_import(files["metrics.om"], tmp_path / "promtool")

        # 2. The alert flaps inside the cooldown: no second restart.
        await _alert(c, base, "VLLMEngineHung")
        rows = await _settled(c, base, "restart", 2, limit=30)
        assert rows[0]["outcome"] == "skipped" and "cooldown" in rows[0]["reason"]
        assert _state(client, name)["State"]["StartedAt"] == after["State"]["StartedAt"]

        # 3. Speculative traffic makes the acceptance rule fire; disable_draft relaunches without the spec.
        await wait_for(c, base + "/api/v1/targets", lambda j: targets(j)[0]["up"], 60)
        traffic = [asyncio.create_task(_complete(vport, tokens=48)) for _ in range(4)]
        (off,) = await _settled(c, base, "draft_off", 1)
        await asyncio.gather(*traffic, return_exceptions=True)
        assert off["outcome"] == "succeeded", off
        relaunched = _state(client, name)
        assert relaunched["Id"] != original["Id"]
        assert "--speculative-config" not in relaunched["Config"]["Cmd"]
        assert [
            a for a in original["Config"]["Cmd"] if a not in ("--speculative-config", SPEC)
        ] == relaunched["Config"]["Cmd"]
        for key in ("Image", "Env", "Entrypoint", "Labels", "WorkingDir", "User"):
            assert relaunched["Config"][key] == original["Config"][key], key
        for key in (
            "Binds",
            "NetworkMode",
            "IpcMode",
            "ShmSize",
            "Ulimits",
            "RestartPolicy",
            "DeviceRequests",
        ):
            assert relaunched["HostConfig"][key] == original["HostConfig"][key], key
        await _complete(vport)
        assert "vllm:spec_decode_num_drafts" not in (await c.get(f"http://127.0.0.1:{vport}/metrics")).text
        assert _state(client, name)["Id"] == relaunched["Id"]  # the alert resolved; no further relaunch

        # 4. A forced failure (vLLM rejects the flag) rolls back to the very same container.
        run = await c.post(
            base + "/api/v1/actions/broken/run", json={"wait": True}, headers=AUTH, timeout=1300
        )
        result = run.json()["result"]
        assert result["outcome"] == "rolled_back", result
        back = _state(client, name)
        assert back["Id"] == relaunched["Id"]  # the very same container, as it was
        assert (back["Config"], back["HostConfig"]) == (relaunched["Config"], relaunched["HostConfig"])
        await _complete(vport)

        # 5. enable_draft puts the exact original spec back.
        run = await c.post(
            base + "/api/v1/actions/draft_on/run", json={"wait": True}, headers=AUTH, timeout=700
        )
        assert run.json()["result"]["outcome"] == "succeeded", run.text
        assert _state(client, name)["Config"]["Cmd"] == original["Config"]["Cmd"]
        await _complete(vport)

    events = [json.loads(b) for _, path, b in fault.requests if path == "/hook"]
    outcomes = {(e["event"]["action"], e["event"]["outcome"]) for e in events if e.get("type") == "action"}
    assert {("restart", "succeeded"), ("draft_off", "succeeded"), ("broken", "rolled_back")} <= outcomes
