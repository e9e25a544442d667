"""The recover kind: vLLM's fault-tolerance retry in place first, a restart where it cannot help. vLLM's
fault tolerance needs data parallelism in external-LB mode (several ranks, each an engine and an API server),
which does not start here on 2 shared CPU cores within the suite's budget; the server here is a real HTTP
server that answers vLLM 0.32's endpoints with their exact JSON (entrypoints/serve/fault_tolerance/
api_router.py, v1/engine/core_client.py get_status, v1/fault_tolerance/engine_core_sentinel.py)."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from tests.support.clock import Clock
from tests.support.faultserver import FaultServer, Reply
from tests.support.remediation import ScriptedRuntime
from vllm_watchdog.actions.config import ActionConfig
from vllm_watchdog.actions.kinds import Act, kind_of
from vllm_watchdog.actions.pipeline.flows import FlowContext, Outcome
from vllm_watchdog.actions.runtimes.readiness import ReadyCheck
from vllm_watchdog.actions.store.actionstore import ActionStore
from vllm_watchdog.config.model import parse_config

pytestmark = pytest.mark.anyio


class Engine:
    """One rank's engine as its API server reports it; a retry heals it unless `stays` says otherwise."""

    def __init__(self, fault: FaultServer, status: str = "unhealthy", stays: bool = False) -> None:
        self.status, self.stays = status, stays
        fault.vllm_like("")
        fault.replies["/fault_tolerance/status"] = Reply(render=self.report, content_type="application/json")
        fault.replies["/fault_tolerance/apply"] = Reply(
            status=202, render=self.apply, content_type="application/json"
        )

    def report(self) -> bytes:
        engine: dict[str, Any] = {"id": 0, "status": self.status}
        if self.status == "unhealthy":
            engine["fault_info"] = "RuntimeError"
        return json.dumps({"schema_version": 1, "total_engines": 1, "engines": [engine]}).encode()

    def apply(self) -> bytes:
        if not self.stays:
            self.status = "healthy"
        body = {
            "message": "Request accepted; poll /fault_tolerance/status for updates.",
            "request_id": "0f1e",
        }
        return json.dumps(body).encode()


async def recover(
    fault: FaultServer, store: ActionStore, clock: Clock
) -> tuple[Outcome, list[str], ScriptedRuntime]:
    """Run one recover action on the target at `fault`; its outcome, steps and the runtime's calls."""
    target = parse_config(f"targets: [{{name: t, url: '{fault.url}'}}]", "c.yml", env={}).targets[0]
    action = ActionConfig(name="recover", type="recover", retry_timeout=30.0, retry_window=600.0)
    runtime = ScriptedRuntime()

    async def sleep(seconds: float) -> None:
        clock.advance(seconds)

    async with httpx.AsyncClient(trust_env=False) as client:
        ready = ReadyCheck(client, monotonic=clock, sleep=sleep)
        ctx = FlowContext(
            store, target, runtime, ready, lambda: None, clock=clock, monotonic=clock, sleep=sleep
        )  # type: ignore[arg-type]
        act = Act(action, target, {}, runtime, None, store, None)  # type: ignore[arg-type]
        kind = kind_of("recover")
        plan = await kind.plan(act)
        aid = store.begin("recover", "recover", "t", "alert", {}, False, clock())
        outcome = await kind.execute(act, plan, ctx, aid)
        store.finish(aid, outcome.outcome, clock(), outcome.reason)
    (row,) = store.history(1)
    return outcome, [s.step for s in row.steps], runtime


def posted(fault: FaultServer) -> list[Any]:
    return [json.loads(body) for method, path, body in fault.requests if path == "/fault_tolerance/apply"]


async def test_an_unhealthy_engine_is_retried_in_place_and_verified_with_the_canary(
    fault: FaultServer,
) -> None:
    Engine(fault)
    outcome, steps, runtime = await recover(fault, ActionStore(None), Clock())
    assert (outcome.outcome, outcome.reason) == (
        "succeeded",
        "retried engine(s) [0] in place: healthy and ready",
    )
    assert steps == ["fault_status", "retry", "retry_accepted", "retried"]
    assert posted(fault) == [{"instruction": "retry"}]
    assert runtime.calls == []  # no stop, no start: the weights stayed loaded
    assert any(path == "/v1/completions" for _, path, _ in fault.requests)  # verified by a canary token


async def test_a_fault_that_repeats_within_the_window_is_restarted(fault: FaultServer) -> None:
    engine, store, clock = Engine(fault), ActionStore(None), Clock()
    await recover(fault, store, clock)
    engine.status = "unhealthy"  # the engine raised again, 5 minutes later
    clock.advance(300.0)
    outcome, steps, runtime = await recover(fault, store, clock)
    assert outcome.outcome == "succeeded" and runtime.calls == ["stop", "start"]
    assert steps[:2] == ["fault_status", "restart_instead"] and len(posted(fault)) == 1
    engine.status = "unhealthy"  # and again, long after the last retry: retried in place once more
    clock.advance(3600.0)
    outcome, steps, runtime = await recover(fault, store, clock)
    assert runtime.calls == [] and len(posted(fault)) == 2


@pytest.mark.parametrize(
    ("status", "stays", "why"),
    [
        ("unhealthy", True, "the retry did not heal the engines: engine 0 unhealthy (RuntimeError)"),
        ("dead", False, "no engine reports itself unhealthy"),
        ("healthy", False, "no engine reports itself unhealthy"),  # a hang the engine does not know of
    ],
)
async def test_what_a_retry_cannot_cure_is_restarted(
    fault: FaultServer, status: str, stays: bool, why: str
) -> None:
    Engine(fault, status, stays)
    store = ActionStore(None)
    outcome, _, runtime = await recover(fault, store, Clock())
    assert (outcome.outcome, runtime.calls) == ("succeeded", ["stop", "start"])
    (row,) = store.history(1)
    assert [s.details for s in row.steps if s.step == "restart_instead"] == [{"reason": why}]
    assert len(posted(fault)) == (1 if stays else 0)


async def test_a_server_without_fault_tolerance_is_restarted(fault: FaultServer) -> None:
    fault.vllm_like("")  # /fault_tolerance/status: 404
    outcome, steps, runtime = await recover(fault, ActionStore(None), Clock())
    assert outcome.outcome == "succeeded" and runtime.calls == ["stop", "start"] and posted(fault) == []
    assert steps[:2] == ["fault_status", "restart_instead"]
