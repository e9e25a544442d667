"""Load benchmark: vllm-watchdog vs. Prometheus 2.42 scraping N fake vLLM targets every 1 s.

Usage: .venv/bin/python bench/scrape.py [--targets 1,8,100] [--mode both|live|static] [--warmup 20]
       [--duration 60] [--rss-every S] [--profile DIR] [--json PATH]

First times parsing one real vLLM 0.32 /metrics payload (prometheus_client, our `parse`, and the
daemon's hot path `ScrapeTarget.ingest` with a warm cache), before any load runs. Then serves the
payload from N loopback ports (nginx, or a one-process asyncio server if nginx is unavailable),
runs the daemon and Prometheus side by side against them with the bundled rules, and after a
warm-up measures CPU, RSS, missed deadlines and skipped scrapes over a window. Two modes (`--mode both`,
the default, runs static then live for each target count and prints them side by side): static serves the
capture as it is (no counter ever moves, so every rate() is 0 and most rules return nothing); live serves it
with every counter, histogram bucket, _count and _sum advancing on every scrape at a busy server's rates
(bench/_live_targets.py), as under real traffic. `--profile DIR` records the daemon with py-spy over the
window and prints where its CPU goes (rule evaluation, parse, store, HTTP, scheduling, self feed).
With several target counts
(`--targets 1,8,100`) it runs one load after the other and ends with the cost per target (CPU ms per target
per second) of both. A long window (`--duration 1800`) also prints both processes' RSS every 10 minutes
(`--rss-every` to choose), to show whether memory stays flat. Prints numbers, ratios and informational
PASS/MISS against the goals; exits non-zero only if setup fails.
"""

from __future__ import annotations

import argparse
import asyncio
import ctypes
import itertools
import json
import math
import os
import platform
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import _profile
import httpx
from _live_cycle import run as run_cycle
from _live_targets import serve_live
from parse import median_seconds  # bench/ is on sys.path when run as a script
from prometheus_client.parser import text_string_to_metric_families

from vllm_watchdog.config.model import GlobalConfig, bundled_rules_dir
from vllm_watchdog.ruler.files import load_rule_files, store_needs
from vllm_watchdog.sources.exposition import parse
from vllm_watchdog.sources.scrape import ScrapeTarget
from vllm_watchdog.sources.storeneeds import ALWAYS_KEPT
from vllm_watchdog.store import SampleStore

FIXTURE = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "vllm-0.32.0-metrics.txt"
RULES = bundled_rules_dir() / "vllm.rules.yml"
PROMETHEUS = "/usr/bin/prometheus"
TICK = os.sysconf("SC_CLK_TCK")
# Own metrics read at the window's edges: sample name -> short key (values summed over labels).
DAEMON_METRICS = {"vllm_watchdog_scrapes_total": "scrapes", "vllm_watchdog_scrape_errors_total": "errors"}
DAEMON_METRICS |= {"vllm_watchdog_missed_deadlines_total": "missed", "vllm_watchdog_target_up": "up"}
STORE_METRICS = {"vllm_watchdog_store_samples": "samples", "vllm_watchdog_store_series": "series"}
PROM_METRICS = {"prometheus_target_interval_length_seconds_count": "scrapes"}  # +1 per scrape
PROM_METRICS |= {"prometheus_rule_group_rules": "rules", "prometheus_rule_evaluations_total": "evals"}
PROM_METRICS |= {"prometheus_rule_group_iterations_missed_total": "missed"}


