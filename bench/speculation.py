"""Speculative decoding by goodput on the real CPU vLLM (issue 34): always on, always off, and the schedule
the watchdog's estimate calls for, in one run.

    .venv/bin/python bench/speculation.py [--seconds 12] [--clients 1,4,16,64] [--max-tokens 32]

Each phase starts its own vLLM (scripts/serve-vllm.sh, the tiny random Llama, `--max-num-seqs 64`), one at a
time, and stops it:

1. on: ngram speculation (tests/support/vllm_server.py NGRAM_SPEC, k = 4). For each text, each client count
   runs `--seconds` of closed-loop clients (each sends the next completion when its last one ends), while
   /metrics is read every second into the watchdog's estimator (watchdog/sources/specgoodput.py), one a text;
   then a trace that moves between the client counts (64, 1, 16, 4, `--seconds` / 2 each).
2. off: the same without `--speculative-config`.
3. schedule: for each text, the schedule its estimate gives, as `num_speculative_tokens_per_batch_size`.

Texts: "repeat" (a repeated code snippet, greedy: the draft copies the prompt and the model's own loops) and
"sampled" (random words, temperature 1: the draft rarely guesses). Goodput: completion tokens per second
(all clients, from the first request to the last answer). The goal: every point within 5% of the better of on
and off, and on the trace better than both.

Then (unless `--no-relaunch`) the draft_schedule action on a real vLLM in process mode: its plan and flow
relaunch the server with the schedule (ready, known answers unchecked: none configured), then a schedule
vLLM refuses (its first range starting at 2; the planner never writes one, so the plan's launch is edited)
is rolled back to the running one.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench._spec_relaunch import relaunch_proof  # noqa: E402
from tests.support.vllm_server import NGRAM_SPEC, VllmServer, free_port  # noqa: E402
from vllm_watchdog.sources.exposition import parse  # noqa: E402
from vllm_watchdog.sources.specgoodput import Snapshot, SpecGoodput  # noqa: E402

BASE_ARGS = ["--max-num-seqs", "64"]
WORDS = ("alpha", "bravo", "charlie", "delta", "echo", "golf", "hotel", "india", "kilo", "lima", "oscar")
SNIPPET = "for i in range(10):\n    total = total + values[i] * weights[i]\n"


@dataclass
class Text:
    """One kind of traffic: its prompts and sampling."""

    name: str
    temperature: float

    def body(self, rng: random.Random, max_tokens: int) -> dict[str, object]:
        """One completion request."""
        words = " ".join(rng.choice(WORDS) for _ in range(160))
        prompt = SNIPPET * 12 if self.temperature == 0 else words
        return {
            "model": "tiny-llama",
            "prompt": prompt,
            "max_tokens": max_tokens,
            "temperature": self.temperature,  # no per-request seed: vLLM 0.32's CPU sampler crashes on it
            "ignore_eos": True,
        }


TEXTS = (Text("repeat", 0.0), Text("sampled", 1.0))


@dataclass
class Point:
    """One load level's result."""

    tokens: int = 0
    seconds: float = 0.0
    errors: int = 0

    @property
    def goodput(self) -> float:
        """Completion tokens per second."""
        return self.tokens / self.seconds if self.seconds > 0 else 0.0


def snapshot_of(text: str, now: float) -> Snapshot | None:
    """vLLM's counters from a /metrics body (summed over engines), as the watchdog's collector reads them."""
    sums: dict[str, float] = {}
    per_pos: dict[int, float] = {}
    for name, labels, value, _ in parse(text):
        if name == "vllm:spec_decode_num_accepted_tokens_per_pos_total":
            pos = int(labels.get("position", "0"))
            per_pos[pos] = per_pos.get(pos, 0.0) + value
        else:
            sums[name] = sums.get(name, 0.0) + value
    try:
        return Snapshot(
            now,
            sums["vllm:num_requests_running"],
            sums["vllm:iteration_tokens_total_count"],
            sums["vllm:iteration_tokens_total_sum"],
            sums["vllm:generation_tokens_total"],
            sums.get("vllm:spec_decode_num_drafts_total", 0.0),
            sums.get("vllm:spec_decode_num_draft_tokens_total", 0.0),
            sums.get("vllm:spec_decode_num_accepted_tokens_total", 0.0),
            tuple(per_pos.get(i, 0.0) for i in range(len(per_pos))),
        )
    except KeyError:
        return None


async def _client(
    c: httpx.AsyncClient, url: str, text: Text, seed: int, deadline: float, args: Args, out: Point
) -> None:
    rng = random.Random(seed)
    while time.monotonic() < deadline:
        try:
            resp = await c.post(url + "/v1/completions", json=text.body(rng, args.max_tokens), timeout=300)
            resp.raise_for_status()
            out.tokens += int(resp.json()["usage"]["completion_tokens"])
        except (httpx.HTTPError, KeyError, ValueError):
            out.errors += 1
            await asyncio.sleep(0.2)


async def _scrape(c: httpx.AsyncClient, url: str, est: SpecGoodput | None, stop: asyncio.Event) -> None:
    while est is not None and not stop.is_set():
        try:
            snap = snapshot_of((await c.get(url + "/metrics", timeout=5)).text, time.monotonic())
            if snap is not None:
                est.observe(snap)
        except httpx.HTTPError:
            pass
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), 1.0)


