"""Benchmark: from a real vLLM queue forming to the watchdog's action, vs. Prometheus + Alertmanager; and
what collecting an incident bundle adds before the action stops the server.

Usage: .venv/bin/python bench/detect_to_act.py [--floods 5] [--quick] [--bound 30] [--default-bound 160]
           [--incident-budget 5]

Starts one real CPU vLLM with `--max-num-seqs 1` (one sequence runs, the rest wait) and floods it with
8 completions kept in flight (ignore_eos). The rule is `vllm:num_requests_waiting > 2`, `for: 0s`. With
one running, the 4th request sent is the moment the queue crosses the threshold ("crossing"). Measured
from that moment, per flood:
  - vLLM's own lag: until its /metrics shows waiting > 2 (polled every 50 ms, 0.5 s timeout);
  - vllm-watchdog in-process (scrape and evaluation every 1 s) routing the alert to a `restart` action on a
    systemd-mode target: until the audit-log row (GET /api/v1/actions) says the action started. The
    target's `systemctl` is a stub script (systemd is not PID 1 here): it answers `show`/`is-active`, names
    the real vLLM as the unit's main process, and takes `stop`/`start` without doing anything, so vLLM keeps
    serving; the bench counts its calls;
  - Prometheus 2.42 scraping vLLM directly + Alertmanager 0.25 with a webhook to this script, at their
    tightest settings (scrape/eval 1 s, group_wait 0s, group_interval 1s): until the webhook arrives;
  - flood 1 only, unless --quick: the same at their defaults (scrape 1m, eval 1m, group_wait 30s),
    bounded by --default-bound (worst case 60 + 60 + 30 s).
Between floods the requests are cancelled (vLLM aborts them), the queue drains and every alert resolves;
each flood starts at a random phase of the 1 s intervals. Prints min/median/max and ratios, with the goal
(flood start to action <= 1.0 s) as informational PASS/MISS. Every load is bounded in time and count.

The floods then run again with incident bundles on (`incidents.budget`: --incident-budget): the watchdog
collects the flooded vLLM's stacks (py-spy), /proc facts, metrics and log before the stop. Printed side by
side: from the alert becoming active to the restart's `stop` step, with collection off (the first floods)
and on, and how long the collection took (each bundle's manifest). The goal, informational: the median
grows by at most the budget.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from _harness import (
    THRESHOLD,
    Receiver,
    Scenario,
    active_at,
    queue_depth,
    start_scenario,
    write_watchdog,
)

ROOT = Path(__file__).resolve().parent.parent
IN_FLIGHT = 8
CROSSING = THRESHOLD + 2  # one request runs, so the 4th in flight makes waiting > 2
COMPLETION = {"model": "tiny-llama", "prompt": "one two three", "max_tokens": 64, "temperature": 0}
COMPLETION |= {"ignore_eos": True}


# -- one flood ------------------------------------------------------------------------------------
@dataclass
class Flood:
    """What one flood measured (unix seconds; None: not seen before the bound)."""

    first_sent: float = 0.0
    crossed: float = 0.0
    seen: float | None = None
    action: float | None = None
    alert_active: float | None = None
    stop: float | None = None  # the restart's `stop` step: its first disruptive one
    incident: str = ""
    collection: float | None = None  # seconds, from the incident's manifest
    parts: dict[str, str] = field(default_factory=dict)
    part_seconds: dict[str, float] = field(default_factory=dict)
    delivered: dict[str, float | None] = field(default_factory=dict)
    prom_active: dict[str, float | None] = field(default_factory=dict)  # Prometheus' activeAt
    other_rows: list[dict[str, Any]] = field(default_factory=list)


async def _request(
    client: httpx.AsyncClient, vllm_url: str, sent: list[float], crossed: asyncio.Event
) -> None:
    while True:  # keep one request in flight until cancelled (cancelling disconnects: vLLM aborts it)
        sent.append(time.time())
        if len(sent) >= CROSSING:
            crossed.set()
        try:
            await client.post(vllm_url + "/v1/completions", json=COMPLETION, timeout=120)
        except httpx.HTTPError:
            await asyncio.sleep(0.2)


async def _watchdog_action(client: httpx.AsyncClient, base: str, flood: Flood) -> None:
    history = (await client.get(base + "/api/v1/actions", timeout=2)).json()["data"]["history"]
    rows = [r for r in history if r["started_at"] >= flood.first_sent]
    acted = [r for r in rows if r["action"] == "restart" and r["outcome"] not in ("skipped", "refused")]
    flood.other_rows = [r for r in rows if r not in acted]
    if not acted:
        return
    first = min(acted, key=lambda r: r["started_at"])
    if flood.action is None:
        flood.action = first["started_at"]
        flood.alert_active = await active_at(client, base)
    stops = [s["at"] for s in first["steps"] if s["step"] == "stop"]
    flood.stop = stops[0] if stops else None
    flood.incident = str(first["details"].get("incident", ""))


async def flood_once(
    clients: tuple[httpx.AsyncClient, httpx.AsyncClient],
    vllm_url: str,
    base: str,
    receiver: Receiver,
    scenarios: list[Scenario],
    daemon: asyncio.Task[None],
) -> Flood:
    """Keep IN_FLIGHT requests going until every observer has seen the queue or the longest bound passed."""
    load, probe = clients
    flood, crossed = Flood(), asyncio.Event()
    sent: list[float] = []
    live = [s for s in scenarios if s.running]
    tasks = [asyncio.create_task(_request(load, vllm_url, sent, crossed)) for _ in range(IN_FLIGHT)]
    try:
        await crossed.wait()
        flood.first_sent, flood.crossed = min(sent), sorted(sent)[CROSSING - 1]
        deadline = flood.crossed + max([15.0] + [s.bound for s in live])
        tick = 0
        while time.time() < deadline:
            if daemon.done():
                raise RuntimeError("the watchdog stopped during the flood")
            if flood.seen is None:
                depth = await queue_depth(probe, vllm_url)
                if depth is not None and depth[0] > THRESHOLD:
                    flood.seen = time.time()
            if (flood.action is None or flood.stop is None) and tick % 2 == 0:
                await _watchdog_action(probe, base, flood)
            for s in live:
                if flood.delivered.get(s.name) is None:
                    flood.delivered[s.name] = receiver.first(s.path, "firing", flood.first_sent)
                    if flood.delivered[s.name] is not None:
                        flood.prom_active[s.name] = await active_at(probe, s.prom.url)
            if flood.seen and flood.stop and all(flood.delivered.get(s.name) for s in live):
                break
            tick += 1
            await asyncio.sleep(0.05)
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    return flood


async def _until(check: Any, limit: float, what: str) -> None:
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        with contextlib.suppress(httpx.HTTPError):
            if await check():
                return
        await asyncio.sleep(0.2)
    print(f"  warning: {what} not within {limit:g} s", flush=True)


async def drain(
    probe: httpx.AsyncClient,
    vllm_url: str,
    base: str,
    receiver: Receiver,
    scenarios: list[Scenario],
    flood: Flood,
) -> None:
    """Wait (bounded) for an empty queue, and for every alert of this flood to resolve everywhere."""

    async def idle() -> bool:
        return await queue_depth(probe, vllm_url) == (0.0, 0.0)

    async def resolved() -> bool:
        alerts = (await probe.get(base + "/api/v1/alerts", timeout=2)).json()["data"]["alerts"]
        if any(a["labels"]["alertname"] == "QueueBacklog" for a in alerts):
            return False
        for s in scenarios:
            if not s.running:
                continue
            got = (await probe.get(s.prom.url + "/api/v1/alerts", timeout=2)).json()["data"]["alerts"]
            fired = flood.delivered.get(s.name)
            if got or (fired is not None and receiver.first(s.path, "resolved", fired) is None):
                return False
        return True

    await _until(idle, 60, "vLLM queue empty")
    await _until(resolved, 30, "alerts resolved")


# -- the run --------------------------------------------------------------------------------------
async def _collection(client: httpx.AsyncClient, base: str, flood: Flood) -> None:
    """How long the flood's incident took to collect, and how each part ended (from its manifest)."""
    if not flood.incident:
        return
    shown = (await client.get(f"{base}/api/v1/incidents/{flood.incident}", timeout=10)).json()["data"]
    flood.collection = float(shown["manifest"]["collection_seconds"])
    flood.parts = {p["name"]: p["status"] for p in shown["manifest"]["parts"]}
    flood.part_seconds = {p["name"]: float(p["seconds"]) for p in shown["manifest"]["parts"]}