# -- parse timing ---------------------------------------------------------------------------------
def parse_timings(text: str, runs: int) -> dict[str, float]:
    """Seconds per payload: library parser, our parse, and ScrapeTarget.ingest without/with keep."""
    needs = store_needs(load_rule_files([str(RULES)]), GlobalConfig().lookback_delta)
    keep = (needs.names | ALWAYS_KEPT).__contains__ if needs.names else None  # as Monitor does

    def ingest(keep_name: Callable[[str], bool] | None) -> Callable[[], object]:
        target = ScrapeTarget(
            url="http://127.0.0.1:9/metrics", job="vllm", instance="bench", store=SampleStore(3600.0),
            timeout=1.0, sample_limit=20_000, body_size_limit=1 << 24, keep_name=keep_name,
        )  # fmt: skip
        t_ms = itertools.count(1_700_000_000_000, 1000)
        target.ingest(text, next(t_ms))  # warm the per-target series cache
        return lambda: target.ingest(text, next(t_ms))

    def library() -> object:
        return [s for fam in text_string_to_metric_families(text) for s in fam.samples]

    out = {
        "library": median_seconds(library, runs),
        "parse": median_seconds(lambda: parse(text), runs),
        "ingest_all": median_seconds(ingest(None), runs),
        "ingest_rules": median_seconds(ingest(keep), runs),
        "kept_samples": float(sum(1 for name, *_ in parse(text) if keep is None or keep(name))),
    }
    return out


# -- processes ------------------------------------------------------------------------------------
def _die_with_parent() -> None:
    """preexec_fn: SIGTERM the child if this benchmark dies, so no load outlives it."""
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def spawn(argv: list[str], log: Path) -> subprocess.Popen[bytes]:
    """Start a child with stdout and stderr in `log` (preexec_fn is safe: we start no threads)."""
    with log.open("wb") as out:
        return subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, preexec_fn=_die_with_parent)  # noqa: PLW1509


def free_ports(n: int) -> list[int]:
    """n distinct free TCP ports on 127.0.0.1 (all held open until chosen)."""
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def ensure_nginx() -> str | None:
    """The nginx binary, installed with apt if missing and possible; None to use the fallback."""
    path = os.environ.get("PATH", "") + ":/usr/sbin"
    if not shutil.which("nginx", path=path) and os.geteuid() == 0 and shutil.which("apt-get"):
        print("nginx missing: apt-get install -y nginx-light", flush=True)
        apt = ["apt-get", "install", "-y", "nginx-light"]
        subprocess.run(apt, check=False, capture_output=True, timeout=600)
    return shutil.which("nginx", path=path)


def start_targets(
    tmp: Path, ports: list[int], lifetime: float, live: bool
) -> tuple[subprocess.Popen[bytes], str]:
    """Serve the fixture at /metrics (and 200 at /health) on every port; return process and kind. Live: the
    counters move on every scrape (one python asyncio process); static: nginx serves the file as it is."""
    if live:
        argv = [sys.executable, __file__, "--serve-live", str(lifetime), *map(str, ports)]
        return spawn(argv, tmp / "targets.log"), "live: counters moving, python asyncio"
    nginx = ensure_nginx()
    if nginx is None:
        argv = [sys.executable, __file__, "--serve", str(lifetime), *map(str, ports)]
        return spawn(argv, tmp / "targets.log"), "python asyncio, nginx unavailable"
    www = tmp / "www"
    www.mkdir()
    shutil.copy(FIXTURE, www / "metrics")
    for d in (tmp, www):
        d.chmod(0o755)  # readable by nginx' unprivileged worker
    listen = "".join(f"    listen 127.0.0.1:{p};\n" for p in ports)
    temps = "".join(f"  {k}_temp_path {tmp}/{k};\n" for k in ("client_body", "proxy", "fastcgi", "scgi"))
    (tmp / "nginx.conf").write_text(
        f"daemon off;\nworker_processes 1;\npid {tmp}/nginx.pid;\nerror_log {tmp}/nginx-error.log warn;\n"
        f"events {{ worker_connections 4096; }}\nhttp {{\n  access_log off;\n  sendfile on;\n{temps}"
        f"  keepalive_requests 1000000;\n  server {{\n{listen}    root {www};\n"
        '    location = /metrics { default_type "text/plain; version=0.0.4"; }\n'
        '    location = /health { default_type text/plain; return 200 "OK\\n"; }\n  }\n}\n'
    )
    version = subprocess.run([nginx, "-v"], check=False, capture_output=True, text=True).stderr.strip()
    argv = [nginx, "-e", f"{tmp}/nginx-error.log", "-p", str(tmp), "-c", str(tmp / "nginx.conf")]
    return spawn(argv, tmp / "targets.log"), version.replace("nginx version: ", "")


