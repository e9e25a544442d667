"""The measurement window of bench/isolation.py's phases (b) and (f)-(i): what a disturbance did.

For SECONDS, while a disturbance runs (another process, or a hostile target switched on): legitimate gateway
requests paced every PACE s, each beside a direct one (added latency, and any answer but 200); the daemon's
process tree and the gateway sampled for RSS every 0.1 s; the probe alert's firings. Before and after, the
daemon's own scrape counters. The result is one row: scrapes on schedule, the probe's fire delay, peak
RSS, legitimate p50/p99, and whether the daemon and the gateway are still there and answering.
"""

from __future__ import annotations

import asyncio
import math
import os
import signal
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import httpx
from _gateway_load import ClientProtocol, connect, percentile, request_bytes
from _harness import Receiver
from _isolation_daemon import PROBE_CYCLE, PROBE_PATH, PROBE_TRUE_FROM, Daemon, gateway_pid
from gateway import run

from vllm_watchdog.sources.exposition import parse

MiB = 1024 * 1024
PACE = 0.01  # seconds between legitimate request pairs
LEGIT_TIMEOUT = 10.0
RAMP = 1.0  # a probe cycle counts if its condition turns true at least this long after the window opens


class Disturbance(Protocol):
    """Something running against the daemon or the gateway; finish() stops it and says what it saw."""

    def finish(self) -> dict[str, Any]: ...


@dataclass
class Context:
    """What a window measures: the daemon, the upstream, the probe's receiver, which targets are healthy."""

    daemon: Daemon
    upstream: int
    receiver: Receiver
    healthy: frozenset[str]
    guard_bytes: int


# -- RSS ------------------------------------------------------------------------------------------
def rss(pid: int, field: str = "VmRSS", source: str = "status") -> int:
    """A process' VmRSS (or VmHWM; or Pss from smaps_rollup) in bytes; 0 if it is gone."""
    try:
        for line in Path(f"/proc/{pid}/{source}").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        return 0
    return 0


def descendants(root: int) -> set[int]:
    """`root` and every process below it."""
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
                parents[int(entry)] = int(stat.rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
    tree, grew = {root}, True
    while grew:
        below = {pid for pid, ppid in parents.items() if ppid in tree} - tree
        tree |= below
        grew = bool(below)
    return tree


class RssWatch(threading.Thread):
    """Peak memory of the daemon's tree (gateway excluded; PSS, so that the query children it forks count
    only what they do not share with it) and the gateway's RSS; any process of either whose RSS passes the
    guard is killed -9 so that the shared machine is not driven out of memory (recorded as a crash)."""

    def __init__(self, daemon_pid: int, gateway: int, guard: int) -> None:
        super().__init__(name="rss-watch", daemon=True)
        self.daemon_pid, self.gateway, self.guard = daemon_pid, gateway, guard
        self.peak_daemon = self.peak_gateway = 0
        self.killed: list[str] = []
        self.done = threading.Event()

    def run(self) -> None:
        tree: set[int] = set()
        rounds = 0
        while not self.done.wait(0.1):
            if rounds % 10 == 0:
                tree = descendants(self.daemon_pid) - {self.gateway}
            rounds += 1
            sizes = {pid: rss(pid) for pid in tree}
            gw = rss(self.gateway)
            shared = sum(rss(pid, "Pss", "smaps_rollup") for pid in tree)
            self.peak_daemon = max(self.peak_daemon, shared)
            self.peak_gateway = max(self.peak_gateway, gw)
            for pid, size in [*sizes.items(), (self.gateway, gw)]:
                if size > self.guard:
                    self.killed.append(f"pid {pid} at {size / MiB:.0f} MiB")
                    with _gone():
                        os.kill(pid, signal.SIGKILL)

    def stop(self) -> dict[str, Any]:
        """Stop sampling; the peaks in MiB (and the daemon's lifetime VmHWM)."""
        self.done.set()
        self.join(5)
        return {
            "daemon_pss_peak_mib": self.peak_daemon / MiB,
            "daemon_vmhwm_mib": rss(self.daemon_pid, "VmHWM") / MiB,
            "gateway_rss_peak_mib": self.peak_gateway / MiB,
            "guard_killed": self.killed,
        }


class _gone:
    """Suppress ProcessLookupError (a process that ended on its own)."""

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: object, exc: object, tb: object) -> bool:
        return kind is ProcessLookupError


