"""Gateway overhead: the same requests direct and through the gateway, side by side, on loopback.

Usage: .venv/bin/python bench/gateway.py [--quick] [--vllm URL | --start-vllm] [--json PATH]

Against (a) a trivial local upstream (a raw asyncio server: a small JSON body, or an SSE stream of 16 events
written one by one), which isolates the gateway's own cost, and (b) a real vLLM if given. Measures the added
latency one request at a time (p50, p99; direct and gateway requests interleaved so drift hits both alike),
the request rate at concurrency 16 with streaming, and requests per CPU-second of the gateway process
("per core": the load generator and the upstream share the machine's cores). The gateway runs as its own
process (GatewayServer with its defaults). Prints numbers, ratios and PASS/MISS against the goals; exits
non-zero only if setup fails. Every phase is bounded in count and time.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from _gateway_load import closed_loop, cpu_seconds, percentile, request_bytes, sequential, serve_upstream

from vllm_watchdog.gateway.config import GatewayConfig
from vllm_watchdog.gateway.dataplane.server import GatewayServer

ROOT = Path(__file__).resolve().parent.parent
GOAL_P50, GOAL_P99, GOAL_PER_CORE = 1.0, 2.5, 2000.0  # ms, ms, requests per gateway CPU-second
LITELLM_P50 = (3.0, 5.0)  # ms added at p50, as LiteLLM publishes it
CONCURRENCY = 16


@dataclass(frozen=True)
class Plan:
    """How much to run."""

    rounds: int  # sequential requests per kind and path (trivial upstream)
    warmup: int
    duration: float  # seconds per closed-loop phase (trivial upstream)
    vllm_rounds: int
    vllm_duration: float


FULL = Plan(rounds=3000, warmup=300, duration=8.0, vllm_rounds=40, vllm_duration=20.0)
QUICK = Plan(rounds=500, warmup=100, duration=2.5, vllm_rounds=10, vllm_duration=8.0)


# -- processes ------------------------------------------------------------------------------------
def free_port() -> int:
    """An unused TCP port on 127.0.0.1."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_http(url: str, timeout: float, proc: subprocess.Popen[bytes]) -> None:
    """Until `url` answers (any status), the process dies, or `timeout` passes."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args!r} exited with {proc.returncode}")
        try:
            httpx.get(url, timeout=2)
            return
        except httpx.HTTPError:
            time.sleep(0.1)
    raise RuntimeError(f"{url} not ready after {timeout}s")


def spawn(*args: str) -> subprocess.Popen[bytes]:
    """This script again, in a role (--serve-upstream / --serve-gateway)."""
    return subprocess.Popen([sys.executable, __file__, *args], start_new_session=True)


def stop(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM the process group, then SIGKILL after 30 s."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)


def wait_for_sigterm() -> None:
    """Block the main thread until SIGTERM or SIGINT."""
    done = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: done.set())
    while not done.wait(1.0):
        pass


def run_gateway(upstream: str, port: int) -> None:
    """The gateway process: GatewayServer with its defaults in front of `upstream`."""
    server = GatewayServer(GatewayConfig(target="bench", upstream=upstream, listen_port=port))
    server.start()
    wait_for_sigterm()
    server.stop(grace=1.0)


def run_upstream(port: int) -> None:
    """The trivial upstream process."""
    try:
        import uvloop

        uvloop.run(serve_upstream(port, lambda _: None))
    except ImportError:
        asyncio.run(serve_upstream(port, lambda _: None))


def start_vllm() -> tuple[str, subprocess.Popen[bytes]]:
    """scripts/serve-vllm.sh on a free port; its URL once /health answers."""
    port = free_port()
    log = open(f"/tmp/bench-gateway-vllm-{port}.log", "wb")  # noqa: SIM115 (the child keeps it)
    proc = subprocess.Popen(
        ["bash", str(ROOT / "scripts" / "serve-vllm.sh"), "--port", str(port)],
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"vLLM exited with {proc.returncode}; see {log.name}")
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return url, proc
        except httpx.HTTPError:
            pass
        time.sleep(1)
    stop(proc)
    raise RuntimeError("vLLM not ready after 600 s")


# -- measurement ----------------------------------------------------------------------------------
def run(coro: Any) -> Any:
    """Run a coroutine on uvloop if installed (the load generator must be cheap)."""
    try:
        import uvloop

        return uvloop.run(coro)
    except ImportError:
        return asyncio.run(coro)


def latency_rows(label: str, direct: list[float], gateway: list[float]) -> list[dict[str, Any]]:
    """p50 and p99 in ms, direct vs gateway."""
    rows = []
    for q, goal in ((0.5, GOAL_P50), (0.99, GOAL_P99)):
        d, g = percentile(direct, q) * 1e3, percentile(gateway, q) * 1e3
        rows.append(
            {
                "what": f"{label} p{round(q * 100)}",
                "direct_ms": d,
                "gateway_ms": g,
                "added_ms": g - d,
                "goal_ms": goal,
            }
        )
    return rows


def measure(
    name: str,
    direct_port: int,
    gateway: subprocess.Popen[bytes],
    gateway_port: int,
    body: dict[str, Any],
    rounds: int,
    warmup: int,
    duration: float,
    limit: int,
) -> dict[str, Any]:
    """Sequential latency (JSON and SSE) and the closed-loop streaming rate, direct vs through the gateway."""
    plain = json.dumps(body).encode()
    streamed = json.dumps({**body, "stream": True}).encode()
    path = "/v1/completions"
    pairs = [
        (direct_port, request_bytes(direct_port, path, plain)),
        (gateway_port, request_bytes(gateway_port, path, plain)),
        (direct_port, request_bytes(direct_port, path, streamed)),
        (gateway_port, request_bytes(gateway_port, path, streamed)),
    ]
    run(sequential(pairs, warmup))
    t = run(sequential(pairs, rounds))
    rows = latency_rows(f"{name} json", t[0], t[1]) + latency_rows(f"{name} sse", t[2], t[3])
    direct_n, direct_s = run(closed_loop(direct_port, pairs[2][1], CONCURRENCY, duration, limit))
    cpu0 = cpu_seconds(gateway.pid)
    gw_n, gw_s = run(closed_loop(gateway_port, pairs[3][1], CONCURRENCY, duration, limit))
    cpu = cpu_seconds(gateway.pid) - cpu0
    rate = {
        "what": f"{name} sse c={CONCURRENCY}",
        "direct_rps": direct_n / direct_s,
        "gateway_rps": gw_n / gw_s,
        "gateway_cpu_s": cpu,
        "per_core": gw_n / cpu if cpu > 0 else float("inf"),
        "requests": gw_n,
    }
    return {"latency": rows, "rate": rate}


def report(results: dict[str, dict[str, Any]]) -> None:
    """The side-by-side table, the ratios and the goals."""
    print(
        f"\n{'one request at a time':<24}{'direct':>10}{'gateway':>10}{'added':>10}{'ratio':>8}  goal (added)"
    )
    for name, res in results.items():
        for r in res["latency"]:
            verdict = "PASS" if r["added_ms"] < r["goal_ms"] else "MISS"
            ratio = r["gateway_ms"] / r["direct_ms"] if r["direct_ms"] > 0 else float("inf")
            print(
                f"{r['what']:<24}{r['direct_ms']:>8.3f}ms{r['gateway_ms']:>8.3f}ms{r['added_ms']:>8.3f}ms"
                f"{ratio:>7.2f}x  < {r['goal_ms']} ms {verdict if name == 'trivial' else '(info)'}"
            )
    head = f"{'direct':>10}{'gateway':>10}{'ratio':>8}{'gw cpu-s':>10}{'req/cpu-s':>11}"
    print(f"\n{f'concurrency {CONCURRENCY}, SSE':<24}{head}  goal")
    for name, res in results.items():
        r = res["rate"]
        verdict = "PASS" if r["per_core"] >= GOAL_PER_CORE else "MISS"
        print(
            f"{r['what']:<24}{r['direct_rps']:>8.0f}/s{r['gateway_rps']:>8.0f}/s"
            f"{r['gateway_rps'] / r['direct_rps']:>7.2f}x{r['gateway_cpu_s']:>10.2f}{r['per_core']:>11.0f}"
            f"  >= {GOAL_PER_CORE:.0f}/core {verdict if name == 'trivial' else '(info)'}"
        )
    trivial = results["trivial"]["latency"]
    added = {r["what"]: r["added_ms"] for r in trivial}
    for kind in ("json", "sse"):
        ours = added[f"trivial {kind} p50"]
        low, high = LITELLM_P50
        ratio = f"{low / ours:.1f}-{high / ours:.1f}x less" if ours > 0 else "n/a"
        print(f"added p50 ({kind}) vs LiteLLM's published {low:.0f}-{high:.0f} ms: {ours:.3f} ms, {ratio}")


def main() -> int:
    """Parse arguments, run the phases, print the report."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="fewer rounds, shorter phases")
    ap.add_argument("--vllm", metavar="URL", help="also measure against this running vLLM")
    ap.add_argument("--start-vllm", action="store_true", help="start one with scripts/serve-vllm.sh")
    ap.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    ap.add_argument("--serve-upstream", type=int, metavar="PORT", help=argparse.SUPPRESS)
    ap.add_argument("--serve-gateway", nargs=2, metavar=("UPSTREAM", "PORT"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.serve_upstream is not None:
        run_upstream(args.serve_upstream)
        return 0
    if args.serve_gateway is not None:
        run_gateway(args.serve_gateway[0], int(args.serve_gateway[1]))
        return 0

    plan = QUICK if args.quick else FULL
    procs: list[subprocess.Popen[bytes]] = []
    results: dict[str, dict[str, Any]] = {}
    try:
        up_port, gw_port = free_port(), free_port()
        procs.append(upstream := spawn("--serve-upstream", str(up_port)))
        wait_http(f"http://127.0.0.1:{up_port}/", 30, upstream)
        procs.append(gateway := spawn("--serve-gateway", f"http://127.0.0.1:{up_port}", str(gw_port)))
        wait_http(f"http://127.0.0.1:{gw_port}/", 30, gateway)
        print(
            f"trivial upstream: {plan.rounds} sequential rounds, {plan.duration:.1f} s at c={CONCURRENCY}",
            flush=True,
        )
        body = {"model": "bench", "prompt": "hello", "max_tokens": 16}
        results["trivial"] = measure(
            "trivial", up_port, gateway, gw_port, body, plan.rounds, plan.warmup, plan.duration, 10**7
        )
        vllm_url = args.vllm
        if args.start_vllm and not vllm_url:
            vllm_url, vllm = start_vllm()
            procs.append(vllm)
        if vllm_url:
            port = int(vllm_url.rsplit(":", 1)[1].split("/")[0])
            model = httpx.get(vllm_url + "/v1/models", timeout=30).json()["data"][0]["id"]
            vgw_port = free_port()
            procs.append(vgw := spawn("--serve-gateway", vllm_url, str(vgw_port)))
            wait_http(f"http://127.0.0.1:{vgw_port}/health", 30, vgw)
            print(
                f"vLLM at {vllm_url}: {plan.vllm_rounds} rounds, {plan.vllm_duration:.0f} s at c=16",
                flush=True,
            )
            body = {"model": model, "prompt": "hello", "max_tokens": 4, "temperature": 0}
            results["vllm"] = measure(
                "vllm", port, vgw, vgw_port, body, plan.vllm_rounds, 2, plan.vllm_duration, 10**5
            )
    finally:
        for proc in reversed(procs):
            stop(proc)
    report(results)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
