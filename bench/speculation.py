"""Speculative decoding by goodput on the real CPU vLLM (issue 34): always on, always off, and the schedule
the watchdog's estimate calls for, in one run.

    .venv/bin/python bench/speculation.py [--seconds 8] [--rounds 2] [--clients 1,4,16,64] [--max-tokens 32]

Workloads: each text at each client count (a point, `--seconds` after a warm-up), and two traces that move
between the client counts (64, 1, 16, 4, `--seconds` each): "repeat trace" sends the repeat text throughout;
"day" sends the repeat text at 1 and 4 clients and the sampled text at 16 and 64 (a day's shape: quiet hours
of agent traffic the draft predicts, busy hours of chat it does not). Texts: "repeat" (a repeated code
snippet, greedy: the draft copies the prompt and the model's own loops) and "sampled" (random words,
temperature 1: the ngram proposer finds no match). Goodput: generated tokens per second, vLLM's own counter
over the window (bench/_spec_load.py says why not the clients' count).

1. learn: two vLLMs (scripts/serve-vllm.sh, the tiny random Llama, `--max-num-seqs 64`): "on" with
   ngram speculation (tests/support/vllm_server.py NGRAM_SPEC, k = 4) and "off" without. Every workload runs
   once on each, and their scrapes feed the watchdog's estimator (watchdog/sources/specgoodput.py), one
   estimate for each text and one for "day" (the window holds both servers' intervals, as a watchdog's does
   across a relaunch).
2. compare: for each estimate, three fresh vLLMs, on, off, and its schedule as
   `num_speculative_tokens_per_batch_size` (k = 0 everywhere: no speculation, as VLLMSpecDecodeNoDrafts
   routes it to disable-draft); its workloads run `--rounds` times on the three in turn (the order rotates
   each round), so that they are measured minutes apart at most, on the same machine state, and new prompts
   each time (a prompt a server saw is in its prefix cache).

The goal: every point within 5% of the better of on and off, and on a trace better than both.

Then (unless `--no-relaunch`) the draft_schedule action on a real vLLM in process mode: its plan and flow
relaunch the server with the schedule (ready, known answers unchecked: none configured), then a schedule
vLLM refuses (its first range starting at 2; the planner never writes one, so the plan's launch is edited)
is rolled back to the running one.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench._spec_load import REPEAT, SAMPLED, Segment, Workload, measure  # noqa: E402
from bench._spec_relaunch import relaunch_proof  # noqa: E402
from tests.support.vllm_server import NGRAM_SPEC, VllmServer, free_port  # noqa: E402
from vllm_watchdog.sources.specgoodput import Estimate, SpecGoodput  # noqa: E402

BASE_ARGS = ["--max-num-seqs", "64"]
SEEDS = itertools.count(1)
ON = ["--speculative-config", NGRAM_SPEC]
OFF: list[str] = []


@dataclass
class Args:
    """The command line."""

    seconds: float
    rounds: int
    clients: list[int]
    max_tokens: int
    relaunch: bool


@dataclass
class Results:
    """Goodput per round by (server, workload); errors; the schedules and their estimates."""

    runs: dict[tuple[str, str], list[float]] = field(default_factory=dict)
    errors: int = 0
    estimates: dict[str, Estimate] = field(default_factory=dict)


def workloads(args: Args) -> list[Workload]:
    """The points of each text, then the two traces."""
    out = [
        Workload(f"{t.name} {n}", t.name, (Segment(t, n, args.seconds),))
        for t in (REPEAT, SAMPLED)
        for n in args.clients
    ]
    order = sorted(args.clients, key=lambda n: (n % 3, -n))  # 64, 1, 16, 4
    out.append(Workload("repeat trace", "repeat", tuple(Segment(REPEAT, n, args.seconds) for n in order)))
    quiet = sorted(args.clients)[: len(args.clients) // 2]
    day = tuple(Segment(REPEAT if n in quiet else SAMPLED, n, args.seconds) for n in order)
    out.append(Workload("day", "day", day))
    return out


@contextlib.contextmanager
def launch(*configs: list[str]) -> Iterator[dict[str, VllmServer]]:
    """Fresh servers, "on", "off" (and "schedule"), stopped on the way out. Each comparison starts its own: a
    server that served the learning phase ran 3-8% slower than a fresh one with the same configuration."""
    servers: dict[str, VllmServer] = {}
    try:
        for name, extra in zip(("on", "off", "schedule"), configs, strict=False):
            servers[name] = serve(extra)
        yield servers
    finally:
        for server in servers.values():
            server.stop()


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


async def run(
    started: contextlib.AbstractContextManager[dict[str, VllmServer]],
    works: list[Workload],
    rounds: int,
    args: Args,
    res: Results,
    ests: dict[tuple[str, str], SpecGoodput] | None = None,
) -> None:
    """Each workload `rounds` times on every server, the servers' order rotating each round; the servers are
    started for this and stopped after."""
    with started as servers:
        await _rounds(servers, works, rounds, args, res, ests)


async def _rounds(
    servers: dict[str, VllmServer],
    works: list[Workload],
    rounds: int,
    args: Args,
    res: Results,
    ests: dict[tuple[str, str], SpecGoodput] | None,
) -> None:
    names = list(servers)
    for work in works:
        for r in range(rounds):
            for name in names[r % len(names) :] + names[: r % len(names)]:
                est = (
                    ests.setdefault((name, work.group), SpecGoodput(window=1e9)) if ests is not None else None
                )
                seed = next(SEEDS)  # new prompts each time: a prompt a server saw is in its prefix cache
                goodput, errors = await measure(servers[name].url, work, args.max_tokens, est, seed)
                res.runs.setdefault((name, work.name), []).append(goodput)
                res.errors += errors
                print(
                    f"  {name:<9} {work.name:<14} round {r + 1}: {goodput:8.1f} tok/s errors {errors}",
                    flush=True,
                )


def learn(ests: dict[tuple[str, str], SpecGoodput], group: str) -> Estimate | None:
    """One group's estimate from the intervals both servers gave it (one window, as across a relaunch)."""
    merged = SpecGoodput(window=1e9)
    got = [i for (_, g), e in ests.items() if g == group for i in e.intervals]
    merged.intervals.extend(sorted(got, key=lambda i: i[0]))
    est = merged.estimate()
    if est is None:
        print(f"  {group}: no estimate (too few drafts or steps)")
        return None
    for r in est.ranges:
        s = " ".join(f"{x:.2f}" for x in r.speedup)
        ms = r.step_seconds * 1000
        print(f"  {group} batch {r.label:>6}: step {ms:6.1f} ms, k ran {r.current_k:.2f}, S(k=0..) {s}")
    print(f"  {group}: schedule {est.schedule_text}, estimated gain {est.gain:.2f}", flush=True)
    return est


