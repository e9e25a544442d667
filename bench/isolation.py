"""Isolation of the data plane and the daemon under hostile input, side by side with the undisturbed run.

Usage: .venv/bin/python bench/isolation.py [--quick] [--phases a,b,...] [--json PATH] [--rss-guard-mib N]

A loopback upstream (bench/_hostile_servers.py, answering like bench/gateway.py's) sits behind the watchdog's
gateway process, which the daemon starts. Phases (a)-(d) measure the gateway's added latency, each against
direct requests to the same upstream interleaved with it (so that the machine's drift hits both alike):
  (a) the daemon idle (one target, no rules);
  (b) the daemon scraping 100 fake targets (the real vLLM 0.32 payload; one of them able to turn hostile)
      at 1 s with the bundled rules and a probe alert;
  (c) as (b), while pathological API requests run back to back (a catastrophic regex over every series);
  (d) as (b), with the daemon SIGSTOPped;
  (e) 16 streaming clients across a kill -9 of the daemon: every request must complete (runs last).
Added p50/p99 in ms and requests per gateway CPU-second; the goal is added p99 under 2.5 ms in (a)-(d) and
nothing lost in (e). The same regex query is timed against Prometheus 2.42 scraping the same 100 targets.

Phases (f)-(i) send hostile input without a token, each for one window (60 s; --quick 24 s), measured
against an undisturbed window of (b) (bench/_isolation_window.py). Where the bench runs as root, the
attackers run as `nobody` (another local user, as the threat model has it):
  (f) the worst query mix at the API, 520 connections trickling a body among it, while a second client of
      the bench's user asks `up` and polls /healthz and /metrics (bench/_attack_api.py);
  (g) 80 gateway clients with a 2 KiB receive buffer whose endless streams they never read;
  (h) 16 (--quick 8) concurrent 16 MiB `{"messages":[{},{},...]}` bodies to the gateway (both
      bench/_attack_gateway.py);
  (i) one of the 100 targets serves 15 new series a second with 1 MB label values, a 10,000-label series
      and every third scrape 64 MiB without a length (bench/_hostile_servers.py).
Goals in each: scrapes of the healthy targets on schedule >= 95% (the daemon's own scrape counters); a probe
alert (true 8 s of every 10 s) fires at most 1 s later than undisturbed; the daemon's memory (PSS of its
processes: the query children it forks share its pages) and the gateway's RSS below 1 GiB; legitimate
gateway requests (with a token, one pair every 10 ms) added p99 under 2.5 ms or within 1 ms of the
undisturbed window's, none refused; nothing crashed (processes there, /healthz 200, the gateway answering
with the same pid). A process past --rss-guard-mib is killed -9 (and counts as crashed) so that the bench
cannot drive a shared machine out of memory. (b) runs whenever a phase from (b) on is asked for: it is the
reference. Every phase is bounded in count and time; everything listens on 127.0.0.1 and is stopped at the
end, also after a failure.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from _gateway_load import closed_loop, cpu_seconds, percentile, request_bytes, sequential
from _harness import Receiver
from _isolation_daemon import (
    Daemon,
    daemon_config,
    gateway_pid,
    launch,
    relaunch,
    stop_daemon,
    with_group_gone,
)
from _isolation_phases import phase_f, phase_g, phase_h, phase_i, report_windows
from _isolation_regex import PATHOLOGICAL, hammer, prometheus_query
from _isolation_window import Context, measure
from gateway import free_port, run, stop, wait_http
from scrape import FIXTURE, free_ports, start_targets

GOAL_P99 = 2.5  # ms added at p99
STREAMS = 16
ALL_PHASES = "abcdefghi"


@dataclass(frozen=True)
class Plan:
    """How much to run."""

    rounds: int  # sequential request pairs per phase
    warmup: int
    targets: int
    settle: float  # seconds for the 100-target daemon to reach steady state
    stream_seconds: float
    window: float  # seconds of each window of (b) and (f)-(i)
    trickles: int  # (f): connections trickling a body, past the API's cap of 512
    bodies: int  # (h): concurrent 16 MiB bodies


FULL = Plan(
    rounds=2000,
    warmup=200,
    targets=100,
    settle=15.0,
    stream_seconds=6.0,
    window=60.0,
    trickles=520,
    bodies=16,
)
QUICK = Plan(
    rounds=400, warmup=50, targets=100, settle=8.0, stream_seconds=4.0, window=24.0, trickles=520, bodies=8
)


def latency(plan: Plan, up: int, gw: int, gw_pid: int, label: str) -> dict[str, Any]:
    """Added p50/p99 (ms) of JSON requests, gateway vs direct, and the gateway's requests per CPU-second."""
    body = json.dumps({"model": "bench", "prompt": "hello", "max_tokens": 16}).encode()
    pairs = [
        (up, request_bytes(up, "/v1/completions", body)),
        (gw, request_bytes(gw, "/v1/completions", body)),
    ]
    run(sequential(pairs, plan.warmup))
    cpu0 = cpu_seconds(gw_pid)
    direct, through = run(sequential(pairs, plan.rounds))
    cpu = cpu_seconds(gw_pid) - cpu0
    row = {"phase": label, "rounds": plan.rounds}
    for name, q in (("p50", 0.5), ("p99", 0.99)):
        d, g = percentile(direct, q) * 1e3, percentile(through, q) * 1e3
        row[f"direct_{name}_ms"], row[f"gateway_{name}_ms"], row[f"added_{name}_ms"] = d, g, g - d
    row["per_cpu_second"] = plan.rounds / cpu if cpu > 0 else float("inf")
    print(
        f"  {label:<44} added p50 {row['added_p50_ms']:6.3f} ms  p99 {row['added_p99_ms']:6.3f} ms  "
        f"({row['per_cpu_second']:.0f} req per gateway CPU-s)",
        flush=True,
    )
    return row