async def measure(
    args: argparse.Namespace,
    tmp: Path,
    vllm: Any,
    receiver: Receiver,
    scenarios: list[Scenario],
    incident_budget: float | None,
) -> list[Flood]:
    """Run the watchdog in-process (incident bundles with `incident_budget`, None: off) and flood vLLM
    `args.floods` times."""
    from tests.support.vllm_server import free_port
    from vllm_watchdog.service.daemon import Daemon, DaemonOptions

    port = free_port()
    vllm_url = vllm.url
    config, stub = write_watchdog(tmp, port, vllm_url, vllm.proc.pid, incident_budget)
    daemon = Daemon.load(DaemonOptions(str(config), env={}, systemctl=(str(stub),)))
    ready = asyncio.Event()
    task = asyncio.create_task(daemon.run(ready))
    base, floods = f"http://127.0.0.1:{port}", []
    try:
        await asyncio.wait_for(ready.wait(), 30)
        # Idle connections are dropped after 1 s, well before the servers' keep-alive (uvicorn's 5 s, the
        # watchdog's API and vLLM alike): with httpx's default (5 s too) a connection could be reused in the
        # moment the server closed it, and the daemon shares this loop, so a stall between its response and
        # our reading of it widened that moment (httpx.ReadError; tests/api/test_keepalive.py).
        kept = httpx.Limits(keepalive_expiry=1.0)
        async with (
            httpx.AsyncClient(trust_env=False, limits=kept) as load,
            httpx.AsyncClient(trust_env=False, limits=kept) as probe,
        ):

            async def up() -> bool:
                answer = (await probe.get(base + "/api/v1/targets", timeout=2)).json()
                targets = answer["data"]["activeTargets"]
                return bool(targets and targets[0]["health"] == "up")

            await _until(up, 30, "watchdog target up")
            await asyncio.sleep(2.0)  # a few evaluations with an empty queue
            for i in range(args.floods):
                await asyncio.sleep(random.uniform(0.0, 1.0))  # a random phase of the 1 s intervals
                flood = await flood_once((load, probe), vllm_url, base, receiver, scenarios, task)
                await _collection(probe, base, flood)
                floods.append(flood)
                print(f"flood {i + 1}: {_flood_line(flood, scenarios)}", flush=True)
                for s in scenarios:
                    if s.running and s.bound > args.bound:
                        await asyncio.to_thread(s.stop)  # the slow one runs in flood 1 only
                await drain(probe, vllm_url, base, receiver, scenarios, flood)
    finally:
        daemon.stop()
        await asyncio.wait_for(task, 15)
    return floods


