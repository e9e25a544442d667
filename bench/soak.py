"""Soak: a healthy real vLLM under realistic agent traffic, the bundled rules and default actions enforcing.

Usage: flock /tmp/vllm-heavy.lock .venv/bin/python bench/soak.py [--duration 30m] [--agents 4] [--warmup 5m]
           [--sample-interval 10s] [--json FILE] [--vllm-url URL | --vllm-arg ARG ...] [--workdir DIR]
           [--pause-hold 150s] [--pause-gap 120s] [--no-pauses] [--breaker 60s] [--no-loopers]
           [--time-scale 1]

What runs (all on 127.0.0.1, free ports):
- the watchdog with the embedded defaults (watchdog/defaults/config.yml: the bundled vLLM and gateway rules,
  `include: [bundled:watchdog.yml]` for the default actions and routes, the gateway in front of the target),
  changed only in its ports and state_dir, `dry_run: false` (enforce), and one webhook notifier pointing at
  this script, which records every alert sent;
- vLLM (CPU, the tiny model): by default launched by the watchdog itself in process mode (the target's
  `command:` is scripts/serve-vllm.sh --enable-prompt-tokens-details, plus --vllm-arg), as the demo does, so
  a restart or relaunch that a false alarm routes would really happen. It runs in dev mode
  (VLLM_SERVER_DEV_MODE=1, the target's `env:`) so that it can be paused. With --vllm-url the soak watches a
  vLLM you started (a watch-only target: restarts are refused, but the refusal is still an audit row counted
  here; pausing it needs dev mode there too, or --no-pauses);
- the agent traffic of bench/_soak_traffic.py through the gateway: --agents sessions at a time (the only
  concurrency), for --duration, then the agents stop by themselves;
- operator behaviour: an operator (bench/_soak_operator.py) pauses vLLM every --pause-gap for --pause-hold
  in turn with mode keep, wait and abort, then resumes it (as RL trainers do around weight updates); and two
  agents loop (the same tool call back to back) until the bundled route breaks their session, then behave: one
  at once, waiting out each 429, the other after a silence longer than its breaker. The bundled
  session-breaker's duration is set to --breaker (60 s; the bundled 5 minutes would outlast a short soak), its
  other settings kept.

Measured: requests by kind and their errors; every alert the watchdog sent (webhook) and every state seen by
polling GET /api/v1/alerts every 2 s; the audit log (GET /api/v1/actions); the watchdog process's CPU time
(utime + stime from /proc/<pid>/stat, children excluded) and RSS (VmRSS, /proc/<pid>/status) every
--sample-interval. RSS is reported at traffic start, after --warmup, and at the end, with the least-squares
slope over the samples after warm-up (MiB per hour) and end/warm. The sample store fills up to its retention
(40 minutes with the bundled rules: the longest range a rule reads) and RSS grows with it until then, so the
report also samples the store's size from /metrics and says how much RSS growth it does not explain.

Verdict: PASS when no wrong action was taken (no audit row but the loopers' session-breakers), no critical
alert fired, no request was lost, the behaving looper was let back in within its breaker (+10 s) and the quiet
one at once; otherwise FAIL with what happened, exit status 1. Requests that an abort pause ended (in flight
when it was asked for, failed by the time it answered + 5 s) are not lost by the watchdog: the operator
aborted them on purpose; they are counted apart (aborted_by_pause). Everything started is stopped on exit,
Ctrl-C and SIGTERM included (the process-mode vLLM too: the watchdog leaves it running by design).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from datetime import datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources
from pathlib import Path
from typing import Any

import httpx
import yaml
from _soak_operator import Operator, judge
from _soak_scale import write_scaled_rules
from _soak_traffic import Mix, Traffic

from vllm_watchdog.config.durations import parse_duration
from vllm_watchdog.config.model import bundled_rules_dir

ROOT = Path(__file__).resolve().parent.parent
TICK = os.sysconf("SC_CLK_TCK")
ALERT_POLL = 2.0  # seconds between GET /api/v1/alerts
# What the watchdog holds that may grow with time, from its /metrics: RSS growth is read against these (the
# sample store fills up to its retention, the longest range a rule reads: 40 minutes with the bundled rules).
_GENERIC = (" audit row(s), ", " request(s) failed")  # build_report's reasons that judge() replaces
SIZES = re.compile(
    r"^vllm_watchdog_(store_samples|store_series|gateway_sessions_tracked)(?:\{[^}]*\})? ([0-9.eE+-]+)$", re.M
)


@dataclass(frozen=True)
class Options:
    """What to soak, for how long."""

    duration: float = 1800.0
    warmup: float = 300.0  # RSS after this much traffic is the reference for growth
    sample_interval: float = 10.0
    agents: int = 4
    vllm_url: str | None = None  # None: the watchdog launches vLLM (process mode)
    vllm_args: tuple[str, ...] = ()
    ready_timeout: float = 600.0
    workdir: Path | None = None
    seed: int = 7
    pauses: bool = True  # the operator pauses and resumes vLLM (needs dev mode)
    pause_hold: float = 150.0  # seconds each pause lasts: longer than every bundled for: on hung or stalled
    pause_gap: float = 120.0  # seconds of serving before each pause
    loopers: bool = True  # two agents loop, are broken, then behave
    breaker: float = 60.0  # the bundled session-breaker's duration, for this soak
    # The clock of the rules and the agents runs this many times faster: every window, offset and `for:` of
    # the bundled rules, the agents' think and idle times and the alert polling are divided by it (not the
    # scrape, evaluation and canary intervals, nor how long vLLM takes to answer). With 2, a minute of traffic
    # fills each rule's window and `for:` as two minutes at 1 would.
    time_scale: float = 1.0


def free_port() -> int:
    """An unused TCP port on 127.0.0.1."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# -- the alerts the watchdog sends ----------------------------------------------------------------