async def _serve(ports: list[int], lifetime: float) -> None:
    """Fallback fake targets: one asyncio process, HTTP/1.1 keep-alive, stops after `lifetime` s."""
    body = FIXTURE.read_bytes()
    head = b"HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: %d\r\n\r\n"
    replies = {b"/metrics": head % len(body) + body, b"/health": head % 3 + b"OK\n"}

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                request = await reader.readuntil(b"\r\n\r\n")
                path = request.split(b" ", 2)[1]
                writer.write(replies.get(path, b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n"))
                await writer.drain()
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError, IndexError):
            writer.close()

    servers = [await asyncio.start_server(handle, "127.0.0.1", p) for p in ports]
    await asyncio.sleep(lifetime)
    for s in servers:
        s.close()


def wait_http(urls: list[str], proc: subprocess.Popen[bytes], log: Path, timeout: float = 30.0) -> None:
    """Poll each url until it answers 200; exit with the child's log if it dies or never gets ready."""
    deadline = time.monotonic() + timeout
    with httpx.Client(timeout=1.0, trust_env=False) as client:
        while urls and time.monotonic() < deadline and proc.poll() is None:
            try:
                if client.get(urls[0]).status_code == 200:
                    urls = urls[1:]
                    continue
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
    if urls:
        tail = log.read_text(errors="replace")[-2000:] if log.exists() else ""
        raise SystemExit(f"setup failed: {urls[0]} not ready (exit code {proc.poll()}):\n{tail}")


def stop(procs: list[subprocess.Popen[bytes]]) -> None:
    """SIGTERM every child we started, then SIGKILL what is still there after 10 s."""
    for p in procs:
        if p.poll() is None:
            p.terminate()
    for p in procs:
        try:
            p.wait(10)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def write_configs(tmp: Path, dport: int, pport: int, tports: list[int]) -> tuple[list[str], list[str]]:
    """Write both configs (JSON is YAML); return the daemon's and Prometheus' command lines."""
    glob = {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"}
    targets = [
        {"name": f"t{i:03d}", "url": f"http://127.0.0.1:{p}", "canary": False, "health_probe": False}
        for i, p in enumerate(tports)
    ]
    cfg = {"global": glob, "listen": f"127.0.0.1:{dport}", "rule_files": ["bundled:vllm.rules.yml"]}
    (tmp / "watchdog.yml").write_text(json.dumps({**cfg, "targets": targets}, indent=1))
    static = [{"targets": [f"127.0.0.1:{p}" for p in tports]}]
    scrape_configs = [{"job_name": "vllm", "static_configs": static}]
    prom = {"global": glob, "rule_files": [str(RULES)], "scrape_configs": scrape_configs}
    (tmp / "prometheus.yml").write_text(json.dumps(prom, indent=1))
    daemon = [sys.executable, "-m", "vllm_watchdog", "run", "--config", f"{tmp}/watchdog.yml"]
    return [*daemon, "--log-level", "warning"], [
        PROMETHEUS, f"--config.file={tmp}/prometheus.yml", f"--storage.tsdb.path={tmp}/tsdb",
        "--storage.tsdb.retention.time=10m", f"--web.listen-address=127.0.0.1:{pport}", "--log.level=warn",
    ]  # fmt: skip


# -- measurements ---------------------------------------------------------------------------------
def cpu_seconds(pids: list[int]) -> float:
    """utime+stime of these processes (all threads), in seconds."""
    total = 0
    for pid in pids:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])
    return total / TICK


def rss_mib(pids: list[int]) -> float:
    """Summed VmRSS of these processes, in MiB."""
    lines = [ln for pid in pids for ln in Path(f"/proc/{pid}/status").read_text().splitlines()]
    return sum(int(ln.split()[1]) for ln in lines if ln.startswith("VmRSS:")) / 1024


def machine_busy() -> tuple[int, int]:
    """(busy, total) jiffies of all CPUs from /proc/stat."""
    v = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return sum(v) - v[3] - v[4], sum(v)


