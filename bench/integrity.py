"""Benchmark: the known-answer check (issue 30) on a real CPU vLLM: its noise, what it catches, how fast, and
what it costs.

Usage: .venv/bin/python bench/integrity.py [--quick] [--scales 1.001,1.002,...] [--checks 20]
           [--interval 60] [--soak SECONDS [--soak-interval 20]] [--draft] [--workers 6]

Starts its own vLLM (scripts/serve-vllm.sh, the tiny random Llama, vLLM's default batching) in dev mode
(VLLM_SERVER_DEV_MODE=1, for `reload_weights`) and drives the watchdog's KnownAnswers directly (no
daemon), with the bundled prompts and the default `integrity:` settings (auto tolerance, confirm), on a clock
that steps one interval per check, so the token budget sees the default schedule. Phases:
  (a) noise: the baseline is learnt (serial and concurrent probes), then --checks checks on the quiet engine
      and --checks under mixed traffic (--workers threads of sampled 300-token generations, ~1,000-token
      prompts and the soak's agents: tests/support/mixed_traffic.py); the largest divergence of each next to
      the tolerance, and the margin (tolerance / noise); a diverged verdict here is a false positive;
  (b) sweep: `model.layers.2.mlp.down_proj.weight` scaled by each of --scales (scripts/perturb-model.py; the
      weights are bf16, so a scale near 1 rounds many elements back: the fraction changed is printed), loaded
      in place with reload_weights, then verify(): divergence, greedy mismatches, caught or not; the original
      weights are loaded again and verified after each; the smallest scale caught;
  (c) detection: the periodic check in real time at --interval (default: the configured 60 s), the weights
      scaled by 2.0 loaded at a random phase of it; from the reload to the first diverged verdict (with
      --quick: computed, interval / 2 + the check on average, interval + the check at worst);
  (d) cost: tokens per check (the checker's own count), tokens per minute at --interval next to
      max_tokens_per_minute, the engine's CPU seconds per check (API server + EngineCore from /proc, its idle
      use subtracted) and wall time per check.
--soak SECONDS: instead of (a)-(d), the periodic check every --soak-interval (20 s: 3 checks of 140 tokens a
minute stay under the default budget of 600) for SECONDS under mixed traffic on the unperturbed engine, with
`confirm` off so that every single probe over the tolerance counts: false positives and the largest
divergence next to the tolerance.
--draft: instead, the draft-equivalence check: the baseline learnt on the engine without speculative decoding,
which is then stopped and relaunched with ngram speculative decoding (tests/support/vllm_server.py
NGRAM_SPEC); verify() against the same baseline (the identity's key leaves the speculative config out), quiet
and under traffic: greedy mismatches, divergence, passed or not.
Nothing is asserted; one vLLM at a time, stopped at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # the real-server harnesses the tests use

from _integrity_phases import (  # noqa: E402
    Bench,
    Series,
    cost,
    detection,
    learn,
    repeated,
    soak,
    sweep,
    traffic_summary,
)

from tests.support.mixed_traffic import MixedTraffic  # noqa: E402
from tests.support.perturbed import DEV_MODE_ENV  # noqa: E402
from tests.support.vllm_server import NGRAM_SPEC, VllmServer, free_port  # noqa: E402
from vllm_watchdog.config.targets import TargetConfig  # noqa: E402
from vllm_watchdog.integrity.checker import IntegrityOptions, KnownAnswers, Readiness  # noqa: E402
from vllm_watchdog.integrity.config import IntegrityConfig  # noqa: E402

FULL_SCALES = "1.001,1.002,1.005,1.01,1.02,1.05,1.1,2.0"
QUICK_SCALES = "1.002,1.005,1.1,2.0"


def _answers(client: httpx.AsyncClient, state_dir: str, config: IntegrityConfig) -> KnownAnswers:
    """KnownAnswers as the daemon builds it, with an engine that is always healthy and never paused."""
    options = IntegrityOptions(
        client=lambda _t: client,
        readiness=lambda _name, _now: Readiness(healthy=True, canary=True),
        state_dir=state_dir,
    )
    return KnownAnswers(config, options)


def _target(server: VllmServer) -> TargetConfig:
    command = (
        "bash",
        str(ROOT / "scripts" / "serve-vllm.sh"),
        "--port",
        str(server.port),
        *server.extra_args,
    )
    return TargetConfig(name="bench", url=server.url, command=command)


def _series(label: str, s: Series, tolerance: float) -> None:
    margin = tolerance / s.max_divergence if s.max_divergence > 0 else float("inf")
    print(
        f"  {label:<26} {len(s.verdicts):>4} checks  max divergence {s.max_divergence:.4g} nats"
        f"  tolerance {tolerance:.4g}  margin x{margin:.3g}  diverged {s.diverged}  unknown {s.unknown}"
    )


async def _learnt(b: Bench) -> float:
    started = time.monotonic()
    n, last = await learn(b)
    st = b.answers.status(b.target.name)
    assert st.baseline is not None
    print(
        f"baseline learnt in {n} check(s), {time.monotonic() - started:.2f} s:"
        f" noise {st.baseline.noise:.4g} nats, tolerance {st.baseline.tolerance:.4g} nats"
        f" ({last.reason if last else '-'})"
    )
    return st.baseline.tolerance


async def _phases(args: argparse.Namespace, b: Bench) -> None:
    tolerance = await _learnt(b)
    print("(a) noise: repeated checks against the baseline")
    _series("quiet", await repeated(b, args.checks, None), tolerance)
    traffic = MixedTraffic(b.server.url, workers=args.workers)
    _series(f"mixed traffic ({args.workers} workers)", await repeated(b, args.checks, traffic), tolerance)
    print(f"  traffic: {traffic_summary(traffic.counts)}")
    print("(b) sweep: verify() after loading the scaled weights (and after restoring the original)")
    rows = await sweep(b, [float(s) for s in args.scales.split(",")])
    for r in rows:
        v = r.verdict
        print(
            f"  x{r.scale:<6g} changed {r.changed:6.1%}  divergence {v.divergence:8.4g} nats"
            f"  greedy mismatches {v.greedy_mismatches}  {'CAUGHT' if v.ok is False else 'missed'}"
            f" ({r.seconds:.2f} s)  restored: divergence {r.restored.divergence:.4g} ok={r.restored.ok}"
        )
    caught = [r.scale for r in rows if r.verdict.ok is False]
    print(f"  smallest caught: x{min(caught):g}" if caught else "  none caught")
    c = await cost(b, args.checks)
    print(f"(c) detection at interval {args.interval:g} s")
    if args.quick:
        print(
            f"  computed: mean {args.interval / 2 + 2 * c.wall:.1f} s,"
            f" worst {args.interval + 2 * c.wall:.1f} s"
            f" (interval + the check and its confirming probe, {2 * c.wall:.2f} s)"
        )
    else:
        rng = random.Random(30)
        for trial in range(args.trials):
            found, took = await detection(b, 2.0, 2 * args.interval + 2 * b.answers.config.timeout, rng)
            shown = (
                f"{found:.1f} s (the catching check took {took:.2f} s)" if found is not None else "NOT caught"
            )
            print(f"  trial {trial + 1}: x2.0 loaded at a random phase -> diverged after {shown}")
    per_minute = c.tokens * 60 / args.interval
    budget = b.answers.config.max_tokens_per_minute
    print("(d) cost of one quiet check")
    print(
        f"  {c.tokens:.0f} tokens; {per_minute:.0f} tokens/min at {args.interval:g} s (budget {budget},"
        f" {per_minute / budget:.0%} of it); engine CPU {c.cpu:.3f} s per check (idle engine"
        f" {c.idle:.2f} CPU-s/s subtracted); {c.wall:.3f} s wall per check"
    )


async def _soak(args: argparse.Namespace, b: Bench) -> None:
    tolerance = await _learnt(b)
    b.interval = args.soak_interval
    traffic = MixedTraffic(b.server.url, workers=args.workers)
    print(
        f"soak: the periodic check every {args.soak_interval:g} s for {args.soak:g} s under mixed traffic"
        " (confirm off: every probe counts)"
    )
    s = await soak(b, args.soak, traffic)
    _series("unperturbed, mixed traffic", s, tolerance)
    print(f"  false positives (diverged): {s.diverged}; traffic: {traffic_summary(traffic.counts)}")
    reasons = Counter(v.reason.split(":")[0] for v in s.verdicts if v.ok is None)
    print(f"  could not tell: {dict(reasons) or 0}")
    print(f"  verdict: {'PASS' if s.diverged == 0 and s.verdicts else 'FAIL'}")


async def _draft(args: argparse.Namespace, b: Bench, client: httpx.AsyncClient, state_dir: str) -> None:
    tolerance = await _learnt(b)
    b.server.stop()
    drafted = VllmServer(free_port(), ["--speculative-config", NGRAM_SPEC])
    print(f"relaunching with --speculative-config {NGRAM_SPEC} ...", flush=True)
    drafted.start()
    try:
        fresh = Bench(_answers(client, state_dir, IntegrityConfig()), _target(drafted), drafted, b.models, 60)
        quiet = Series()
        for _ in range(3):
            quiet.add(await fresh.verify())
        print(
            "draft equivalence: verify() against the baseline learnt without the draft"
            f" (tolerance {tolerance:.4g})"
        )
        _series("drafted, quiet", quiet, tolerance)
        traffic = MixedTraffic(drafted.url, workers=args.workers).start()
        loaded = Series()
        try:
            await asyncio.sleep(3)
            for _ in range(3):
                loaded.add(await fresh.verify())
        finally:
            await asyncio.to_thread(traffic.stop)
        _series("drafted, mixed traffic", loaded, tolerance)
        mismatches = sum(v.greedy_mismatches for v in quiet.verdicts + loaded.verdicts)
        passed = all(v.ok is True for v in quiet.verdicts + loaded.verdicts)
        print(
            f"  greedy mismatches {mismatches}; {'PASS' if passed else 'FAIL'}: {loaded.verdicts[-1].reason}"
        )
    finally:
        drafted.stop()


async def _run(args: argparse.Namespace, server: VllmServer, tmp: Path) -> None:
    async with httpx.AsyncClient(trust_env=False) as client:
        state_dir = str(tmp / "state")
        config = IntegrityConfig(confirm=not args.soak)  # the soak counts every probe, unconfirmed
        b = Bench(_answers(client, state_dir, config), _target(server), server, tmp, args.interval)
        if args.draft:
            await _draft(args, b, client, state_dir)
        elif args.soak:
            await _soak(args, b)
        else:
            await _phases(args, b)


def main() -> int:
    """Parse the arguments, start vLLM, run the phases, stop vLLM."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer checks and scales; detection computed")
    ap.add_argument("--scales", default=None, help=f"perturbation sizes (default {FULL_SCALES})")
    ap.add_argument("--checks", type=int, default=None, help="checks per noise series (default 20, quick 5)")
    ap.add_argument("--interval", type=float, default=IntegrityConfig().interval, help="check interval (s)")
    ap.add_argument("--trials", type=int, default=2, help="real-time detection trials")
    ap.add_argument("--soak", type=float, default=0.0, help="soak for this many seconds instead")
    ap.add_argument("--soak-interval", type=float, default=20.0, help="the soak's check interval (s)")
    ap.add_argument("--draft", action="store_true", help="the draft-equivalence check instead")
    ap.add_argument("--workers", type=int, default=6, help="mixed-traffic threads")
    args = ap.parse_args()
    args.scales = args.scales or (QUICK_SCALES if args.quick else FULL_SCALES)
    args.checks = args.checks or (5 if args.quick else 20)
    print(f"machine: nproc={os.cpu_count()}, loadavg {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    os.environ.update(DEV_MODE_ENV)
    started = time.monotonic()
    server = VllmServer(free_port(), [])
    with tempfile.TemporaryDirectory(prefix="vw-integrity-") as tmp:
        try:
            print("starting vLLM (dev mode) ...", flush=True)
            server.start()
            print(f"vLLM ready after {time.monotonic() - started:.0f} s", flush=True)
            asyncio.run(_run(args, server, Path(tmp)))
        except Exception:
            print(f"vLLM log tail:\n{server.log_tail()}", file=sys.stderr)
            raise
        finally:
            server.stop()
    print(f"\ntotal {time.monotonic() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