class Hooks:
    """A webhook receiver on 127.0.0.1 (a thread) keeping every alert and action event the watchdog sends."""

    def __init__(self) -> None:
        self.alerts: list[dict[str, Any]] = []
        self.events: list[dict[str, Any]] = []
        lock, alerts, events = threading.Lock(), self.alerts, self.events

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                with contextlib.suppress(ValueError), lock:
                    doc = json.loads(body)
                    if doc.get("type") == "action":
                        events.append(doc.get("event") or {})
                    else:
                        alerts.extend(doc.get("alerts") or [])
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        threading.Thread(target=self.server.serve_forever, name="soak-hooks", daemon=True).start()

    def close(self) -> None:
        """Stop serving."""
        self.server.shutdown()
        self.server.server_close()


# -- the processes ---------------------------------------------------------------------------------
def watchdog_config(
    opts: Options, state: Path, api: int, gateway: int, vllm_port: int, hook: str
) -> dict[str, Any]:
    """The embedded defaults with our ports, state_dir, target, notifier and dry_run: false."""
    cfg: dict[str, Any] = yaml.safe_load(
        (resources.files("vllm_watchdog") / "defaults" / "config.yml").read_text()
    )
    cfg["listen"] = f"127.0.0.1:{api}"
    cfg["state_dir"] = str(state)
    cfg["gateway"]["listen"] = f"127.0.0.1:{gateway}"
    target = cfg["targets"][0]
    if opts.vllm_url:
        target["url"] = opts.vllm_url
    else:
        target["url"] = f"http://127.0.0.1:{vllm_port}"
        serve = ["bash", str(ROOT / "scripts" / "serve-vllm.sh"), "--port", str(vllm_port)]
        target["command"] = [*serve, "--enable-prompt-tokens-details", *opts.vllm_args]
        target["env"] = {"VLLM_SERVER_DEV_MODE": "1"}  # /pause, /resume, /is_paused
    defaults = ROOT / "watchdog" / "defaults" / "watchdog.yml"  # the bundled actions and routes
    bundled = yaml.safe_load(defaults.read_text())["actions"]["session-breaker"]
    cfg["actions"] = {"session-breaker": {**bundled, "duration": f"{opts.breaker:g}s"}}
    cfg["notifiers"] = [{"type": "webhook", "name": "soak", "url": hook}]
    cfg["dry_run"] = False
    if opts.time_scale != 1.0:
        names = [f.removeprefix("bundled:") for f in cfg["rule_files"]]
        scaled = [
            write_scaled_rules(bundled_rules_dir() / n, state.parent / n, opts.time_scale) for n in names
        ]
        cfg["rule_files"] = [str(path) for path in scaled]
    return cfg