def own_metrics(port: int, names: dict[str, str]) -> dict[str, float]:
    """Sums of some samples of a process' own /metrics by short key; `rule` counts rule samples."""
    # 30 s: on a loaded machine a starved daemon or Prometheus can take seconds to answer
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=30.0, trust_env=False).text
    out = dict.fromkeys([*names.values(), "rule"], 0.0)
    for name, _labels, value, _ts in parse(text):
        if name in names:
            out[names[name]] += value
        out["rule"] += "rule" in name  # does this build report rule evaluation at all?
    return out


def store(port: int) -> tuple[float, float]:
    """Samples and series the daemon's store holds: how much of its RSS over time is data it must keep."""
    held = own_metrics(port, STORE_METRICS)
    return held["samples"], held["series"]


def prometheus_up(port: int) -> int:
    """How many targets Prometheus' `up` says are up."""
    url = f"http://127.0.0.1:{port}/api/v1/query"
    result = httpx.get(url, params={"query": "up"}, timeout=30.0, trust_env=False).json()["data"]["result"]
    return sum(1 for s in result if s["value"][1] == "1")


def run_load(args: argparse.Namespace, tmp: Path, res: dict[str, Any]) -> None:
    """Start `args.targets` targets, daemon and Prometheus; warm up; measure over the window; fill res."""
    dport, pport, *tports = free_ports(args.targets + 2)
    procs: list[subprocess.Popen[bytes]] = []
    try:
        life = args.warmup + args.duration + 120
        targets, res["targets_server"] = start_targets(tmp, tports, life, args.mode == "live")
        procs.append(targets)
        wait_http([f"http://127.0.0.1:{p}/health" for p in tports], targets, tmp / "targets.log", 15.0)
        daemon_argv, prom_argv = write_configs(tmp, dport, pport, tports)
        procs.append(daemon := spawn(daemon_argv, tmp / "daemon.log"))
        procs.append(prom := spawn(prom_argv, tmp / "prometheus.log"))
        wait_http([f"http://127.0.0.1:{dport}/healthz"], daemon, tmp / "daemon.log")
        wait_http([f"http://127.0.0.1:{pport}/-/ready"], prom, tmp / "prometheus.log")
        print(f"warming up {args.warmup:g} s, then measuring {args.duration:g} s ...", flush=True)
        time.sleep(args.warmup)
        kids = [int(k) for k in Path(f"/proc/{targets.pid}/task/{targets.pid}/children").read_text().split()]
        groups = {"daemon": [daemon.pid], "prometheus": [prom.pid], "targets": [targets.pid, *kids]}
        d0, p0 = own_metrics(dport, DAEMON_METRICS), own_metrics(pport, PROM_METRICS)
        busy0, cpu0, m0 = machine_busy(), {k: cpu_seconds(v) for k, v in groups.items()}, time.monotonic()
        rss_start = {k: rss_mib(v) for k, v in groups.items()}
        prof = tmp / f"daemon-{args.mode}-{args.targets}.txt"
        spy = _profile.start(daemon.pid, args.duration, prof) if args.profile else None
        rss_max = dict.fromkeys(groups, 0.0)
        every = args.rss_every or (600.0 if args.duration >= 1200 else 0.0)
        res["rss_over_time"] = over_time = [(0.0, rss_start["daemon"], rss_start["prometheus"], store(dport))]
        next_mark = every or math.inf
        while (left := m0 + args.duration - time.monotonic()) > 0:
            rss = {k: rss_mib(v) for k, v in groups.items()}
            rss_max = {k: max(rss_max[k], rss[k]) for k in groups}
            if (elapsed := time.monotonic() - m0) >= next_mark:
                over_time.append((elapsed, rss["daemon"], rss["prometheus"], held := store(dport)))
                next_mark += every
                print(f"  {elapsed / 60:5.1f} min: RSS daemon {rss['daemon']:.1f} MiB, "
                      f"prometheus {rss['prometheus']:.1f} MiB; the daemon's store holds {held[0]:.0f} "
                      f"samples of {held[1]:.0f} series", flush=True)  # fmt: skip
            time.sleep(min(1.0, left))
        busy1, cpu1, m1 = machine_busy(), {k: cpu_seconds(v) for k, v in groups.items()}, time.monotonic()

        d1, p1 = own_metrics(dport, DAEMON_METRICS), own_metrics(pport, PROM_METRICS)
        window = res["window_s"] = m1 - m0
        res["machine_busy_pct"] = 100 * (busy1[0] - busy0[0]) / (busy1[1] - busy0[1])
        res["scrapes_expected"] = args.targets * window
        if every:
            over_time.append((window, rss_mib(groups["daemon"]), rss_mib(groups["prometheus"]), store(dport)))
        for k, v in groups.items():
            res[k] = {"cpu_pct": 100 * (cpu1[k] - cpu0[k]) / window, "rss_end_mib": rss_mib(v)}
            res[k]["rss_start_mib"] = rss_start[k]
            res[k]["rss_max_mib"] = max(rss_max[k], res[k]["rss_end_mib"])
        for k, a, b in (("daemon", d0, d1), ("prometheus", p0, p1)):
            res[k] |= {f"{n}_delta": b[n] - a[n] for n in a if n not in ("up", "rule")}
            res[k]["rule_samples"] = b["rule"]
            res[k]["scrapes_not_done"] = res["scrapes_expected"] - res[k]["scrapes_delta"]
        res["daemon"]["targets_up"], res["prometheus"]["targets_up"] = d1["up"], prometheus_up(pport)
        res["prometheus"]["rules_loaded"] = p1["rules"]
        if spy is not None:
            spy.wait(60)
            res["profile"] = _profile.report(prof, res["daemon"]["cpu_pct"])
            shutil.copy(prof, args.profile / prof.name) if prof.exists() else None
    finally:
        stop(procs)