def _ms(t: float | None, since: float) -> str:
    return "-" if t is None else f"{(t - since) * 1000:.0f} ms"


def _flood_line(f: Flood, scenarios: list[Scenario]) -> str:
    parts = [f"vLLM /metrics {_ms(f.seen, f.crossed)}", f"watchdog action {_ms(f.action, f.crossed)}"]
    if f.alert_active is not None:
        parts.append(f"alert -> stop {_ms(f.stop, f.alert_active)}")
    if f.collection is not None:
        parts.append(
            f"collection {f.collection * 1000:.0f} ms ({', '.join(f'{k} {v}' for k, v in f.parts.items())})"
        )
    parts += [
        f"{s.name} {_ms(f.delivered.get(s.name), f.crossed)}" for s in scenarios if s.name in f.delivered
    ]
    for r in f.other_rows[:3]:
        parts.append(f"[audit: {r['action']} {r['outcome']}: {r.get('reason', '')}]")
    return ", ".join(parts) + " (after crossing)"


def _stats(values: list[float]) -> str:
    if not values:
        return "no samples"
    mid = statistics.median(values)
    return f"min {min(values):7.3f}  median {mid:7.3f}  max {max(values):7.3f} s  (n={len(values)})"


def _since(floods: list[Flood], pick: Any, start: str = "crossed") -> list[float]:
    """Seconds from each flood's start point to what `pick` returns, where it saw something."""
    return [t - getattr(f, start) for f in floods if (t := pick(f)) is not None]


def _goal(label: str, value: str, ok: bool) -> str:
    return f"  {label:<48}{value:>12}   {'PASS' if ok else 'MISS'}"


