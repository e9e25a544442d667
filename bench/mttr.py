"""Benchmark: time to recover, from a fault in vLLM's engine to the first request that succeeds again, under
the watchdog and under what an operator would otherwise run the same vLLM with.

Usage: .venv/bin/python bench/mttr.py [--quick] [--faults freeze,kill,exit0]
           [--supervisors watchdog,systemd,docker,kubernetes] [--horizon 420] [--warmup 10] [--json FILE]

Faults, each sent to the EngineCore process of a real CPU vLLM (scripts/serve-vllm.sh, the tiny model) that
has been serving for --warmup seconds:
  freeze  SIGSTOP: the engine hangs, the API server and /health go on answering;
  kill    SIGKILL: the engine dies;
  exit0   SIGTERM: the engine shuts down cleanly, exit status 0 (a death a supervisor may read as a stop).
Supervisors (one vLLM at a time, each started fresh for each fault):
  watchdog    the real daemon (`vllm-watchdog run`) with the embedded defaults (bundled rules, actions and
              routes, dry_run: false), the target in process mode (it launches vLLM), the clients going
              through its gateway;
  systemd, docker, kubernetes
              bench/_mttr_supervisors.py's loops with their restart semantics, the clients going to vLLM.
Clients, all the time: a completion every 0.5 s, plain and streaming in turn (16 tokens, each with a 300 s
deadline). Measured: from the fault to the first request that succeeded among those sent after it (for kill
and exit0: after the engine process was gone; the API server answers for a while after a clean exit begins):
the service is back (not within --horizon: "never"); the requests that failed (in flight at the fault or sent
after it), before their first byte or mid-stream; how the supervisor saw vLLM end. --quick: the freeze, under
the watchdog only. The watchdog is measured as it is when the bench runs: which of its recovery features exist
depends on the commit (printed).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from importlib import resources
from pathlib import Path
from typing import Any

import httpx
import yaml
from _mttr_clients import BODY, Clients, errors, recovered_at
from _mttr_supervisors import Supervisor, engine_core, gone, inject, stop_group

ROOT = Path(__file__).resolve().parent.parent
GOAL = 75.0  # seconds from a freeze to the first success: detection plus one vLLM start (issue 31)


def free_port() -> int:
    """A free TCP port on 127.0.0.1."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class WatchdogStack:
    """The real daemon, launching vLLM in process mode, with its gateway in front."""

    def __init__(self, work: Path) -> None:
        self.state, self.log = work / "state", work / "watchdog.log"
        api, gateway, vllm = free_port(), free_port(), free_port()
        self.api, self.url = f"http://127.0.0.1:{api}", f"http://127.0.0.1:{gateway}"
        cfg: dict[str, Any] = yaml.safe_load(
            (resources.files("vllm_watchdog") / "defaults" / "config.yml").read_text()
        )
        cfg.update(listen=f"127.0.0.1:{api}", state_dir=str(self.state), dry_run=False)
        cfg["gateway"]["listen"] = f"127.0.0.1:{gateway}"
        target = cfg["targets"][0]
        target["url"] = f"http://127.0.0.1:{vllm}"
        target["command"] = ["bash", str(ROOT / "scripts" / "serve-vllm.sh"), "--port", str(vllm)]
        self.config = work / "watchdog.yml"
        self.config.write_text(json.dumps(cfg, indent=1) + "\n")
        self.proc: subprocess.Popen[bytes] | None = None
        self.exits: list[str] = []

    def start(self) -> None:
        """Start the daemon (it starts vLLM)."""
        with self.log.open("ab") as out:
            argv = [sys.executable, "-m", "vllm_watchdog", "run", "--config", str(self.config)]
            self.proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)

    def pid(self) -> int | None:
        """The vLLM API server the daemon runs now (its process-mode state file)."""
        with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
            return int(json.loads((self.state / "process-vllm-0.json").read_text())["child"]["pid"])
        return None

    async def run(self) -> None:
        """Nothing to do: the daemon supervises."""

    async def ready(self, limit: float) -> None:
        """Until the target is up and its canary succeeded (asking the gateway before would make it 502s)."""
        deadline = time.monotonic() + limit
        async with httpx.AsyncClient(trust_env=False) as client:
            while time.monotonic() < deadline:
                with contextlib.suppress(httpx.HTTPError, ValueError, KeyError, IndexError):
                    answer = (await client.get(self.api + "/api/v1/targets", timeout=5)).json()
                    t = answer["data"]["activeTargets"][0]
                    if t["health"] == "up" and (t["watchdog"]["canary"] or {}).get("success"):
                        return
                await asyncio.sleep(1.0)
        raise RuntimeError(f"vLLM not ready under the watchdog within {limit:.0f} s; see {self.log}")

    def actions(self, fault: float) -> list[str]:
        """The audit log's rows, one line each, with their steps in seconds from the fault."""
        with contextlib.suppress(httpx.HTTPError, ValueError, KeyError):
            rows = httpx.get(self.api + "/api/v1/actions", timeout=10).json()["data"]["history"]
            out = []
            for r in rows:
                steps = ", ".join(f"{s['step']} {s['at'] - fault:+.0f}s" for s in r.get("steps", []))
                out.append(f"{r['action']} ({r['trigger']}): {r['outcome']} {r.get('reason', '')}"[:120])
                out.append(f"  steps: {steps}"[:400])
            return out
        return []

    def stop(self) -> None:
        """SIGTERM the daemon, then stop the vLLM it launched (the daemon leaves it running by design)."""
        server = self.pid()
        if self.proc is not None:
            stop_group(self.proc.pid, 20.0)
        if server is not None:
            stop_group(server, 15.0)


