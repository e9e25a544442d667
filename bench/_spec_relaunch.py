"""Part of bench/speculation.py: the draft_schedule action on a real CPU vLLM in process mode, a relaunch with
a schedule and the rollback of a schedule vLLM refuses, through the kind's own plan and the relaunch flow."""

from __future__ import annotations

import json
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.support.vllm_server import NGRAM_SPEC, free_port  # noqa: E402
from vllm_watchdog.actions.config import ActionConfig  # noqa: E402
from vllm_watchdog.actions.kinds import Act, kind_of  # noqa: E402
from vllm_watchdog.actions.pipeline.flows import FlowContext  # noqa: E402
from vllm_watchdog.actions.runtimes.process import ProcessRuntime  # noqa: E402
from vllm_watchdog.actions.runtimes.readiness import ReadyCheck  # noqa: E402
from vllm_watchdog.actions.runtimes.speculative import SCHEDULE_KEY, read_config  # noqa: E402
from vllm_watchdog.actions.store.actionstore import ActionStore  # noqa: E402
from vllm_watchdog.config.targets import TargetConfig  # noqa: E402

READY = 600.0


async def relaunch_proof(schedule: str) -> None:
    """Start vLLM (process mode), relaunch it with `schedule`, then try a refused one: rolled back?"""
    port = free_port()
    command = ("bash", str(ROOT / "scripts" / "serve-vllm.sh"), "--port", str(port), "--max-num-seqs", "64")
    command = (*command, "--speculative-config", NGRAM_SPEC)
    tmp = tempfile.mkdtemp(prefix="bench-spec-relaunch-")
    runtime = ProcessRuntime("bench", command, env={}, state_dir=tmp, log_path=f"{tmp}/vllm.log")
    target = TargetConfig(name="bench", url=f"http://127.0.0.1:{port}", command=command)
    store = ActionStore(None)
    action = ActionConfig("draft-schedule", "draft_schedule", ready_timeout=READY, drain_timeout=5.0)
    kind = kind_of("draft_schedule")
    async with httpx.AsyncClient() as client:
        ctx = FlowContext(store, target, runtime, ReadyCheck(client), running_requests=lambda: None)
        try:
            started = time.monotonic()
            await runtime.start()
            ok, why = await ctx.wait_ready(READY)
            print(
                f"\nrelaunch proof: vLLM (process mode) ready {ok} in {time.monotonic() - started:.0f}s {why}"
            )
            act = Act(action, target, {"schedule": schedule}, runtime, None, store, None)
            plan = await kind.plan(act)
            print(f"  plan: {plan.describe or plan.skip}")
            started = time.monotonic()
            aid = store.begin(
                action.name, action.type, target.name, "bench", {"schedule": schedule}, False, time.time()
            )
            outcome = await kind.execute(act, plan, ctx, aid)
            config = read_config((await runtime.launch()).args) or {}
            print(
                f"  relaunch: {outcome.outcome} in {time.monotonic() - started:.0f}s ({outcome.reason});"
                f" running {SCHEDULE_KEY}={json.dumps(config.get(SCHEDULE_KEY))}"
            )
            again = await kind.plan(act)
            print(f"  the same alert again: {again.skip or again.describe}")
            await _refused(act, ctx, kind)
        finally:
            await runtime.stop(30.0)


async def _refused(act: Act, ctx: FlowContext, kind: object) -> None:
    """A schedule vLLM refuses at start (first range at 2): the flow rolls back to the running server."""
    runtime = act.runtime
    assert runtime is not None
    other = Act(act.action, act.target, {"schedule": "1-3:2,4-65536:0"}, runtime, None, act.store, None)
    plan = await kind.plan(other)  # type: ignore[attr-defined]
    assert plan.new is not None, plan.skip
    before = (await runtime.launch()).args
    config = read_config(plan.new.args) or {}
    config[SCHEDULE_KEY] = [[2, 3, 2], [4, 65536, 0]]
    args = [json.dumps(config) if a.startswith("{") and SCHEDULE_KEY in a else a for a in plan.new.args]
    bad = replace(plan, new=plan.new.with_args(args))
    started = time.monotonic()
    aid = act.store.begin(
        "draft-schedule", "draft_schedule", act.target.name, "bench", {}, False, time.time()
    )
    outcome = await kind.execute(other, bad, ctx, aid)  # type: ignore[attr-defined]
    after = (await runtime.launch()).args
    ok, why = await ctx.wait_ready(60.0)
    print(
        f"  refused schedule: {outcome.outcome} in {time.monotonic() - started:.0f}s ({outcome.reason[:140]})"
        f"; the old launch back {after == before}, ready {ok} {why}"
    )