async def load(
    url: str, text: Text, clients: int, seconds: float, args: Args, est: SpecGoodput | None
) -> Point:
    """`clients` closed-loop clients for `seconds`; the point ends when the last answer is in."""
    out = Point()
    stop = asyncio.Event()
    limits = httpx.Limits(max_connections=clients + 4)
    async with httpx.AsyncClient(limits=limits) as c:
        scraper = asyncio.create_task(_scrape(c, url, est, stop))
        started = time.monotonic()
        deadline = started + seconds
        await asyncio.gather(
            *(_client(c, url, text, 1000 * clients + i, deadline, args, out) for i in range(clients))
        )
        out.seconds = time.monotonic() - started
        stop.set()
        await scraper
    return out


@dataclass
class Args:
    """The command line."""

    seconds: float
    clients: list[int]
    max_tokens: int
    relaunch: bool


@dataclass
class Results:
    """Goodput by phase, text and load level ("trace" for the moving one)."""

    points: dict[tuple[str, str, str], Point] = field(default_factory=dict)
    schedules: dict[str, str] = field(default_factory=dict)


async def sweep(
    url: str, phase: str, texts: tuple[Text, ...], args: Args, res: Results, ests: dict[str, SpecGoodput]
) -> None:
    """Every load level of every text, then the trace."""
    for text in texts:
        est = ests.get(text.name)
        for clients in args.clients:
            p = await load(url, text, clients, args.seconds, args, est)
            res.points[(phase, text.name, str(clients))] = p
            print(
                f"  {phase:<8} {text.name:<8} {clients:>3} clients {p.goodput:8.1f} tok/s errors {p.errors}",
                flush=True,
            )
        trace = Point()
        for clients in sorted(args.clients, key=lambda n: (n % 3, -n)):  # 64, 1, 16, 4
            p = await load(url, text, clients, args.seconds / 2, args, None)
            trace.tokens, trace.seconds, trace.errors = (
                trace.tokens + p.tokens,
                trace.seconds + p.seconds,
                trace.errors + p.errors,
            )
        res.points[(phase, text.name, "trace")] = trace
        print(f"  {phase:<8} {text.name:<8} trace        {trace.goodput:8.1f} tok/s", flush=True)


def serve(extra: list[str]) -> VllmServer:
    """Start a vLLM with these arguments (besides the bench's) and wait for it."""
    server = VllmServer(free_port(), [*BASE_ARGS, *extra])
    started = time.monotonic()
    server.start()
    print(
        f"  vLLM ready in {time.monotonic() - started:.0f}s: {' '.join(extra) or '(no speculation)'}",
        flush=True,
    )
    return server


def report(args: Args, res: Results) -> None:
    """The table: goodput of each configuration, and the schedule against the better of on and off."""
    print("\ntext      load     on tok/s   off tok/s  sched tok/s  sched/best")
    worst = float("inf")
    for text in TEXTS:
        if text.name not in res.schedules:
            print(f"{text.name:<9} no estimate, no schedule: the watchdog leaves the server as it runs")
            continue
        for load_ in [*map(str, args.clients), "trace"]:
            on, off, sched = (
                res.points.get((p, text.name, load_), Point()).goodput for p in ("on", "off", "schedule")
            )
            best = max(on, off)
            ratio = sched / best if best > 0 else 0.0
            if load_ != "trace":
                worst = min(worst, ratio)
            print(f"{text.name:<9} {load_:>5}  {on:9.1f}  {off:10.1f}  {sched:11.1f}  {ratio:9.2f}")
        print(f"  schedule for {text.name}: {res.schedules.get(text.name, '-')}")
    print(f"\nworst point: schedule at {worst:.2f} of the better of on and off (goal: >= 0.95)")


async def main(args: Args) -> None:
    """The three phases, the table, and the relaunch proof."""
    res = Results()
    ests = {t.name: SpecGoodput(window=1e9) for t in TEXTS}
    for phase, extra in (("on", ["--speculative-config", NGRAM_SPEC]), ("off", [])):  # both feed the estimate
        server = serve(extra)
        try:
            await sweep(server.url, phase, TEXTS, args, res, ests)
        finally:
            server.stop()
    for text in TEXTS:
        est = ests[text.name].estimate()
        if est is None:
            print(f"  {text.name}: no estimate (too few drafts or steps)")
            continue
        res.schedules[text.name] = est.schedule_text
        for r in est.ranges:
            s = " ".join(f"{x:.2f}" for x in r.speedup)
            print(
                f"  {text.name} batch {r.label:>6}: step {r.step_seconds * 1000:6.1f} ms,"
                f" k ran {r.current_k:.2f}, S(k=0..) {s}"
            )
        spec = {
            **json.loads(NGRAM_SPEC),
            "num_speculative_tokens_per_batch_size": [list(e) for e in est.schedule],
        }
        server = serve(["--speculative-config", json.dumps(spec)])
        try:
            await sweep(server.url, "schedule", (text,), args, res, {})
        finally:
            server.stop()
    report(args, res)
    if args.relaunch:
        await relaunch_proof(res.schedules.get("repeat") or "1-7:4,8-65536:0")


def _args() -> Args:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else "")
    p.add_argument("--seconds", type=float, default=12.0, help="per load level (the trace: half per level)")
    p.add_argument("--clients", default="1,4,16,64")
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--no-relaunch", action="store_true", help="skip the draft_schedule relaunch proof")
    a = p.parse_args()
    return Args(a.seconds, [int(x) for x in a.clients.split(",")], a.max_tokens, not a.no_relaunch)


if __name__ == "__main__":
    asyncio.run(main(_args()))
