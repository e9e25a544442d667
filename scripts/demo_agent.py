#!/usr/bin/env python3
"""The demo's scripted agent workload (scripts/demo.sh runs it): four faults, one after another, each bounded.

1. flood: 40 clients send completions back to back through the gateway; vLLM (4 sequences) queues the rest
   -> VLLMQueueSaturated -> throttle-gateway lowers the gateway's in-flight cap.
2. loop: one session repeats the same tool call -> GatewaySessionToolCallLoop -> session-breaker (429s).
3. spec: JSON tool-call prompts sampled at temperature 0.05, where ngram drafts are rarely accepted
   -> VLLMSpecDecodeAcceptanceLow -> disable-draft relaunches vLLM without --speculative-config, and the
   restore puts it back once the alert has been resolved for restore_after.
4. hang: SIGSTOP on vLLM's EngineCore -> VLLMEngineHung (canary fails, no engine steps) -> graceful-restart.

Each phase waits for its expected action in the audit log (GET /api/v1/actions) up to a deadline; the result
of every phase goes to --report (JSON). Exit 0 only if every phase saw its action succeed. Prompts are
synthetic and never logged. While it runs, the `vllm-watchdog top` table is redrawn on a terminal, and printed
after each phase otherwise.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import signal
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import httpx
from demo_observe import Observer, Phase
from demo_screen import Screen

MODEL = "tiny-llama"
REPETITIVE = "the cat sat on the mat and the dog sat on the log. " * 12


class Agent:
    """Drives the phases against the gateway and reads outcomes from the watchdog's API."""

    def __init__(self, api: str, gateway: str, state_dir: Path, screen: Screen) -> None:
        self.api = api.rstrip("/")
        self.gateway = gateway.rstrip("/")
        self.screen = screen
        self.client = httpx.AsyncClient(
            timeout=httpx.Timeout(120.0, connect=5.0),
            limits=httpx.Limits(max_connections=80),
            trust_env=False,
        )
        self.watch = Observer(self.client, api, state_dir)

    # -- requests --------------------------------------------------------------------------------
    async def complete(
        self, body: dict[str, Any], session: str | None = None, path: str = "/v1/completions"
    ) -> int:
        """One request through the gateway; its status (0 if the connection failed)."""
        headers = {"X-Session-ID": session} if session else {}
        try:
            resp = await self.client.post(self.gateway + path, json=body, headers=headers)
        except httpx.HTTPError:
            return 0
        return resp.status_code

    # -- phases ------------------------------------------------------------------------------------
    async def flood(self, phase: Phase, limit: float) -> None:
        """40 clients, each sending completions back to back: vLLM runs 4 and queues the rest until the
        throttle moves the queue into the gateway."""
        body = {"model": MODEL, "prompt": REPETITIVE, "max_tokens": 128, "temperature": 0}
        before = (await self.watch.gateway_status())["limit"]
        phase.fault_at = time.time()
        statuses: list[int] = []

        async def client() -> None:
            while time.time() < phase.fault_at + limit:
                statuses.append(await self.complete(body))

        tasks = [asyncio.create_task(client()) for _ in range(40)]
        self.screen.say(
            f"flood: 40 clients send completions back to back (gateway cap {before}, vLLM runs 4)"
        )
        row = await self.watch.wait_action(
            phase, "VLLMQueueSaturated", lambda r: r["type"] == "throttle", phase.fault_at + limit
        )
        if self.watch.record(phase, row, "throttle"):
            await asyncio.sleep(5)  # the queue now waits in the gateway: the table shows it
            self.screen.snapshot()
            after = (await self.watch.gateway_status())["limit"]
            phase.extra.update(cap_before=before, cap_after=after)
            phase.ok = after < before
            phase.detail = f"{row['action'] if row else ''}: {row['reason'] if row else ''}"
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        phase.extra["answered"] = {str(code): statuses.count(code) for code in sorted(set(statuses))}

    async def loop(self, phase: Phase, limit: float) -> None:
        """One session sends the same tool-call step again and again until it is refused."""
        call = {
            "id": "call_1",
            "type": "function",
            "function": {"name": "search", "arguments": '{"q": "vllm"}'},
        }
        body: dict[str, Any] = {
            "model": MODEL,
            "max_tokens": 8,
            "temperature": 0,
            "messages": [
                {"role": "user", "content": "find the vllm docs"},
                {"role": "assistant", "content": None, "tool_calls": [call]},
                {"role": "tool", "tool_call_id": "call_1", "content": "no results"},
            ],
        }
        phase.fault_at = time.time()
        self.screen.say("loop: session agent-loop repeats the same tool call")
        sent, refused = 0, False
        deadline = phase.fault_at + limit
        while time.time() < deadline and sent < 40:
            status = await self.complete(body, "agent-loop", "/v1/chat/completions")
            sent += 1
            if status == 429:
                refused = True
                break
            await asyncio.sleep(0.5)
        row = await self.watch.wait_action(
            phase, "GatewaySessionToolCallLoop", lambda r: r["type"] == "throttle_session", deadline
        )
        other = await self.complete(
            body | {"messages": body["messages"][:1]}, "agent-ok", "/v1/chat/completions"
        )
        phase.extra.update(sent=sent, refused=refused, other_session_status=other)
        if self.watch.record(phase, row, "throttle_session"):
            phase.ok = refused and other == 200
            phase.detail = (
                f"{row['reason'] if row else ''}; request {sent} got 429, another session got {other}"
            )

    async def spec(self, phase: Phase, limit: float, restore_limit: float) -> None:
        """JSON tool-call prompts, lightly sampled: ngram drafts are proposed and rejected."""
        rnd = random.Random(6)
        phase.fault_at = time.time()
        self.screen.say("spec: JSON tool-call traffic at temperature 0.05 (ngram drafts get rejected)")
        started = asyncio.Event()

        async def worker(i: int) -> None:
            n = 0
            while not started.is_set() and time.time() < phase.fault_at + limit:
                await self.complete(tool_json_body(rnd, seed=i * 1000 + n), f"agent-json-{i}")
                n += 1

        workers = [asyncio.create_task(worker(i)) for i in range(4)]
        row = await self.watch.wait_action(
            phase,
            "VLLMSpecDecodeAcceptanceLow",
            lambda r: r["type"] == "disable_draft" and r["trigger"] == "alert",
            phase.fault_at + limit,
            done=False,
        )
        started.set()
        for w in workers:
            w.cancel()
        await asyncio.gather(*workers, return_exceptions=True)
        if row is not None and row["outcome"] == "running":
            self.screen.say(f"spec: {row['action']} is relaunching vLLM without the draft")
            rid = row["id"]
            row = await self.watch.wait_action(
                phase, "VLLMSpecDecodeAcceptanceLow", lambda r: r["id"] == rid, time.time() + limit
            )
        if not self.watch.record(phase, row, "disable_draft"):
            return
        args = self.watch.server_args()
        phase.extra["draft_off_args"] = "--speculative-config" not in args
        self.screen.say(
            f"spec: vLLM relaunched without --speculative-config ({row['reason'] if row else ''}); "
            "waiting for the restore"
        )
        self.screen.snapshot()
        restore = await self.watch.wait_action(
            phase,
            "VLLMSpecDecodeAcceptanceLow",
            lambda r: r["type"] == "disable_draft" and r["trigger"] == "restore",
            time.time() + restore_limit,
        )
        phase.extra["restore"] = (
            None
            if restore is None
            else {k: restore[k] for k in ("started_at", "finished_at", "outcome", "reason")}
        )
        restored = restore is not None and restore["outcome"] == "succeeded"
        phase.extra["draft_back_args"] = restored and "--speculative-config" in self.watch.server_args()
        phase.ok = bool(phase.extra["draft_off_args"] and phase.extra["draft_back_args"])
        why = restore["reason"] if restore else "no restore in time"
        phase.detail = f"draft off, then back on by the restore ({why})"

    async def hang(self, phase: Phase, limit: float) -> None:
        """SIGSTOP the EngineCore: /health stays 200, nothing is generated."""
        old_server = self.watch.server_pid()
        engine = self.watch.engine_core()
        if engine is None:
            phase.detail = "no VLLM::EngineCore process found in the vLLM API server's session"
            return
        phase.fault_at = time.time()
        os.kill(engine, signal.SIGSTOP)
        self.screen.say(f"hang: SIGSTOP on VLLM::EngineCore (pid {engine}); /health still answers 200")
        body = {"model": MODEL, "prompt": REPETITIVE, "max_tokens": 16, "temperature": 0}
        stuck = asyncio.create_task(self.complete(body, "agent-hang"))
        try:
            row = await self.watch.wait_action(
                phase,
                "VLLMEngineHung",
                lambda r: r["type"] == "restart" and r["trigger"] == "alert",
                phase.fault_at + limit,
                done=False,
            )
            if row is not None and row["outcome"] == "running":
                self.screen.say(f"hang: {row['action']} is draining the gateway and restarting vLLM")
                self.screen.snapshot()
                rid = row["id"]
                row = await self.watch.wait_action(
                    phase, "VLLMEngineHung", lambda r: r["id"] == rid, phase.fault_at + limit
                )
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.kill(engine, signal.SIGCONT)  # whatever happened, leave nothing stopped behind
        try:
            stuck_status = await asyncio.wait_for(stuck, 30)
        except TimeoutError:
            stuck_status = -1  # still unanswered 30 s after the restart
        if not self.watch.record(phase, row, "restart"):
            return
        new_server = self.watch.server_pid()
        check = await self.complete(body, "agent-after")
        phase.extra.update(
            old_server=old_server, new_server=new_server, after_status=check, stuck=stuck_status
        )
        phase.ok = new_server != old_server and check == 200
        phase.detail = f"{row['reason'] if row else ''}; a completion after it: HTTP {check}"


