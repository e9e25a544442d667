"""Isolation of the data plane: the gateway's added latency whatever the daemon is doing, side by side.

Usage: .venv/bin/python bench/isolation.py [--quick] [--json PATH]

A trivial loopback upstream (bench/gateway.py's) sits behind the watchdog's gateway process, which the daemon
starts. One run measures, each against direct requests to the same upstream interleaved with it (so that the
machine's drift hits both alike):
  (a) the daemon idle (one target, no rules);
  (b) the daemon scraping 100 fake targets (the real vLLM 0.32 payload) at 1 s with the bundled rules;
  (c) as (b), while pathological API requests run back to back (a catastrophic regex over every series);
  (d) as (b), with the daemon SIGSTOPped;
  (e) 16 streaming clients across a kill -9 of the daemon: every request must complete.
Added p50/p99 in ms and requests per gateway CPU-second; the goal is added p99 under 2.5 ms in (a)-(d) and
nothing lost in (e). The same regex query is timed against Prometheus 2.42 scraping the same 100 targets.
Every phase is bounded in count and time; everything listens on 127.0.0.1 and is stopped at the end.
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
from gateway import free_port, run, spawn, stop, wait_http
from scrape import PROMETHEUS, free_ports, start_targets

GOAL_P99 = 2.5  # ms added at p99
PATHOLOGICAL = '{__name__=~"(.+)+Q"}'  # exponential on a backtracking engine, linear on RE2
STREAMS = 16


@dataclass(frozen=True)
class Plan:
    """How much to run."""

    rounds: int  # sequential request pairs per phase
    warmup: int
    targets: int
    settle: float  # seconds for the 100-target daemon to reach steady state
    stream_seconds: float


FULL = Plan(rounds=2000, warmup=200, targets=100, settle=15.0, stream_seconds=6.0)
QUICK = Plan(rounds=400, warmup=50, targets=100, settle=8.0, stream_seconds=4.0)


def daemon_config(tmp: Path, api: int, gw: int, upstream: int, tports: list[int], rules: bool) -> Path:
    """The watchdog's config: the upstream as target vllm-0 behind the gateway, plus the fake targets."""
    targets = [
        {"name": "vllm-0", "url": f"http://127.0.0.1:{upstream}", "canary": False, "health_probe": False}
    ]
    targets += [
        {"name": f"t{i:03d}", "url": f"http://127.0.0.1:{p}", "canary": False, "health_probe": False}
        for i, p in enumerate(tports)
    ]
    cfg = {
        "global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
        "listen": f"127.0.0.1:{api}",
        "rule_files": ["bundled:vllm.rules.yml"] if rules else [],
        "state_dir": str(tmp / f"state-{api}"),
        "targets": targets,
        "gateway": {"listen": f"127.0.0.1:{gw}", "target": "vllm-0"},
    }
    path = tmp / f"watchdog-{api}.yml"
    path.write_text(json.dumps(cfg, indent=1))
    return path


def start_daemon(cfg: Path, api: int, log: Path) -> tuple[subprocess.Popen[bytes], int]:
    """The daemon (which starts its gateway); (daemon, gateway pid) once the gateway answers."""
    with log.open("ab") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "vllm_watchdog", "run", "--config", str(cfg), "--log-level", "warning"],
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the daemon exited with {proc.returncode}; see {log}")
        try:
            data = httpx.get(f"http://127.0.0.1:{api}/api/v1/gateway", timeout=2).json()["data"]
            return proc, int(data["pid"])
        except (httpx.HTTPError, KeyError, ValueError, TypeError):
            time.sleep(0.2)
    raise RuntimeError(f"no gateway after 120 s; see {log}")


def kill_gateway(pid: int) -> None:
    """The gateway outlives a killed daemon by design: stop it explicitly."""
    try:
        os.kill(pid, signal.SIGTERM)
        for _ in range(100):
            os.kill(pid, 0)
            time.sleep(0.1)
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        return


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


def hammer(api: int, stop_event: threading.Event, timings: list[float]) -> None:
    """Pathological API requests back to back until told to stop (each bounded by a 60 s timeout)."""
    with httpx.Client(timeout=60) as client:
        while not stop_event.is_set():
            t0 = time.perf_counter()
            with contextlib.suppress(httpx.HTTPError):
                client.get(f"http://127.0.0.1:{api}/api/v1/series", params={"match[]": PATHOLOGICAL})
            timings.append(time.perf_counter() - t0)