def report(floods: list[Flood], scenarios: list[Scenario], tmp: Path) -> None:
    """Print the latencies, their ratios and the goal."""
    rows = [("vLLM lag: /metrics shows waiting > 2 (50 ms polls)", _since(floods, lambda f: f.seen))]
    rows.append(
        ("watchdog: alert active (activeAt, ms resolution)", _since(floods, lambda f: f.alert_active))
    )
    rows.append(("watchdog: action started (audit started_at)", wd := _since(floods, lambda f: f.action)))
    medians = {"watchdog": statistics.median(wd) if wd else None}
    for s in scenarios:
        rows.append(
            (
                f"{s.name}: Prometheus alert active (activeAt)",
                _since(floods, lambda f, n=s.name: f.prom_active.get(n)),
            )
        )
        rows.append(
            (
                f"{s.name}: Alertmanager webhook arrived",
                got := _since(floods, lambda f, n=s.name: f.delivered.get(n)),
            )
        )
        medians[s.name] = statistics.median(got) if got else None
    print("\nlatency from the threshold crossing (4th request sent: 1 running + 3 waiting > 2):")
    for label, values in rows:
        print(f"  {label:<58}{_stats(values)}")
    from_start = _since(floods, lambda f: f.action, "first_sent")
    print(f"  {'watchdog: action started, from flood start (1st request)':<58}{_stats(from_start)}")
    both = [f for f in floods if f.action is not None and f.alert_active is not None]
    overhead = _since(both, lambda f: f.action, "alert_active")
    print(f"  {'watchdog: alert active -> action (route, rails, audit)':<58}{_stats(overhead)}")
    if len(wd) < len(floods):
        print(f"  watchdog: no action within the bound in {len(floods) - len(wd)} of {len(floods)} floods")
    print("\nPrometheus 2.42 + Alertmanager 0.25, scraping vLLM directly:")
    for s in scenarios:
        tried = sum(1 for f in floods if s.name in f.delivered)
        late = tried - sum(1 for f in floods if f.delivered.get(s.name) is not None)
        note = f"; not delivered within {s.bound:g} s in {late} of {tried} floods" if late else ""
        print(f"  {s.name:<8} {s.describe}, {tried} flood(s){note}")
    print("\nratio, median latency / watchdog median:")
    b = medians["watchdog"]
    for s in scenarios:
        a = medians[s.name]
        if not b:
            ratio = "n/a (no watchdog action)"
        elif a is None:
            ratio = f"> {s.bound / b:.1f}x (nothing within {s.bound:g} s)"
        else:
            ratio = f"{a / b:.1f}x  ({a:.3f} s / {b:.3f} s)"
        print(f"  {s.name:<8} {ratio}")
    log = tmp / "systemctl.calls"
    calls = [c for c in log.read_text().split("\n") if c] if log.exists() else []
    stops = [c for c in calls if c.startswith("stop")]
    others = [c for c in calls if not c.startswith(("show", "is-active", "stop", "start"))]
    print(f"\nsystemctl stub: {len(calls)} calls, {len(stops)} stops (no-ops), {len(others)} others (want 0)")
    print("\ngoal (informational):")
    if not from_start:
        print(_goal("flood start -> action <= 1.0 s", "no action", False))
        return
    mid, worst = statistics.median(from_start), max(from_start)
    print(_goal("flood start -> action <= 1.0 s, median", f"{mid:.3f} s", mid <= 1.0))
    print(
        _goal(
            "flood start -> action <= 1.0 s, worst", f"{worst:.3f} s", worst <= 1.0 and len(wd) == len(floods)
        )
    )