# -- report ---------------------------------------------------------------------------------------
def _goal(label: str, value: str, ok: bool) -> str:
    return f"  {label:<44}{value:>12}   {'PASS' if ok else 'MISS'}"


def report(res: dict[str, Any], args: argparse.Namespace) -> None:
    """Print the numbers, ratios and goals."""
    p, lib = res["parse"], res["parse"]["library"]
    print(f"\nmachine: nproc={res['nproc']}, loadavg before start {res['loadavg']}, {res['python']}")
    print(f"payload: {FIXTURE.name}: {res['payload_kb']:.1f} kB, {res['samples']} samples "
          f"({p['kept_samples']:.0f} of them named by the bundled rules)")  # fmt: skip
    print(f"\nparse time per payload (median of {args.runs} runs, before any load):")
    rows = {"library": "prometheus_client text_string_to_metric_families"}
    rows |= {
        "parse": "vllm_watchdog.sources.exposition.parse",
        "ingest_all": "ScrapeTarget.ingest, keep_name=None",
    }
    rows |= {"ingest_rules": "ScrapeTarget.ingest, keep_name=rule names (daemon)"}
    for key, label in rows.items():
        print(f"  {label:<52}{p[key] * 1e3:8.3f} ms  {p[key] / lib:6.3f}x library")
    d, pr, t, window = res["daemon"], res["prometheus"], res["targets"], res["window_s"]
    print(f"\nload ({args.mode}): {args.targets} targets ({res['targets_server']}), scrape + evaluation 1 s, "
          f"warm-up {args.warmup:g} s, window {window:.1f} s")  # fmt: skip
    heads = f"{'CPU % of a core':>16}{'RSS start MiB':>14}{'RSS end MiB':>14}{'RSS max MiB':>14}"
    print(f"  {'process':<28}{heads}")
    for label, r in (("vllm-watchdog (python)", d), ("prometheus 2.42", pr), ("fake targets", t)):
        rss = f"{r['rss_start_mib']:14.1f}{r['rss_end_mib']:14.1f}{r['rss_max_mib']:14.1f}"
        print(f"  {label:<28}{r['cpu_pct']:16.1f}{rss}")
    busy, ours = res["machine_busy_pct"], (d["cpu_pct"] + pr["cpu_pct"] + t["cpu_pct"]) / res["nproc"]
    print(f"  machine busy {busy:.1f}% of all {res['nproc']} cores: these three {ours:.1f}%, "
          f"everything else (this script, other load) {busy - ours:.1f}%")  # fmt: skip
    if len(res["rss_over_time"]) > 1:
        print("RSS over the window (MiB):")
        print(f"  {'minute':>8}{'vllm-watchdog':>16}{'prometheus':>14}{'store samples':>16}{'series':>9}")
        for elapsed, ours, theirs, (samples, series) in res["rss_over_time"]:
            print(f"  {elapsed / 60:8.1f}{ours:16.1f}{theirs:14.1f}{samples:16.0f}{series:9.0f}")
    print(f"target scrapes expected: {args.targets} targets x {window:.1f} s = {res['scrapes_expected']:.0f}")
    for label, r in (("daemon", d), ("prometheus", pr)):
        not_done = r["scrapes_not_done"]
        print(f"  {label:<11} done {r['scrapes_delta']:5.0f}, not done {not_done:4.0f} "
              f"({not_done / window:5.2f}/s), up at end {r['targets_up']:.0f}/{args.targets}")  # fmt: skip
    print(f"daemon: missed deadlines {d['missed_delta']:.0f}, scrape errors {d['errors_delta']:.0f}")
    print(f"prometheus: rules loaded {pr['rules_loaded']:.0f}, rule evaluations {pr['evals_delta']:.0f}, "
          f"rule group iterations missed {pr['missed_delta']:.0f}")  # fmt: skip
    if not d["rule_samples"]:
        print("note: the daemon's /metrics has no rule metrics: this build may not evaluate rules yet")
    cpu_ratio = d["cpu_pct"] / pr["cpu_pct"] if pr["cpu_pct"] else float("inf")
    print("\ngoals (informational):")
    for key, label in (("ingest_rules", "daemon ingest"), ("ingest_all", "ingest, keep all")):
        print(_goal(f"parse ({label}) <= 0.2x library", f"{p[key] / lib:.3f}x", p[key] <= 0.2 * lib))
    rss_ratio = d["rss_max_mib"] / pr["rss_max_mib"] if pr["rss_max_mib"] else float("inf")
    if args.targets >= 100:  # the goals are set for 100 targets
        print(_goal("daemon CPU <= 1.0x Prometheus", f"{cpu_ratio:.2f}x", cpu_ratio <= 1.0))
        print(_goal("daemon CPU <= 0.5x Prometheus (stretch)", f"{cpu_ratio:.2f}x", cpu_ratio <= 0.5))
        print(_goal("daemon RSS <= 0.5x Prometheus (max sampled)", f"{rss_ratio:.2f}x", rss_ratio <= 0.5))
    else:
        print(f"  (CPU {cpu_ratio:.2f}x and RSS {rss_ratio:.2f}x Prometheus: goals set at 100 targets)")
    if args.targets <= 8:
        cpu = d["cpu_pct"]
        print(_goal(f"{args.targets} targets: daemon CPU <= 2% of one core", f"{cpu:.1f}%", cpu <= 2))
    print(_goal("zero missed deadlines", f"{d['missed_delta']:.0f}", d["missed_delta"] == 0))