def launch_of(est: Estimate) -> list[str]:
    """What the watchdog runs for an estimate: the schedule as num_speculative_tokens_per_batch_size, or, for
    k = 0 at every batch size, no speculation (VLLMSpecDecodeNoDrafts routes that to disable-draft: vLLM's
    ngram proposer searches every step even where the schedule says k = 0)."""
    if not any(k for _, _, k in est.schedule):
        return []
    spec = {
        **json.loads(NGRAM_SPEC),
        "num_speculative_tokens_per_batch_size": [list(e) for e in est.schedule],
    }
    return ["--speculative-config", json.dumps(spec)]


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs) if xs else 0.0


def report(args: Args, works: list[Workload], res: Results) -> None:
    """The table: goodput of each configuration (mean of the rounds, and their spread), the schedule against
    the better of on and off on a point, against each of them on a trace."""
    print("\nworkload         on tok/s   off tok/s  sched tok/s  sched/on  sched/off  sched/best  spread")
    worst, traces = float("inf"), []
    for work in works:
        if work.group not in res.estimates:
            print(f"{work.name:<15} no estimate, no schedule: the watchdog leaves the server as it runs")
            continue
        on, off, sched = (_mean(res.runs.get((s, work.name), [])) for s in ("on", "off", "schedule"))
        spread = max(
            (max(v) / min(v) - 1 for (s, w), v in res.runs.items() if w == work.name and min(v) > 0),
            default=0.0,
        )
        best = max(on, off)
        ratio = sched / best if best > 0 else 0.0
        if len(work.segments) == 1:
            worst = min(worst, ratio)
        else:
            traces.append((work.name, sched / on if on else 0.0, sched / off if off else 0.0))
        print(
            f"{work.name:<15} {on:9.1f}  {off:10.1f}  {sched:11.1f}  {sched / on if on else 0:8.2f}"
            f"  {sched / off if off else 0:9.2f}  {ratio:10.2f}  {spread:5.0%}"
        )
    for group, est in res.estimates.items():
        print(f"  schedule for {group}: {est.schedule_text} (estimated gain {est.gain:.2f})")
    print(f"\nworst point: schedule at {worst:.2f} of the better of on and off (goal: >= 0.95)")
    print(f"requests that failed: {res.errors}")
    for name, vs_on, vs_off in traces:
        print(f"{name}: schedule at {vs_on:.2f} of on and {vs_off:.2f} of off (goal: both > 1)")


async def main(args: Args) -> None:
    """Learn, compare, report, and the relaunch proof."""
    res, works = Results(), workloads(args)
    ests: dict[tuple[str, str], SpecGoodput] = {}
    print("learn: each workload once on on and off, scraped into the estimates", flush=True)
    await run(launch(ON, OFF), works, 1, args, Results(), ests)
    for group in dict.fromkeys(w.group for w in works):
        est = learn(ests, group)
        if est is not None:
            res.estimates[group] = est
    for group, est in res.estimates.items():
        print(f"compare: {group}, {args.rounds} rounds on on, off and schedule", flush=True)
        mine = [w for w in works if w.group == group]
        await run(launch(ON, OFF, launch_of(est)), mine, args.rounds, args, res)
    report(args, works, res)
    if args.relaunch:
        chosen = res.estimates.get("day") or res.estimates.get("repeat")
        await relaunch_proof(chosen.schedule_text if chosen else "1-7:4,8-65536:0")


def _args() -> Args:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else "")
    p.add_argument("--seconds", type=float, default=8.0, help="the window of a point; a trace: per segment")
    p.add_argument("--rounds", type=int, default=2, help="runs of each workload on each server to compare")
    p.add_argument("--clients", default="1,4,16,64")
    p.add_argument(
        "--max-tokens", type=int, default=32, help="the mean answer length (drawn from half to 1.5x)"
    )
    p.add_argument("--no-relaunch", action="store_true", help="skip the draft_schedule relaunch proof")
    a = p.parse_args()
    return Args(a.seconds, a.rounds, [int(x) for x in a.clients.split(",")], a.max_tokens, not a.no_relaunch)


if __name__ == "__main__":
    asyncio.run(main(_args()))