async def _wait_serving(url: str, limit: float) -> float:
    """Until a completion succeeds at `url` (a vLLM starting answers nothing); seconds it took."""
    t0 = time.monotonic()
    async with httpx.AsyncClient(trust_env=False) as client:
        while time.monotonic() - t0 < limit:
            with contextlib.suppress(httpx.HTTPError, ValueError):
                resp = await client.post(url + "/v1/completions", json=BODY, timeout=30)
                if resp.status_code == 200 and resp.json().get("choices"):
                    return time.monotonic() - t0
            await asyncio.sleep(1.0)
    raise RuntimeError(f"nothing served at {url} within {limit:.0f} s")


async def _until_gone(engine: int, since: float, limit: float) -> float:
    """Seconds from `since` until the engine process has exited (at most `limit`)."""
    for _ in range(int(limit * 10)):
        if gone(engine):
            break
        await asyncio.sleep(0.1)
    return round(time.time() - since, 1)


async def one_run(kind: str, fault: str, work: Path, args: argparse.Namespace) -> dict[str, Any]:
    """Start `kind` fresh, serve, inject `fault`, wait for recovery (at most --horizon), stop."""
    stack: Any = (
        WatchdogStack(work) if kind == "watchdog" else Supervisor(kind, free_port(), work / "vllm.log")
    )
    stack.start()
    supervising = asyncio.create_task(stack.run())
    out: dict[str, Any] = {"supervisor": kind, "fault": fault}
    try:
        began = time.monotonic()
        if isinstance(stack, WatchdogStack):
            await stack.ready(600)
        await _wait_serving(stack.url, 600)
        out["ready_s"] = round(time.monotonic() - began, 1)
        clients, stop = Clients(stack.url), asyncio.Event()
        sending = asyncio.create_task(clients.run(stop))
        await asyncio.sleep(args.warmup)
        server = stack.pid()
        if server is None or engine_core(server) is None:
            raise RuntimeError("no vLLM API server with an EngineCore to fault")
        fault_at, engine = inject(fault, server)
        # A clean exit takes a while: what the API server answers meanwhile is no recovery.
        if fault != "freeze":
            out["engine_gone_s"] = await _until_gone(engine, fault_at, 60.0)
        since = time.time()
        back = None
        while time.time() - fault_at < args.horizon and back is None:
            await asyncio.sleep(0.5)
            back = recovered_at(clients.requests, since)
        await asyncio.sleep(3.0 if back is not None else 0.0)
        stop.set()
        await sending
        left = await clients.close()
        reqs = [r for r in clients.requests if r.sent >= fault_at - 30]
        out |= {
            "recovered_s": None if back is None else round(back - fault_at, 1),
            "errors": errors(clients.requests, fault_at),
            "replayed": sum(1 for r in reqs if r.replayed),
            "outstanding_at_end": left,
            "not_sent": clients.not_sent,
            "exits": list(stack.exits),
        }
        if isinstance(stack, WatchdogStack):
            out["actions"] = stack.actions(fault_at)
        kinds: dict[str, int] = {}
        for r in clients.requests:
            if (
                r.phase
                and r.done is not None
                and r.done >= fault_at
                and "cancelled at the end" not in r.error
            ):
                kinds[r.error[:60]] = kinds.get(r.error[:60], 0) + 1
        out["error_kinds"] = dict(sorted(kinds.items(), key=lambda kv: -kv[1])[:4])
    finally:
        with contextlib.suppress(Exception):
            if stack.pid() is not None:
                os.killpg(stack.pid(), signal.SIGCONT)  # nothing is left stopped
        supervising.cancel()  # first: a supervisor loop must not start a vLLM while it is being stopped
        await asyncio.gather(supervising, return_exceptions=True)
        stack.stop() if isinstance(stack, WatchdogStack) else await asyncio.to_thread(stack.stop)
    return out