def per_target(runs: dict[tuple[int, str], dict[str, Any]]) -> None:
    """Both modes side by side for each target count: CPU and RSS of both processes and their ratios, the CPU
    per scrape done (ms) and the share of the expected scrapes each did."""
    print(
        "\nside by side (CPU % of one core, RSS max MiB; ratio = vllm-watchdog / prometheus in the same run):"
    )
    print("  (a starved process skips scrapes and so spends less: 'ms/scrape' is CPU per scrape it did)")
    head = f"{'CPU wd':>9}{'CPU prom':>10}{'ratio':>7}{'RSS wd':>9}{'RSS prom':>10}{'ratio':>7}"
    head += f"{'ms/scrape wd':>14}{'prom':>7}{'ratio':>7}{'done wd':>9}{'prom':>6}"
    print(f"  {'targets':>8} {'mode':<7}{head}")
    for (n, mode), res in sorted(runs.items()):
        d, p = res["daemon"], res["prometheus"]
        cpu_r = d["cpu_pct"] / p["cpu_pct"] if p["cpu_pct"] else float("inf")
        rss_r = d["rss_max_mib"] / p["rss_max_mib"] if p["rss_max_mib"] else float("inf")
        window = res["window_s"]
        per = [r["cpu_pct"] * 10 * window / max(r["scrapes_delta"], 1) for r in (d, p)]
        done = [100 * r["scrapes_delta"] / res["scrapes_expected"] for r in (d, p)]
        cost = f"{per[0]:14.3f}{per[1]:7.3f}{per[0] / per[1]:7.2f}{done[0]:8.0f}%{done[1]:5.0f}%"
        print(f"  {n:>8} {mode:<7}{d['cpu_pct']:9.1f}{p['cpu_pct']:10.1f}{cpu_r:7.2f}{d['rss_max_mib']:9.1f}"
              f"{p['rss_max_mib']:10.1f}{rss_r:7.2f}{cost}")  # fmt: skip