def prometheus_query(tmp: Path, tports: list[int]) -> dict[str, Any]:
    """Prometheus 2.42 scraping the same targets; the time of the same series query (median of 5)."""
    if not Path(PROMETHEUS).exists():
        return {"error": f"{PROMETHEUS} missing (scripts/setup.sh installs it)"}
    port = free_port()
    static = [{"targets": [f"127.0.0.1:{p}" for p in tports]}]
    cfg = {
        "global": {"scrape_interval": "1s", "scrape_timeout": "1s"},
        "scrape_configs": [{"job_name": "vllm", "static_configs": static}],
    }
    (tmp / "prometheus.yml").write_text(json.dumps(cfg))
    argv = [
        PROMETHEUS, f"--config.file={tmp}/prometheus.yml", f"--storage.tsdb.path={tmp}/tsdb",
        f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn",
    ]  # fmt: skip
    with (tmp / "prometheus.log").open("ab") as out:
        prom = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_http(f"http://127.0.0.1:{port}/-/ready", 60, prom)
        time.sleep(4)  # a few scrapes
        return {"seconds": _median_query(f"http://127.0.0.1:{port}")}
    finally:
        stop(prom)


def _median_query(base: str) -> float:
    times = []
    for _ in range(5):
        t0 = time.perf_counter()
        resp = httpx.get(base + "/api/v1/series", params={"match[]": PATHOLOGICAL}, timeout=120)
        times.append(time.perf_counter() - t0)
        resp.raise_for_status()
    return sorted(times)[len(times) // 2]


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


def main() -> int:
    """Run the phases and print the report."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="fewer rounds, shorter phases")
    ap.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    args = ap.parse_args()
    plan = QUICK if args.quick else FULL
    tmp = Path(tempfile.mkdtemp(prefix="bench-isolation-"))
    procs: list[subprocess.Popen[bytes]] = []
    gateways: list[int] = []
    rows: list[dict[str, Any]] = []
    result: dict[str, Any] = {"plan": plan.__dict__, "rows": rows}
    try:
        up = free_port()
        procs.append(upstream := spawn("--serve-upstream", str(up)))
        wait_http(f"http://127.0.0.1:{up}/", 30, upstream)

        print("(a) idle daemon: one target, no rules", flush=True)
        api, gw = free_port(), free_port()
        daemon, pid = start_daemon(daemon_config(tmp, api, gw, up, [], rules=False), api, tmp / "a.log")
        gateways.append(pid)
        time.sleep(plan.settle)  # past the daemon's start-up (imports, first scrapes), as in (b)
        rows.append(latency(plan, up, gw, pid, "(a) daemon idle"))
        stop(daemon)
        kill_gateway(pid)

        tports = free_ports(plan.targets)
        targets, kind = start_targets(tmp, tports, 3600)
        procs.append(targets)
        print(f"(b)-(e) {plan.targets} fake targets ({kind}) at 1 s, bundled rules", flush=True)
        api, gw = free_port(), free_port()
        daemon, pid = start_daemon(daemon_config(tmp, api, gw, up, tports, rules=True), api, tmp / "b.log")
        gateways.append(pid)
        time.sleep(plan.settle)
        rows.append(latency(plan, up, gw, pid, f"(b) daemon evaluating {plan.targets} targets"))

        stop_event, timings = threading.Event(), []
        worker = threading.Thread(target=hammer, args=(api, stop_event, timings))
        worker.start()
        time.sleep(0.5)
        rows.append(latency(plan, up, gw, pid, "(c) while pathological API requests run"))
        stop_event.set()
        worker.join(120)
        ours = sorted(timings)[len(timings) // 2] if timings else float("nan")
        result["regex_query"] = {"watchdog_seconds": ours, "requests": len(timings)}

        os.kill(daemon.pid, signal.SIGSTOP)
        try:
            rows.append(latency(plan, up, gw, pid, "(d) daemon SIGSTOPped"))
        finally:
            os.kill(daemon.pid, signal.SIGCONT)
        rows.append(streams_across_kill(plan, gw, daemon))
        alive = httpx.get(f"http://127.0.0.1:{gw}/v1/models", timeout=10).status_code
        result["gateway_after_kill"] = alive
        print(f"  gateway after the daemon's kill -9: HTTP {alive}", flush=True)

        result["regex_query"]["prometheus"] = prometheus_query(tmp, tports)
    finally:
        for pid in gateways:
            kill_gateway(pid)
        for proc in reversed(procs):
            with contextlib.suppress(ProcessLookupError):  # not a group leader (nginx): end it directly
                stop(proc)
            if proc.poll() is None:
                proc.kill()
    report(result)
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
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
    regex = result.get("regex_query", {})
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