# -- the daemon's view ----------------------------------------------------------------------------
def scrape_counts(api: int, healthy: frozenset[str]) -> dict[str, float]:
    """Own counters at a moment: scrapes and failed scrapes of the healthy targets, of the hostile one,
    missed scrape deadlines, series in the store; `at` is the middle of the request."""
    t0 = time.time()
    text = httpx.get(f"http://127.0.0.1:{api}/metrics", timeout=30.0, trust_env=False).text
    out = dict.fromkeys(("scrapes", "errors", "hostile_scrapes", "hostile_errors", "missed", "series"), 0.0)
    for name, labels, value, _ in parse(text):
        target = labels.get("target", "")
        if name in ("vllm_watchdog_scrapes_total", "vllm_watchdog_scrape_errors_total"):
            kind = "scrapes" if name == "vllm_watchdog_scrapes_total" else "errors"
            if target in healthy:
                out[kind] += value
            elif target == "hostile":
                out[f"hostile_{kind}"] += value
        elif name == "vllm_watchdog_missed_deadlines_total" and labels.get("job") == "scrape":
            out["missed"] += value
        elif name == "vllm_watchdog_store_series":
            out["series"] = value
    out["at"] = (t0 + time.time()) / 2
    return out


def fire_delays(receiver: Receiver, start: float, end: float) -> list[float]:
    """For each probe cycle whose condition turned true in the window (and had time to fire in it): how long
    after that wall-clock moment the firing webhook arrived (inf: it never did). Undisturbed this is the
    `for` (4.5 s) rounded up to the group's next evaluation, plus the evaluation's phase within the second
    (constant while the daemon runs: its scrapes trigger the evaluation) and the delivery."""
    delays = []
    k = math.ceil((start + RAMP - PROBE_TRUE_FROM) / PROBE_CYCLE)
    while (true_at := k * PROBE_CYCLE + PROBE_TRUE_FROM) + (PROBE_CYCLE - PROBE_TRUE_FROM) <= end:
        fired = receiver.first(PROBE_PATH, "firing", true_at)
        ends = (k + 1) * PROBE_CYCLE
        delays.append(fired - true_at if fired is not None and fired < ends else math.inf)
        k += 1
    return delays


def liveness(d: Daemon) -> dict[str, Any]:
    """Daemon: process there, /healthz 200; gateway: process there, same pid, a request through it 200."""
    out: dict[str, Any] = {"daemon_running": d.alive(), "gateway_running": _exists(d.gw_pid)}
    for key, url in (
        ("healthz", f"http://127.0.0.1:{d.api}/healthz"),
        ("gateway_http", f"http://127.0.0.1:{d.gw}/v1/models"),
    ):
        try:
            out[key] = httpx.get(url, timeout=10, headers={"authorization": "Bearer bench"}).status_code
        except httpx.HTTPError as exc:
            out[key] = type(exc).__name__
    now = gateway_pid(d.api) if out["daemon_running"] else None
    out["gateway_same_pid"] = now == d.gw_pid
    out["alive"] = bool(
        out["daemon_running"] and out["gateway_running"] and out["gateway_same_pid"]
        and out["healthz"] == 200 and out["gateway_http"] == 200
    )  # fmt: skip
    return out


def _exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}/stat").exists() and "zombie" not in Path(f"/proc/{pid}/status").read_text()


# -- legitimate requests --------------------------------------------------------------------------
async def legit(up: int, gw: int, seconds: float) -> dict[str, Any]:
    """JSON requests with a token, gateway and direct side by side, one pair every PACE s for `seconds`."""
    body = b'{"model": "bench", "prompt": "hello", "max_tokens": 16}'
    ports = (up, gw)
    data = [request_bytes(p, "/v1/completions", body) for p in ports]
    conns: list[ClientProtocol | None] = [None, None]
    times: list[list[float]] = [[], []]
    statuses: Counter[str] = Counter()
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        for i in (0, 1):
            t0 = time.perf_counter()
            status: int | str
            try:
                conn = conns[i] = conns[i] or await connect(ports[i])
                status = await asyncio.wait_for(conn.request(data[i]), LEGIT_TIMEOUT)
            except (OSError, asyncio.TimeoutError) as exc:
                status, conns[i] = type(exc).__name__, None
            took = time.perf_counter() - t0
            times[i].append(took)
            if i == 1:
                statuses[str(status)] += 1
        await asyncio.sleep(PACE)
    for left in conns:
        if left is not None and left.transport is not None:
            left.transport.close()
    return _latency(times, statuses)