def tool_json_body(rnd: random.Random, seed: int) -> dict[str, Any]:
    """A prompt of earlier JSON tool calls asking for the next one (synthetic, never logged)."""
    names = ["search", "read_file", "run_shell", "http_get"]
    calls = []
    for _ in range(4):
        q = "".join(rnd.choice("abcdefghijklmnopqrstuvwxyz0123456789") for _ in range(rnd.randint(5, 20)))
        calls.append({"name": rnd.choice(names), "arguments": {"q": q, "n": rnd.randint(1, 999)}})
    prompt = (
        "Tool calls so far:\n"
        + "\n".join(json.dumps(c) for c in calls)
        + '\nNext tool call as JSON:\n{"name": "'
    )
    return {"model": MODEL, "prompt": prompt, "max_tokens": 48, "temperature": 0.05, "seed": seed}


async def run(args: argparse.Namespace) -> tuple[int, dict[str, Any]]:
    screen = Screen(args.api, live=sys.stdout.isatty() and not args.plain)
    agent = Agent(args.api, args.gateway, Path(args.state_dir), screen)
    phases = [
        Phase("flood", "VLLMQueueSaturated -> throttle-gateway"),
        Phase("loop", "GatewaySessionToolCallLoop -> session-breaker"),
        Phase("spec", "VLLMSpecDecodeAcceptanceLow -> disable-draft, restored later"),
        Phase("hang", "VLLMEngineHung -> graceful-restart"),
    ]
    runs = {
        "flood": lambda p: agent.flood(p, 120),
        "loop": lambda p: agent.loop(p, 60),
        "spec": lambda p: agent.spec(p, 180, 240),
        "hang": lambda p: agent.hang(p, 180),
    }
    screen.start()
    started = time.time()
    try:
        for i, phase in enumerate(phases, 1):
            t0 = time.time()
            screen.say(f"phase {i}/4 {phase.name}: expect {phase.expect}")
            try:
                await runs[phase.name](phase)
            except (httpx.HTTPError, OSError, KeyError, ValueError) as exc:
                phase.detail = f"{type(exc).__name__}: {exc}"
            mark = "OK  " if phase.ok else "FAIL"
            screen.say(f"{mark} {phase.name} ({time.time() - t0:.0f}s): {phase.detail}")
            screen.say(f"     {phase.timings()}")
            screen.snapshot()
            await asyncio.sleep(2)
    finally:
        screen.stop()
        await agent.client.aclose()
    report = {"started": started, "seconds": time.time() - started, "phases": [asdict(p) for p in phases]}
    return (0 if all(p.ok for p in phases) else 1), report


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--api", default="http://127.0.0.1:9460")
    parser.add_argument("--gateway", default="http://127.0.0.1:8080")
    parser.add_argument(
        "--state-dir", required=True, help="the watchdog's state_dir (process-mode state file)"
    )
    parser.add_argument("--report", required=True, help="where to write the phases' results (JSON)")
    parser.add_argument("--plain", action="store_true", help="no live table, even on a terminal")
    args = parser.parse_args()
    rc, report = asyncio.run(run(args))
    Path(args.report).write_text(json.dumps(report, indent=2))
    return rc


if __name__ == "__main__":
    sys.exit(main())