def _line(r: dict[str, Any], horizon: float) -> str:
    back = "never" if r.get("recovered_s") is None else f"{r['recovered_s']:.1f} s"
    if r.get("recovered_s") is None:
        back += f" (not within {horizon:g} s)"
    e = r.get("errors", {})
    return (
        f"  {r['fault']:<7} {r['supervisor']:<11} back after {back:<26} errors: "
        f"{e.get('before first byte', 0)} before first byte, {e.get('mid-stream', 0)} mid-stream; "
        f"replayed {r.get('replayed', 0)}; vLLM ended: {', '.join(r.get('exits', [])) or '-'}"
        + (f"; engine gone after {r['engine_gone_s']:.1f} s" if "engine_gone_s" in r else "")
    )


def main() -> int:
    """Run every (fault, supervisor) pair, one vLLM at a time; print and optionally save the results."""
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="the freeze under the watchdog only")
    ap.add_argument("--faults", default="freeze,kill,exit0")
    ap.add_argument("--supervisors", default="watchdog,systemd,docker,kubernetes")
    ap.add_argument("--horizon", type=float, default=420.0, help="longest wait for recovery per run (s)")
    ap.add_argument("--warmup", type=float, default=10.0, help="serving before the fault (s)")
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args()
    faults = ["freeze"] if args.quick else args.faults.split(",")
    kinds = ["watchdog"] if args.quick else args.supervisors.split(",")
    commit = subprocess.run(
        ["git", "log", "--oneline", "-1"], check=False, cwd=ROOT, capture_output=True, text=True
    )
    print(
        f"machine: nproc={os.cpu_count()}, loadavg {os.getloadavg()[0]:.2f}; main at {commit.stdout.strip()}"
    )
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # run the cleanup in `finally`
    results = []
    with tempfile.TemporaryDirectory(prefix="vw-mttr-") as tmp:
        for fault in faults:
            for kind in kinds:
                print(f"{fault} under {kind} ...", flush=True)
                work = Path(tmp) / f"{fault}-{kind}"
                work.mkdir()
                try:
                    r = asyncio.run(one_run(kind, fault, work, args))
                except RuntimeError as exc:
                    r = {"supervisor": kind, "fault": fault, "problem": str(exc)}
                    print(f"  {kind}: {exc}", flush=True)
                results.append(r)
                if "problem" not in r:
                    print(_line(r, args.horizon), flush=True)
                    print(f"      errors by kind: {r['error_kinds']}")
                    for row in r.get("actions", []):
                        print(f"      audit: {row}")
    print("\nfrom the fault to the first request that succeeds again (goal for the watchdog: <= 75 s, and")
    print("no error for a request that had received no byte):")
    for r in results:
        print(
            _line(r, args.horizon)
            if "problem" not in r
            else f"  {r['fault']} {r['supervisor']}: {r['problem']}"
        )
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