class Stack:
    """The watchdog process (and, in process mode, the vLLM it launches); stop() ends both."""

    def __init__(self, opts: Options, work: Path, hooks: Hooks) -> None:
        self.opts = opts
        self.work = work
        self.state = work / "state"
        self.api_port, self.gateway_port, self.vllm_port = free_port(), free_port(), free_port()
        self.api = f"http://127.0.0.1:{self.api_port}"
        self.gateway = f"http://127.0.0.1:{self.gateway_port}"
        self.log = work / "watchdog.log"
        cfg = watchdog_config(opts, self.state, self.api_port, self.gateway_port, self.vllm_port, hooks.url)
        self.config = work / "watchdog.yml"
        self.config.write_text(json.dumps(cfg, indent=1) + "\n")  # YAML is a superset of JSON
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        """Start the watchdog (its own session: Ctrl-C reaches us, and we stop it in order)."""
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "vllm_watchdog",
                    "run",
                    "--config",
                    str(self.config),
                    "--log-format",
                    "json",
                ],
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=ROOT,
                start_new_session=True,
            )

    def wait_ready(self, say: Callable[[str], None]) -> float:
        """Until the target is up, /health answers and a canary succeeded; seconds it took."""
        t0 = time.monotonic()
        deadline = t0 + self.opts.ready_timeout
        while time.monotonic() < deadline:
            if self.proc is None or self.proc.poll() is not None:
                raise RuntimeError(f"the watchdog exited; see {self.log}")
            with contextlib.suppress(httpx.HTTPError, ValueError, KeyError, IndexError):
                t = httpx.get(self.api + "/api/v1/targets", timeout=5).json()["data"]["activeTargets"][0]
                own = t["watchdog"]
                if t["health"] == "up" and own["healthProbe"]["up"] and (own["canary"] or {}).get("success"):
                    return time.monotonic() - t0
            time.sleep(1.0)
        raise RuntimeError(
            f"vLLM not ready under the watchdog after {self.opts.ready_timeout:.0f}s; see {self.log}"
        )

    def stop(self) -> None:
        """SIGTERM the watchdog (SIGKILL after 20 s), then stop the vLLM it launched, whole session."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        if self.opts.vllm_url is None:
            for pid in self._vllm_pids():
                _stop_group(pid)

    def _vllm_pids(self) -> set[int]:
        """The process-mode vLLM: from the watchdog's state file, and by its command line as a fallback."""
        pids = set()
        with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
            child = json.loads((self.state / "process-vllm-0.json").read_text())["child"]
            if child:
                pids.add(int(child["pid"]))
        port = str(self.vllm_port).encode()
        for entry in Path("/proc").iterdir():
            with contextlib.suppress(OSError):
                argv = (entry / "cmdline").read_bytes().split(b"\0")
                if b"vllm.entrypoints.openai.api_server" in argv and port in argv:
                    pids.add(int(entry.name))
        return pids


def _stop_group(pid: int) -> None:
    """SIGCONT + SIGTERM to a process group, SIGKILL if it outlives 15 s."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGCONT)
        os.killpg(pid, signal.SIGTERM)
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            os.killpg(pid, 0)
            time.sleep(0.3)
        os.killpg(pid, signal.SIGKILL)


# -- measuring -------------------------------------------------------------------------------------
def proc_sample(pid: int) -> tuple[float, float]:
    """(CPU seconds, RSS MiB) of one process: utime + stime (its children excluded) and VmRSS."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    cpu = (int(fields[11]) + int(fields[12])) / TICK
    rss = 0.0
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            rss = int(line.split()[1]) / 1024
    return cpu, rss


def slope_per_hour(points: list[tuple[float, float]]) -> float | None:
    """Least-squares slope of (seconds, value) points, per hour; None with fewer than 2 distinct times."""
    if len(points) < 2:
        return None
    n = len(points)
    mt = sum(t for t, _ in points) / n
    mv = sum(v for _, v in points) / n
    var = sum((t - mt) ** 2 for t, _ in points)
    if var == 0:
        return None
    return sum((t - mt) * (v - mv) for t, v in points) / var * 3600