def incident_report(off: list[Flood], on: list[Flood], budget: float) -> None:
    """Alert active -> the restart's stop step, collection off and on, and the collection's own time."""
    before = _since(off, lambda f: f.stop, "alert_active")
    after = _since(on, lambda f: f.stop, "alert_active")
    took = [f.collection for f in on if f.collection is not None]
    print("\nalert active -> restart's stop step (route, rails, audit, drain 0 s, then the evidence):")
    print(f"  {'incident bundles off':<58}{_stats(before)}")
    print(f"  {f'incident bundles on, budget {budget:g} s':<58}{_stats(after)}")
    print(f"  {'collection itself (bundle manifests)':<58}{_stats(took)}")
    stacks = [f.part_seconds["stacks"] for f in on if "stacks" in f.part_seconds]
    print(f"  {'of which the Python stacks (py-spy, started first)':<58}{_stats(stacks)}")
    statuses: dict[str, dict[str, int]] = {}
    for f in on:
        for name, status in f.parts.items():
            statuses.setdefault(name, {}).setdefault(status, 0)
            statuses[name][status] += 1
    print(
        "  parts: "
        + "; ".join(f"{n} {', '.join(f'{s} {c}' for s, c in v.items())}" for n, v in statuses.items())
    )
    if not before or not after:
        print(_goal("alert -> stop grows by <= the budget", "no data", False))
        return
    grown = statistics.median(after) - statistics.median(before)
    worst = max(after) - max(before)
    print(_goal(f"median growth <= budget ({budget:g} s)", f"{grown:+.3f} s", grown <= budget))
    print(_goal(f"worst growth <= budget ({budget:g} s)", f"{worst:+.3f} s", worst <= budget))


def main() -> int:
    """Start vLLM, the Prometheus/Alertmanager pairs and the receiver; flood; report; clean up."""
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--floods", type=int, default=5, help="floods, i.e. watchdog measurements (default 5)")
    ap.add_argument("--quick", action="store_true", help="skip Prometheus/Alertmanager at default intervals")
    ap.add_argument("--bound", type=float, default=30.0, help="longest wait per flood, tight settings (s)")
    ap.add_argument("--default-bound", type=float, default=160.0, help="longest wait, default intervals (s)")
    ap.add_argument(
        "--incident-budget",
        type=float,
        default=5.0,
        help="incidents.budget for the second round of floods (s)",
    )
    args = ap.parse_args()
    sys.path.insert(0, str(ROOT))  # the real-server harnesses the tests use
    from tests.support.vllm_server import VllmServer, free_port

    for exe in ("/usr/bin/prometheus", "/usr/bin/prometheus-alertmanager"):
        if not os.access(exe, os.X_OK):
            print(f"{exe} not found: run scripts/setup.sh", file=sys.stderr)
            return 2
    versions = [
        subprocess.run([e, "--version"], capture_output=True, text=True, check=False)
        for e in ("/usr/bin/prometheus", "/usr/bin/prometheus-alertmanager")
    ]
    print(f"machine: nproc={os.cpu_count()}, loadavg {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print("; ".join(" ".join((v.stdout or v.stderr).split()[:3]) for v in versions))
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # run the cleanup in `finally`
    started = time.monotonic()
    receiver, scenarios, vllm = Receiver(), [], VllmServer(free_port(), ["--max-num-seqs", "1"])
    with tempfile.TemporaryDirectory(prefix="vw-bench-") as tmp_name:
        tmp = Path(tmp_name)
        logging.basicConfig(filename=tmp / "watchdog.log", level=logging.WARNING)
        try:
            print("starting vLLM (--max-num-seqs 1) ...", flush=True)
            vllm.start()
            print(f"vLLM ready after {time.monotonic() - started:.0f} s", flush=True)
            scenarios.append(start_scenario("tight", tmp, vllm.port, receiver, True, args.bound))
            if not args.quick:
                scenarios.append(
                    start_scenario("default", tmp, vllm.port, receiver, False, args.default_bound)
                )
            print("floods with incident bundles off:", flush=True)
            floods = asyncio.run(measure(args, tmp, vllm, receiver, scenarios, None))
            print(f"floods with incident bundles on (budget {args.incident_budget:g} s):", flush=True)
            collected = asyncio.run(measure(args, tmp, vllm, receiver, scenarios, args.incident_budget))
            report(floods, scenarios, tmp)
            incident_report(floods, collected, args.incident_budget)
        except Exception:
            log = tmp / "watchdog.log"
            tail = log.read_text(errors="replace")[-2000:] if log.exists() else ""
            print(f"watchdog log tail:\n{tail}\nvLLM log tail:\n{vllm.log_tail()}", file=sys.stderr)
            raise
        finally:
            for s in scenarios:
                if s.running:
                    s.stop()
            vllm.stop()
            receiver.close()
    print(f"\ntotal {time.monotonic() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