def streams_across_kill(plan: Plan, gw: int, daemon: subprocess.Popen[bytes]) -> dict[str, Any]:
    """16 streaming clients back to back; the daemon is killed -9 a third of the way in."""
    body = json.dumps({"model": "bench", "prompt": "hello", "stream": True}).encode()
    data = request_bytes(gw, "/v1/completions", body)
    killer = threading.Timer(plan.stream_seconds / 3, lambda: os.killpg(daemon.pid, signal.SIGKILL))
    killer.start()
    try:
        done, seconds = run(closed_loop(gw, data, STREAMS, plan.stream_seconds, 10**6))
        lost = 0
    except (ConnectionError, RuntimeError) as exc:
        done, seconds, lost = 0, plan.stream_seconds, 1
        print(f"  streams: {exc}", flush=True)
    killer.join()
    daemon.wait(10)
    row = {"phase": "(e) 16 streams across kill -9 of the daemon", "completed": done, "failed": lost}
    print(f"  {row['phase']:<44} {done} streamed requests in {seconds:.1f} s, failed: {lost}", flush=True)
    return row


class Bench:
    """The processes of one run, and how to end them all."""

    def __init__(self, plan: Plan, tmp: Path, guard_mib: int) -> None:
        self.plan, self.tmp, self.guard = plan, tmp, guard_mib * 1024 * 1024
        self.procs: list[subprocess.Popen[bytes]] = []
        self.daemons: list[Daemon] = []
        self.receiver = Receiver()
        self.up = free_port()
        self.procs.append(upstream := serve("upstream", str(self.up)))
        wait_http(f"http://127.0.0.1:{self.up}/", 30, upstream)
        self.tports: list[int] = []
        self.hostile = 0

    def start_targets(self) -> str:
        """The fake targets: all but one from nginx (or its fallback), the last one able to turn hostile."""
        self.tports = free_ports(self.plan.targets - 1)
        targets, kind = start_targets(self.tmp, self.tports, 3600)
        self.procs.append(targets)
        self.hostile = free_port()
        self.procs.append(hostile := serve("target", str(self.hostile), str(FIXTURE)))
        wait_http(f"http://127.0.0.1:{self.hostile}/metrics", 30, hostile)
        return kind

    def daemon(self, label: str, full: bool) -> Daemon:
        """A daemon: idle (one target, no rules) or full (every target, the bundled rules and the probe)."""
        api, gw = free_port(), free_port()
        cfg = (
            daemon_config(self.tmp, api, gw, self.up, self.tports, True, self.receiver.url, self.hostile)
            if full
            else daemon_config(self.tmp, api, gw, self.up, [], rules=False)
        )
        self.daemons.append(d := launch(cfg, api, gw, self.tmp / f"{label}.log"))
        time.sleep(self.plan.settle)  # past the daemon's start-up (imports, first scrapes)
        return d

    def context(self, d: Daemon) -> Context:
        """What the hostile phases' windows measure."""
        healthy = frozenset(f"t{i:03d}" for i in range(len(self.tports)))
        return Context(d, self.up, self.receiver, healthy, self.guard)

    def recover(self, ctx: Context) -> None:
        """After a phase: a dead daemon starts again; a gateway the daemon restarted is the one to watch."""
        if not ctx.daemon.alive():
            print("  the daemon died: starting it again", flush=True)
            self.daemons.append(d := relaunch(ctx.daemon, self.plan.settle))
            ctx.daemon = d
        pid = gateway_pid(ctx.daemon.api)
        if pid is not None:
            ctx.daemon.gw_pid = pid

    def close(self) -> None:
        """Stop everything this run started, even after a failure."""
        for d in self.daemons:
            with contextlib.suppress(Exception):
                with_group_gone(d)
        for proc in reversed(self.procs):
            try:
                stop(proc)
            except ProcessLookupError:  # not a group leader (nginx): SIGTERM, so that it ends its workers
                proc.terminate()
                try:
                    proc.wait(10)
                except subprocess.TimeoutExpired:
                    proc.kill()  # (a killed nginx master leaves its workers behind)
                    proc.wait(10)
        self.receiver.close()