def resources_report(samples: list[tuple[float, float, float]], warmup: float) -> dict[str, Any]:
    """CPU and RSS figures from (seconds since traffic start, CPU s, RSS MiB) samples."""
    if not samples:
        return {"samples": []}
    t0, cpu0, rss0 = samples[0]
    t1, cpu1, rss1 = samples[-1]
    warm = next((s for s in samples if s[0] >= warmup), samples[-1])
    after = [(t, rss) for t, _, rss in samples if t >= warm[0]]
    wall = t1 - t0
    return {
        "samples": [[round(t, 1), round(c, 2), round(r, 1)] for t, c, r in samples],
        "cpu_seconds": round(cpu1 - cpu0, 2),
        "cpu_percent_of_core": round(100 * (cpu1 - cpu0) / wall, 2) if wall > 0 else None,
        "rss_start_mb": round(rss0, 1),
        "rss_warm_mb": round(warm[2], 1),
        "rss_warm_at_s": round(warm[0], 1),
        "rss_end_mb": round(rss1, 1),
        "rss_max_mb": round(max(r for _, _, r in samples), 1),
        "rss_slope_mb_per_hour": None if (s := slope_per_hour(after)) is None else round(s, 2),
        "rss_end_over_warm": round(rss1 / warm[2], 3) if warm[2] else None,
    }


class Observer:
    """Polls the watchdog's API while the soak runs: alert states, targets, and samples its process."""

    def __init__(self, api: str, pid: int, client: httpx.AsyncClient, poll_every: float = ALERT_POLL) -> None:
        self.api = api
        self.pid = pid
        self.client = client
        self.poll_every = poll_every  # seconds between GET /api/v1/alerts
        self.seen: dict[tuple[str, str], dict[str, Any]] = {}  # (label set, activeAt) -> states seen
        self.samples: list[tuple[float, float, float]] = []
        self.sizes: list[tuple[float, dict[str, float]]] = []  # what the watchdog holds (SIZES), over time
        self.canary_failures = 0
        self.polls = 0
        self.poll_errors = 0

    async def alerts_loop(self, stop: asyncio.Event) -> None:
        """GET /api/v1/alerts every poll_every seconds until stop is set."""
        while not stop.is_set():
            await self.poll_alerts()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.poll_every)

    async def poll_alerts(self) -> None:
        """Remember the state of every pending or firing alert now."""
        self.polls += 1
        try:
            data = (await self.client.get(self.api + "/api/v1/alerts", timeout=10)).json()["data"]["alerts"]
        except (httpx.HTTPError, ValueError, KeyError):
            self.poll_errors += 1
            return
        for a in data:
            key = (json.dumps(a["labels"], sort_keys=True), a["activeAt"])
            entry = self.seen.setdefault(
                key, {"labels": a["labels"], "activeAt": a["activeAt"], "states": []}
            )
            if a["state"] not in entry["states"]:
                entry["states"].append(a["state"])

    async def sample_loop(self, t0: float, every: float, stop: asyncio.Event) -> None:
        """Sample the watchdog process and its target every `every` seconds until stop is set (on a fixed
        schedule: a slow sample delays the next one, not all that follow)."""
        due = time.monotonic()
        while not stop.is_set():
            await self.sample(t0)
            due += every
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), max(0.0, due - time.monotonic()))

    async def sample(self, t0: float) -> None:
        """One CPU/RSS sample; the sizes the watchdog reports on /metrics; whether the canary fails now."""
        cpu, rss = proc_sample(self.pid)
        at = time.monotonic() - t0
        self.samples.append((at, cpu, rss))
        with contextlib.suppress(httpx.HTTPError):
            text = (await self.client.get(self.api + "/metrics", timeout=10)).text
            sizes = {m.group(1): float(m.group(2)) for m in SIZES.finditer(text)}
            self.sizes.append((at, sizes))
        with contextlib.suppress(httpx.HTTPError, ValueError, KeyError, IndexError):
            answer = (await self.client.get(self.api + "/api/v1/targets", timeout=10)).json()
            t = answer["data"]["activeTargets"][0]
            if not (t["watchdog"]["canary"] or {}).get("success", True):
                self.canary_failures += 1