def main() -> int:
    """Parse arguments, time parsing, run the load, print and optionally save the results."""
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--targets", default="100", help="fake vLLM targets, or a list: 1,8,100 (default 100)")
    ap.add_argument("--warmup", type=float, default=20.0, help="seconds before measuring (default 20)")
    ap.add_argument("--duration", type=float, default=60.0, help="measurement window in s (default 60)")
    ap.add_argument(
        "--rss-every",
        type=float,
        default=0.0,
        help="print both RSS every this many seconds of the window (default: 600 from a 1200 s window on)",
    )
    ap.add_argument("--mode", choices=("both", "live", "static"), default="both",
                    help="live: counters move every scrape; static: the capture as is; both")  # fmt: skip
    ap.add_argument(
        "--profile", type=Path, help="record the daemon with py-spy; save the stacks in this folder"
    )
    ap.add_argument("--cycle", type=int, default=0, help="only N in-process live cycles (CPU)")
    ap.add_argument("--cycle-history", type=int, default=2460, help="simulated seconds before --cycle")
    ap.add_argument("--runs", type=int, default=51, help="parse timing runs (default 51)")
    ap.add_argument("--json", type=Path, help="also write the results as JSON here")
    ap.add_argument("--serve", nargs="+", help=argparse.SUPPRESS)  # internal: LIFETIME PORT...
    ap.add_argument("--serve-live", nargs="+", help=argparse.SUPPRESS)  # internal: LIFETIME PORT...
    args = ap.parse_args()
    if args.serve or args.serve_live:
        lifetime, *ports = args.serve or args.serve_live
        server = _serve if args.serve else lambda p, t: serve_live(FIXTURE.read_text(), p, t)
        asyncio.run(server([int(p) for p in ports], float(lifetime)))
        return 0
    if args.cycle:
        for n in [int(x) for x in str(args.targets).split(",")]:
            run_cycle(FIXTURE, n, args.cycle_history, args.cycle, args.profile is not None)
        return 0
    if args.profile:
        args.profile.mkdir(parents=True, exist_ok=True)
    if not os.access(PROMETHEUS, os.X_OK):
        print(f"{PROMETHEUS} not found: install it with `apt-get install prometheus`", file=sys.stderr)
        return 2
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # run the cleanup in `finally`
    text = FIXTURE.read_text()
    base: dict[str, Any] = {"nproc": os.cpu_count(), "loadavg": " ".join(f"{x:.2f}" for x in os.getloadavg())}
    base |= {"python": f"Python {platform.python_version()}", "payload_kb": len(text.encode()) / 1000}
    base |= {"samples": len(parse(text)), "parse": parse_timings(text, args.runs)}
    runs: dict[tuple[int, str], dict[str, Any]] = {}
    modes = ("static", "live") if args.mode == "both" else (args.mode,)
    for n, mode in itertools.product([int(x) for x in str(args.targets).split(",")], modes):
        run_args = argparse.Namespace(**{**vars(args), "targets": n, "mode": mode})
        res = runs[n, mode] = dict(base) | {"mode": mode}
        with tempfile.TemporaryDirectory(prefix="vw-bench-") as tmp:
            run_load(run_args, Path(tmp), res)
        report(res, run_args)
    per_target(runs)
    if args.json:
        saved = {f"{n}/{mode}": r for (n, mode), r in runs.items()}
        args.json.write_text(json.dumps(saved, indent=2, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