def serve(*args: str) -> subprocess.Popen[bytes]:
    """A server of bench/_hostile_servers.py in its own process group."""
    argv = [sys.executable, str(Path(__file__).resolve().parent / "_hostile_servers.py"), *args]
    return subprocess.Popen(argv, start_new_session=True)


def phase_a(bench: Bench, rows: list[dict[str, Any]]) -> None:
    """(a) the idle daemon."""
    print("(a) idle daemon: one target, no rules", flush=True)
    d = bench.daemon("a", full=False)
    rows.append(latency(bench.plan, bench.up, d.gw, d.gw_pid, "(a) daemon idle"))
    stop_daemon(d)


def phase_c(bench: Bench, d: Daemon, rows: list[dict[str, Any]], result: dict[str, Any]) -> None:
    """(c) pathological series requests back to back."""
    stop_event, timings = threading.Event(), list[float]()
    worker = threading.Thread(target=hammer, args=(d.api, stop_event, timings))
    worker.start()
    time.sleep(0.5)
    try:
        rows.append(latency(bench.plan, bench.up, d.gw, d.gw_pid, "(c) while pathological API requests run"))
    finally:
        stop_event.set()
        worker.join(120)
    ours = sorted(timings)[len(timings) // 2] if timings else float("nan")
    result["regex_query"] = {"watchdog_seconds": ours, "requests": len(timings)}


def phase_d(bench: Bench, d: Daemon, rows: list[dict[str, Any]]) -> None:
    """(d) the daemon SIGSTOPped."""
    os.kill(d.proc.pid, signal.SIGSTOP)
    try:
        rows.append(latency(bench.plan, bench.up, d.gw, d.gw_pid, "(d) daemon SIGSTOPped"))
    finally:
        os.kill(d.proc.pid, signal.SIGCONT)


def hostile_phases(bench: Bench, ctx: Context, phases: str, windows: list[dict[str, Any]]) -> None:
    """(f)-(i), each followed by a recovery if it killed something."""
    plan = bench.plan
    runs = {
        "f": lambda: phase_f(ctx, bench.tmp, plan.window, plan.trickles),
        "g": lambda: phase_g(ctx, bench.tmp, plan.window),
        "h": lambda: phase_h(ctx, bench.tmp, plan.window, plan.bodies),
        "i": lambda: phase_i(ctx, plan.window, bench.hostile),
    }
    for name in "fghi":
        if name in phases:
            windows.append(runs[name]())
            bench.recover(ctx)


def run_phases(bench: Bench, phases: str, result: dict[str, Any]) -> None:
    """The phases asked for, in the order (a) (b) (c) (d) (f) (g) (h) (i) (e): (e) kills the daemon."""
    rows, windows = result["rows"], result["windows"]
    if "a" in phases:
        phase_a(bench, rows)
    if not set(phases) - {"a"}:
        return
    kind = bench.start_targets()
    print(f"(b)-(i) {bench.plan.targets} fake targets ({kind}; one hostile-capable) at 1 s, bundled rules")
    d = bench.daemon("b", full=True)
    rows.append(
        latency(bench.plan, bench.up, d.gw, d.gw_pid, f"(b) daemon evaluating {bench.plan.targets} targets")
    )
    ctx = bench.context(d)
    windows.append(measure(ctx, "(b) undisturbed window", bench.plan.window, lambda: None))
    if "c" in phases:
        phase_c(bench, d, rows, result)
    if "d" in phases:
        phase_d(bench, d, rows)
    hostile_phases(bench, ctx, phases, windows)
    if "e" in phases:
        rows.append(streams_across_kill(bench.plan, ctx.daemon.gw, ctx.daemon.proc))
        alive = httpx.get(f"http://127.0.0.1:{ctx.daemon.gw}/v1/models", timeout=10).status_code
        result["gateway_after_kill"] = alive
        print(f"  gateway after the daemon's kill -9: HTTP {alive}", flush=True)
    if "c" in phases:
        result["regex_query"]["prometheus"] = prometheus_query(bench.tmp, bench.tports)


def main() -> int:
    """Run the phases and print the report."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="fewer rounds, shorter phases")
    ap.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    ap.add_argument("--phases", default=ALL_PHASES, help="comma-separated subset of a-i (default: all)")
    ap.add_argument("--rss-guard-mib", type=int, default=4096, help="kill -9 a process past this RSS")
    args = ap.parse_args()
    phases = "".join(sorted(set(args.phases.replace(",", "").replace(" ", ""))))
    if not phases or set(phases) - set(ALL_PHASES):
        ap.error(f"--phases takes letters of {ALL_PHASES}")
    plan = QUICK if args.quick else FULL
    tmp = Path(tempfile.mkdtemp(prefix="bench-isolation-"))
    result: dict[str, Any] = {"plan": plan.__dict__, "phases": phases, "rows": [], "windows": []}
    bench = Bench(plan, tmp, args.rss_guard_mib)
    try:
        run_phases(bench, phases, result)
    finally:
        bench.close()
    report(result)
    result["all_goals_met"] = report_windows(result["windows"])
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1, default=str))
    print(f"\nlogs and attack outputs in {tmp}")
    return 0


def report(result: dict[str, Any]) -> None:
    """The table, the regex comparison and the goals."""
    print("\nphase                                          added p50   added p99   req/gw-CPU-s   goal")
    for row in result["rows"]:
        if "added_p99_ms" in row:
            ok = "PASS" if row["added_p99_ms"] < GOAL_P99 else "MISS"
            print(
                f"{row['phase']:<46} {row['added_p50_ms']:8.3f}ms {row['added_p99_ms']:9.3f}ms "
                f"{row['per_cpu_second']:12.0f}   p99<{GOAL_P99}ms {ok}"
            )
        else:
            ok = "PASS" if row["failed"] == 0 and result.get("gateway_after_kill") == 200 else "MISS"
            print(
                f"{row['phase']:<46} {row['completed']} completed, {row['failed']} failed   nothing lost {ok}"
            )
    regex = result.get("regex_query")
    if regex is None:  # (c) did not run
        return
    prom = regex.get("prometheus", {})
    ours = regex.get("watchdog_seconds", float("nan"))
    theirs = prom.get("seconds")
    if theirs:
        print(
            f"\nseries query {PATHOLOGICAL}: watchdog {ours * 1e3:.1f} ms, "
            f"Prometheus 2.42 {theirs * 1e3:.1f} ms (ratio {ours / theirs:.2f})"
        )
    else:
        print(f"\nseries query {PATHOLOGICAL}: watchdog {ours * 1e3:.1f} ms; Prometheus: {prom.get('error')}")


if __name__ == "__main__":
    sys.exit(main())