# -- the soak --------------------------------------------------------------------------------------
async def _soak(opts: Options, stack: Stack, hooks: Hooks, say: Callable[[str], None]) -> dict[str, Any]:
    assert stack.proc is not None
    k = opts.time_scale
    mix = Mix(
        agents=opts.agents,
        think=(Mix.think[0] / k, Mix.think[1] / k),
        idle=(Mix.idle[0] / k, Mix.idle[1] / k),
        seed=opts.seed,
        request_timeout=max(120.0, opts.pause_hold + 60.0) if opts.pauses else 120.0,
        loopers=opts.loopers,
        quiet_after=opts.breaker + 20.0,
    )
    traffic = Traffic(stack.gateway, mix)
    vllm = opts.vllm_url or f"http://127.0.0.1:{stack.vllm_port}"
    operator = Operator(vllm, hold=opts.pause_hold, gap=opts.pause_gap)
    stop = asyncio.Event()
    async with httpx.AsyncClient(trust_env=False) as client:
        observer = Observer(stack.api, stack.proc.pid, client, ALERT_POLL / k)
        t0, wall0 = time.monotonic(), time.time()
        run = asyncio.create_task(traffic.run(opts.duration))
        pausing = asyncio.create_task(operator.run(opts.duration)) if opts.pauses else None
        watchers = [
            asyncio.create_task(observer.alerts_loop(stop)),
            asyncio.create_task(observer.sample_loop(t0, opts.sample_interval, stop)),
            asyncio.create_task(_progress(observer, traffic, stack, t0, opts.duration, say, stop, run)),
        ]
        try:
            await run
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                raise  # Ctrl-C: not ours
        finally:
            if pausing is not None:
                pausing.cancel()  # it resumes a pause it made before it ends
                await asyncio.gather(pausing, return_exceptions=True)
            stop.set()
            await asyncio.gather(*watchers, return_exceptions=True)
        end = time.monotonic()
        alive = stack.proc.poll() is None
        if alive:
            await observer.sample(t0)
            await asyncio.sleep(2 * observer.poll_every)  # the last evaluation's notices reach the webhook
            await observer.poll_alerts()
            actions = (await client.get(stack.api + "/api/v1/actions?limit=10000", timeout=30)).json()["data"]
            gateway = (await client.get(stack.api + "/api/v1/gateway", timeout=30)).json()
        else:
            actions, gateway = {"history": [], "watchdog_alerts": []}, {}
    report = build_report(opts, traffic, observer, hooks, actions, gateway, alive, stack, wall0)
    return with_operator(report, opts, traffic, operator, t0, end)


def with_operator(
    report: dict[str, Any], opts: Options, traffic: Traffic, operator: Operator, t0: float, end: float
) -> dict[str, Any]:
    """The report judged with the operator's behaviour: the loopers' breakers are right actions, requests an
    abort pause ended are not lost (bench/_soak_operator.py, judge)."""
    part, reasons = judge(
        report["actions"], traffic.failures, operator.pauses, traffic.loopers, opts.breaker, t0, end
    )
    report["operator"] = part
    report["requests"]["aborted_by_pause"] = part["aborted_by_pause"]
    report["requests"]["lost"] = part["lost"]
    kept = [r for r in report["verdict"]["reasons"] if not any(g in r for g in _GENERIC)]
    report["verdict"] = {"pass": not (kept or reasons), "reasons": kept + reasons}
    return report


async def _progress(
    observer: Observer,
    traffic: Traffic,
    stack: Stack,
    t0: float,
    duration: float,
    say: Callable[[str], None],
    stop: asyncio.Event,
    traffic_run: asyncio.Task[None],
) -> None:
    """A line a minute on stderr; if the watchdog dies, the traffic stops at once."""
    next_line = time.monotonic() + 60
    while not stop.is_set():
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), 1)
        if stack.proc is not None and stack.proc.poll() is not None:
            say(f"soak: the watchdog exited with {stack.proc.returncode}; see {stack.log}")
            traffic_run.cancel()
            return
        if time.monotonic() < next_line and not stop.is_set():
            continue
        next_line += 60
        ok = sum(s.ok for s in traffic.stats.values())
        errors = sum(sum(s.errors.values()) for s in traffic.stats.values())
        rss = observer.samples[-1][2] if observer.samples else 0.0
        firing = sorted(
            {e["labels"].get("alertname", "?") for e in observer.seen.values() if "firing" in e["states"]}
        )
        say(
            f"soak: {time.monotonic() - t0:5.0f}/{duration:.0f}s  requests {ok} ok {errors} failed  "
            f"watchdog RSS {rss:.1f} MiB  fired so far: {', '.join(firing) or 'none'}"
        )