def _latency(times: list[list[float]], statuses: Counter[str]) -> dict[str, Any]:
    row: dict[str, Any] = {"legit_requests": len(times[1]), "legit_statuses": dict(statuses)}
    row["legit_failed"] = sum(n for s, n in statuses.items() if s != "200")
    for name, q in (("p50", 0.5), ("p99", 0.99)):
        d, g = percentile(times[0], q) * 1e3, percentile(times[1], q) * 1e3
        row[f"direct_{name}_ms"], row[f"gateway_{name}_ms"], row[f"added_{name}_ms"] = d, g, g - d
    return row


# -- the window -----------------------------------------------------------------------------------
def measure(
    ctx: Context, label: str, seconds: float, disturb: Callable[[], Disturbance | None]
) -> dict[str, Any]:
    """One phase: counters, then the disturbance with legitimate traffic and sampling, then counters."""
    d = ctx.daemon
    before = scrape_counts(d.api, ctx.healthy)
    watch = RssWatch(d.proc.pid, d.gw_pid, ctx.guard_bytes)
    watch.start()
    start = time.time()
    disturbance = disturb()
    try:
        row: dict[str, Any] = {"phase": label, "seconds": seconds} | run(legit(ctx.upstream, d.gw, seconds))
    finally:
        attack = disturbance.finish() if disturbance is not None else {}
    end = time.time()
    time.sleep(1.0)  # a firing due at the window's end reaches the receiver
    row |= watch.stop() | {"attack": attack}
    row |= liveness(d)
    row |= _scrapes(ctx, before)
    delays = fire_delays(ctx.receiver, start, end)
    row["fire_delays_s"] = delays
    row["probe_webhooks"] = [
        (t, s) for t, p, s in list(ctx.receiver.events) if p == PROBE_PATH and t >= start
    ]
    row["fire_delay_s"] = max(delays) if delays else None
    print_row(row)
    return row


def _scrapes(ctx: Context, before: dict[str, float]) -> dict[str, Any]:
    """Scrapes of the healthy targets done without error over those expected (one a second each)."""
    try:
        after = scrape_counts(ctx.daemon.api, ctx.healthy)
    except httpx.HTTPError as exc:
        return {"scrapes_on_schedule": 0.0, "scrape_counters": f"unreadable: {type(exc).__name__}"}
    delta = {k: after[k] - before[k] for k in after if k != "series"}
    expected = len(ctx.healthy) * delta["at"]
    done = delta["scrapes"] - delta["errors"]
    return {
        "scrapes_on_schedule": done / expected if expected > 0 else 0.0,
        "scrapes_done": done,
        "scrapes_expected": expected,
        "missed_scrape_deadlines": delta["missed"],
        "hostile_scrapes": delta["hostile_scrapes"],
        "hostile_scrape_errors": delta["hostile_errors"],
        "store_series_before": before["series"],
        "store_series_after": after["series"],
    }


def print_row(row: dict[str, Any]) -> None:
    """The phase's numbers on two lines."""
    fire = row["fire_delay_s"]
    print(
        f"  {row['phase']:<44} scrapes {row.get('scrapes_on_schedule', 0) * 100:5.1f}%  "
        f"probe fired after {'-' if fire is None else f'{fire:.2f} s'}  "
        f"legit added p99 {row['added_p99_ms']:.3f} ms ({row['legit_failed']} failed)",
        flush=True,
    )
    print(
        f"  {'':<44} PSS daemon {row['daemon_pss_peak_mib']:.0f} MiB, "
        f"RSS gateway {row['gateway_rss_peak_mib']:.0f} MiB; alive {row['alive']} "
        f"(healthz {row['healthz']}, via gateway {row['gateway_http']})",
        flush=True,
    )