def build_report(
    opts: Options,
    traffic: Traffic,
    observer: Observer,
    hooks: Hooks,
    actions: dict[str, Any],
    gateway: dict[str, Any],
    alive: bool,
    stack: Stack,
    traffic_start: float,
) -> dict[str, Any]:
    """Everything measured, and the verdict."""
    kinds = {
        k: {
            "ok": s.ok,
            "errors": dict(s.errors),
            "p50_s": _quantile(s.seconds, 0.5),
            "p95_s": _quantile(s.seconds, 0.95),
            "prompt_tokens": s.prompt_tokens,
            "completion_tokens": s.completion_tokens,
        }
        for k, s in sorted(traffic.stats.items())
    }
    alerts, episodes = alert_summary(hooks, observer, traffic_start)
    history = actions.get("history", [])
    rows = [
        {
            k: r.get(k)
            for k in ("id", "action", "type", "trigger", "outcome", "reason", "labels", "started_at")
        }
        for r in history
        if r.get("type") != "integrity"  # the known answers' records (a baseline learnt), not actions
    ]
    baselines = [r for r in history if r.get("type") == "integrity"]
    critical = [a for a in alerts if a["severity"] == "critical" and (a["fired"] or a["polled_firing"])]
    errors = sum(sum(k["errors"].values()) for k in kinds.values())
    reasons = []
    if not alive:
        reasons.append("the watchdog died")
    if rows:
        # A skipped or refused row still means an alert routed an action at a healthy server.
        taken = sum(r["outcome"] not in ("skipped", "refused") for r in rows)
        what = sorted({f"{r['action']} {r['outcome']} for {_cause(r)}" for r in rows})
        reasons.append(f"{len(rows)} audit row(s), {taken} taken: {'; '.join(what)}")
    if critical:
        reasons.append(
            "critical alerts fired: " + ", ".join(f"{a['alertname']} x{max(a['fired'], 1)}" for a in critical)
        )
    if errors:
        reasons.append(f"{errors} request(s) failed")
    return {
        "options": {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(opts).items()},
        "mode": "watch-only (--vllm-url)" if opts.vllm_url else "process (the watchdog launched vLLM)",
        "workdir": str(stack.work),
        "requests": {
            "ok": sum(k["ok"] for k in kinds.values()),
            "errors": errors,
            "by_kind": kinds,
            "sessions": dict(sorted(traffic.sessions.items())),
        },
        "alerts": alerts,
        "alert_episodes": episodes[:200],
        "actions": rows,
        "known_answer_records": [{k: r.get(k) for k in ("action", "trigger", "reason")} for r in baselines],
        "action_events": hooks.events,
        "watchdog_alerts": actions.get("watchdog_alerts", []),
        "gateway": {k: gateway.get("data", {}).get(k) for k in ("limit", "ceiling", "breakers", "draining")},
        "canary_failures_sampled": observer.canary_failures,
        "alert_polls": {"polls": observer.polls, "errors": observer.poll_errors},
        "resources": (res := resources_report(observer.samples, opts.warmup)),
        "sizes": _sizes_report(observer.sizes, res, opts.warmup),
        "verdict": {"pass": not reasons, "reasons": reasons},
    }


def _sizes_report(
    sizes: list[tuple[float, dict[str, float]]], resources: dict[str, Any], warmup: float
) -> dict[str, Any]:
    """Store samples and series and gateway sessions at traffic start, after warm-up and at the end; and
    the RSS growth after warm-up beyond what the store's new samples take (16 bytes each)."""
    if not sizes:
        return {}
    warm = next((s for s in sizes if s[0] >= warmup), sizes[-1])
    out: dict[str, Any] = {"start": sizes[0][1], "warm": warm[1], "end": sizes[-1][1]}
    grown = sizes[-1][1].get("store_samples", 0.0) - warm[1].get("store_samples", 0.0)
    out["store_growth_after_warmup_mb"] = round(grown * 16 / 2**20, 2)
    if "rss_end_mb" in resources:
        rss_growth = resources["rss_end_mb"] - resources["rss_warm_mb"]
        out["rss_growth_beyond_store_mb"] = round(rss_growth - out["store_growth_after_warmup_mb"], 2)
    return out


def _cause(row: dict[str, Any]) -> str:
    return str((row["labels"] or {}).get("alertname", row["trigger"]))


def alert_summary(
    hooks: Hooks, observer: Observer, traffic_start: float
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Per alert name and severity: firings the webhook got (and how many began before the traffic, while
    vLLM started) and the states polling saw; and each episode (label set and start)."""
    episodes: dict[tuple[str, str], dict[str, Any]] = {}
    for a in hooks.alerts:
        if a.get("status") == "firing":
            start = _unix(a.get("startsAt", ""))
            key = (a.get("fingerprint", ""), a.get("startsAt", ""))
            episodes[key] = {"labels": a.get("labels") or {}, "fired_at": start, "states": ["firing"]}
    for e in observer.seen.values():
        key = (json.dumps(e["labels"], sort_keys=True), e["activeAt"])
        episodes[key] = {"labels": e["labels"], "active_at": _unix(e["activeAt"]), "states": e["states"]}
    summary: dict[tuple[str, str], dict[str, Any]] = {}
    for ep in episodes.values():
        name = (ep["labels"].get("alertname", "?"), ep["labels"].get("severity", ""))
        row = summary.setdefault(
            name, {"fired": 0, "fired_before_traffic": 0, "polled_pending": 0, "polled_firing": 0}
        )
        if "fired_at" in ep:
            row["fired"] += 1
            row["fired_before_traffic"] += int((ep["fired_at"] or 0) < traffic_start)
        else:
            for state in ep["states"]:
                row[f"polled_{state}"] = row.get(f"polled_{state}", 0) + 1
    alerts = [{"alertname": n, "severity": sev, **row} for (n, sev), row in sorted(summary.items())]
    ordered = sorted(episodes.values(), key=lambda ep: ep.get("fired_at") or ep.get("active_at") or 0)
    return alerts, ordered


def _unix(rfc3339: str) -> float | None:
    """Unix seconds of an RFC 3339 UTC time (fractions cut to microseconds); None if unreadable."""
    m = re.match(r"(.*?T\d\d:\d\d:\d\d)(\.\d+)?Z$", rfc3339)
    if m is None:
        return None
    return datetime.fromisoformat(f"{m.group(1)}{(m.group(2) or '.0')[:7]}+00:00").timestamp()


def _quantile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))], 3)


def run_soak(
    opts: Options, say: Callable[[str], None] = lambda line: print(line, file=sys.stderr)
) -> dict[str, Any]:
    """Start the watchdog (and vLLM), soak for opts.duration, stop everything; the report."""
    work = opts.workdir or Path(tempfile.mkdtemp(prefix="vllm-soak-"))
    work.mkdir(parents=True, exist_ok=True)
    hooks = Hooks()
    stack = Stack(opts, work, hooks)
    try:
        stack.start()
        say(
            f"soak: watchdog API {stack.api}, gateway {stack.gateway}; waiting for vLLM (logs, state: {work})"
        )
        ready = stack.wait_ready(say)
        say(f"soak: vLLM ready after {ready:.0f}s; {opts.agents} agents for {opts.duration:.0f}s")
        report = asyncio.run(_soak(opts, stack, hooks, say))
        report["ready_seconds"] = round(ready, 1)
        return report
    finally:
        stack.stop()
        hooks.close()


def print_report(r: dict[str, Any]) -> None:
    """The report, for people."""
    req = r["requests"]
    print(f"mode: {r['mode']}; vLLM ready after {r['ready_seconds']}s; workdir {r['workdir']}")
    print(
        f"requests: {req['ok']} ok, {req['errors']} failed ({req.get('aborted_by_pause', 0)} ended by an "
        f"abort pause, {req.get('lost', req['errors'])} lost); sessions {req['sessions']}"
    )
    for kind, k in req["by_kind"].items():
        errs = f" errors {k['errors']}" if k["errors"] else ""
        print(f"  {kind:18} {k['ok']:6} ok  p50 {k['p50_s']}s p95 {k['p95_s']}s{errs}")
    print(
        f"alerts ({r['alert_polls']['polls']} polls, {r['alert_polls']['errors']} failed):"
        + ("" if r["alerts"] else " none")
    )
    for a in r["alerts"]:
        early = f" ({a['fired_before_traffic']} before the traffic)" if a["fired_before_traffic"] else ""
        polled = f"polled pending {a['polled_pending']} firing {a['polled_firing']}"
        print(f"  {a['alertname']:32} {a['severity']:8} fired {a['fired']}{early}  {polled}")
    print(f"actions (audit rows): {len(r['actions'])}")
    for a in r["actions"]:
        print(f"  #{a['id']} {a['action']} {a['outcome']} for {_cause(a)}: {a['reason']}")
    print(f"gateway at the end: {r['gateway']}; canary failing in {r['canary_failures_sampled']} samples")
    op = r.get("operator") or {}
    for p in op.get("pauses", []):
        print(
            f"  pause {p['mode']:5} asked at {p['asked_at']}s, paused at {p['paused_at']}s, "
            f"resumed at {p['resumed_at']}s{' ' + str(p['errors']) if p['errors'] else ''}"
        )
    for lp in op.get("loopers", []):
        print(
            f"  looper {lp['session']} (quiet {lp['quiet_s']:g}s): {lp['loop_steps']} looping steps, "
            f"broken at {_s(lp['broken_at_s'])} (Retry-After {lp['retry_after_s']}), "
            f"held {_s(lp['held_for_s'])}, "
            f"{lp['refusals_while_behaving']} refusals while behaving, {lp['steps_after']} steps after; "
            f"breaker applied {lp['breakers_applied']}x ({lp['breaker_rows']} audit rows)"
        )
    res = r["resources"]
    print(
        f"watchdog CPU: {res['cpu_seconds']} s = {res['cpu_percent_of_core']}% of one core\n"
        f"watchdog RSS: start {res['rss_start_mb']} MiB, warm {res['rss_warm_mb']} "
        f"(at {res['rss_warm_at_s']}s), "
        f"end {res['rss_end_mb']}, max {res['rss_max_mb']}; after warm-up: slope "
        f"{res['rss_slope_mb_per_hour']} MiB/h, end/warm {res['rss_end_over_warm']}"
    )
    sizes = r["sizes"]
    if sizes:
        print(f"watchdog holds: start {sizes['start']}\n  warm {sizes['warm']}\n  end {sizes['end']}")
        print(
            f"  store growth after warm-up {sizes['store_growth_after_warmup_mb']} MiB; RSS growth beyond it "
            f"{sizes.get('rss_growth_beyond_store_mb')} MiB"
        )
    v = r["verdict"]
    print(
        "verdict: PASS (no wrong action, no critical alert, no lost request, loopers let back in)"
        if v["pass"]
        else "verdict: FAIL: " + "; ".join(v["reasons"])
    )


def _s(seconds: float | None) -> str:
    return "never" if seconds is None else f"{seconds}s"


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--duration", default="30m", help="traffic time, a Prometheus duration (default 30m)")
    parser.add_argument(
        "--warmup", default=None, help="RSS reference point (default: a sixth of --duration, at most 5m)"
    )
    parser.add_argument("--sample-interval", default="10s")
    parser.add_argument("--agents", type=int, default=4, help="agent sessions at a time (default 4)")
    parser.add_argument("--vllm-url", default=None, help="watch this running vLLM instead of launching one")
    parser.add_argument("--vllm-arg", action="append", default=[], help="extra vLLM argument (process mode)")
    parser.add_argument("--ready-timeout", default="10m")
    parser.add_argument(
        "--workdir", type=Path, default=None, help="config, logs and state (default: a temp dir)"
    )
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--json", type=Path, default=None, help="also write the report here")
    parser.add_argument("--pause-hold", default="150s", help="how long each pause lasts (default 150s)")
    parser.add_argument("--pause-gap", default="120s", help="serving time before each pause (default 120s)")
    parser.add_argument("--no-pauses", action="store_true", help="no pause/resume cycles")
    parser.add_argument("--breaker", default="60s", help="the session-breaker's duration (default 60s)")
    parser.add_argument("--no-loopers", action="store_true", help="no agents that loop")
    parser.add_argument(
        "--time-scale",
        type=float,
        default=1.0,
        help="run the rules' windows and for:, think times and alert polling this many times faster",
    )
    args = parser.parse_args()
    duration = parse_duration(args.duration)
    warmup = parse_duration(args.warmup) if args.warmup else min(300.0, duration / 6)
    opts = Options(
        duration=duration,
        warmup=warmup,
        sample_interval=parse_duration(args.sample_interval),
        agents=args.agents,
        vllm_url=args.vllm_url,
        vllm_args=tuple(args.vllm_arg),
        ready_timeout=parse_duration(args.ready_timeout),
        workdir=args.workdir,
        seed=args.seed,
        pauses=not args.no_pauses,
        pause_hold=parse_duration(args.pause_hold),
        pause_gap=parse_duration(args.pause_gap),
        loopers=not args.no_loopers,
        breaker=parse_duration(args.breaker),
        time_scale=args.time_scale,
    )

    def interrupted(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, interrupted)
    try:
        report = run_soak(opts)
    except KeyboardInterrupt:
        print("soak: interrupted; everything stopped", file=sys.stderr)
        return 130
    print_report(report)
    if args.json:
        args.json.write_text(json.dumps(report, indent=1) + "\n")
    return 0 if report["verdict"]["pass"] else 1


if __name__ == "__main__":
    sys.exit(main())
