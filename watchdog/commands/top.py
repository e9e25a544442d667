"""`vllm-watchdog top`: a live terminal table over the own HTTP API.

Fetching and rendering are apart: `fetch` reads the API once into a `Snapshot` (plain JSON), and `render`
turns a snapshot and the time into text, a pure function that tests call with recorded JSON. Plain ANSI
escapes, no curses: it works over ssh, in tmux and when piped (`--once`, no colour).
"""

from __future__ import annotations

import itertools
import math
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TextIO

import httpx

from ..exitcodes import EXIT_OK, EXIT_UNREACHABLE
from ..formats.rfc3339 import parse_rfc3339
from .screen import CLEAR, TopError, age_text, answers_cell, api_data, api_get, clock_text, paint, table
from .topfleet import fetch_fleet, render_fleet

SERIES = (
    "vllm:num_requests_running",
    "vllm:num_requests_waiting",
    "vllm:kv_cache_usage_perc",
    "vllm:generation_tokens_total",
    "vllm:spec_decode_num_accepted_tokens_total",
    "vllm:spec_decode_num_draft_tokens_total",
    "vllm_watchdog_gateway_queue_length",
    "vllm_watchdog_gateway_oldest_in_flight_seconds",
)
RATE_WINDOW = 30.0  # seconds of counter samples behind "tok/s" and the acceptance rate
Samples = list[tuple[float, float]]


@dataclass(frozen=True)
class Snapshot:
    """What one refresh read from the API: the JSON documents and, per series name, per instance, samples."""

    url: str
    targets: list[dict[str, Any]]
    alerts: list[dict[str, Any]]
    actions: dict[str, Any]
    gateway: dict[str, Any] | None
    series: dict[str, list[tuple[dict[str, str], Samples]]] = field(default_factory=dict)

    def of(self, name: str, who: str) -> list[Samples]:
        """The samples of every series of `name` whose instance (or gateway target) is `who`."""
        return [
            s
            for labels, s in self.series.get(name, [])
            if who in (labels.get("instance"), labels.get("target"))
        ]


def _samples(raw: list[Any]) -> Samples:
    out: Samples = []
    for t, v in raw:
        value = float("nan") if v == "stale" else float(v)
        out.append((float(t), value))
    return out


def fetch(client: httpx.Client, url: str, *, actions: int = 8, token: str | None = None) -> Snapshot:
    """Read targets, alerts, the last `actions` audit rows, the gateway and the table's series once."""
    base = url.rstrip("/")
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    listing = api_data(api_get(client, base + "/api/v1/targets", headers))
    try:
        targets = [t for t in listing["activeTargets"] if "watchdog" in t]  # vLLM targets, not dcgm
    except (KeyError, TypeError, AttributeError) as exc:
        raise TopError(f"{base}/api/v1/targets: not the watchdog's API") from exc
    alerts = api_data(api_get(client, base + "/api/v1/alerts", headers))["alerts"]
    history = api_data(api_get(client, f"{base}/api/v1/actions?limit={actions}", headers))
    resp = api_get(client, base + "/api/v1/gateway", headers)
    gateway = api_data(resp) if resp.status_code == 200 else None
    series: dict[str, list[tuple[dict[str, str], Samples]]] = {}
    for name in SERIES:
        resp = api_get(client, f"{base}/api/v1/samples", headers, {"match": name})
        if resp.status_code == 200:
            series[name] = [(dict(s["labels"]), _samples(s["samples"])) for s in api_data(resp)]
    return Snapshot(base, targets, alerts, history, gateway, series)


# -- values the table shows -----------------------------------------------------------------------
def last_value(series: Sequence[Samples]) -> float | None:
    """The sum of the newest values of the series; None if none has a live (non-stale) newest sample."""
    live = [s[-1][1] for s in series if s and not math.isnan(s[-1][1])]
    return sum(live) if live else None


def increase(
    series: Sequence[Samples], now: float, window: float = RATE_WINDOW
) -> tuple[float, float] | None:
    """(increase, seconds covered) of counters over the window, summed, resets handled; None if no series
    has two samples in it."""
    total, covered, found = 0.0, 0.0, False
    for samples in series:
        points = [(t, v) for t, v in samples if now - window <= t <= now and not math.isnan(v)]
        if len(points) < 2:
            continue
        found = True
        for (_, a), (_, b) in itertools.pairwise(points):
            total += b - a if b >= a else b  # a reset: the new process counted b from zero
        covered = max(covered, points[-1][0] - points[0][0])
    return (total, covered) if found else None


def spec_acceptance(snap: Snapshot, inst: str, now: float) -> float | None:
    """Accepted over proposed draft tokens in the last RATE_WINDOW seconds; None if no drafts."""
    acc = increase(snap.of("vllm:spec_decode_num_accepted_tokens_total", inst), now)
    drafts = increase(snap.of("vllm:spec_decode_num_draft_tokens_total", inst), now)
    if acc is None or drafts is None or drafts[0] <= 0:
        return None
    return acc[0] / drafts[0]


def token_rate(snap: Snapshot, inst: str, now: float) -> float | None:
    """Generation tokens per second over the last RATE_WINDOW seconds."""
    inc = increase(snap.of("vllm:generation_tokens_total", inst), now)
    if inc is None or inc[1] <= 0:
        return None
    return inc[0] / inc[1]


# -- rendering ------------------------------------------------------------------------------------
def _fmt(v: float | None, spec: str, suffix: str = "") -> str:
    return "-" if v is None else f"{v:{spec}}{suffix}"


def _time_or_none(text: str) -> float | None:
    try:
        return parse_rfc3339(text, no_zone="local")
    except ValueError:
        return None


def _probe(doc: Mapping[str, Any] | None, key: str) -> tuple[str, str | None]:
    if doc is None:
        return ("off", "dim")
    ok = doc.get(key)
    if ok is None:
        return ("-", None)
    latency = float(doc.get("latency") or 0.0)
    return (f"ok {latency * 1000:.0f}ms", "green") if ok else ("FAIL", "red")


def _target_rows(snap: Snapshot, now: float) -> list[list[tuple[str, str | None]]]:
    head = ("TARGET", "UP", "HEALTH", "CANARY", "RUN", "WAIT", "KV", "GEN TOK/S", "SPEC ACC", "ANSWERS")
    rows: list[list[tuple[str, str | None]]] = [[(h, "bold") for h in head]]
    for t in snap.targets:
        own = t.get("watchdog") or {}
        name = str(own.get("name") or t.get("labels", {}).get("instance", "?"))
        up = t.get("health") == "up"
        run = last_value(snap.of("vllm:num_requests_running", name))
        wait = last_value(snap.of("vllm:num_requests_waiting", name))
        kv = last_value(snap.of("vllm:kv_cache_usage_perc", name))
        acc = spec_acceptance(snap, name, now)
        rows.append(
            [
                (name, None),
                ("up", "green") if up else ("DOWN", "red"),
                _probe(own.get("healthProbe"), "up"),
                _probe(own.get("canary"), "success"),
                (_fmt(run, ".0f"), None),
                (_fmt(wait, ".0f"), "yellow" if wait and wait > 0 else None),
                (_fmt(None if kv is None else kv * 100, ".1f", "%"), None),
                (_fmt(token_rate(snap, name, now), ".0f"), None),
                (_fmt(acc, ".2f"), "red" if acc is not None and acc < 0.5 else None),
                answers_cell(own),
            ]
        )
    return rows


def _gateway_lines(snap: Snapshot, color: bool) -> list[str]:
    gw = snap.gateway
    if gw is None:
        return [paint("GATEWAY", "bold", color) + "  none configured"]
    target = str(gw.get("target", ""))
    queue = last_value(snap.of("vllm_watchdog_gateway_queue_length", target))
    limit, ceiling = gw.get("limit"), gw.get("ceiling")
    throttled = limit is not None and ceiling is not None and limit < ceiling
    cap = paint(f"{gw.get('in_flight', 0)}/{limit}", "yellow" if throttled else None, color)
    draining = paint("DRAINING", "yellow", color) if gw.get("draining") else "no"
    line = (
        f"{paint('GATEWAY', 'bold', color)}  {target} on {gw.get('listen', '')}  in-flight/cap {cap} "
        f"(ceiling {ceiling})  queue {_fmt(queue, '.0f')}  draining {draining}"
    )
    lines = [line]
    for session, b in sorted((gw.get("breakers") or {}).items()):
        left = float(b.get("seconds_left", 0.0))
        lines.append(f"  {paint('breaker open', 'red', color)}  session {session}  {age_text(left)} left")
    return lines


def _alert_lines(snap: Snapshot, now: float, color: bool) -> list[str]:
    firing = [a for a in snap.alerts if a.get("state") == "firing"]
    pending = [a for a in snap.alerts if a.get("state") == "pending"]
    title = f"ALERTS  {len(firing)} firing, {len(pending)} pending"
    lines = [paint(title, "bold", color)]
    for a in [*firing, *pending]:
        labels = dict(a.get("labels") or {})
        name = labels.pop("alertname", "?")
        labels.pop("severity", None)
        shown = ",".join(f"{k}={v}" for k, v in sorted(labels.items()) if k not in _QUIET_LABELS)
        since = _time_or_none(str(a.get("activeAt", "")))
        age = "" if since is None else f"  active {age_text(now - since)}"
        state = str(a.get("state", "")).upper()
        tag = paint(f"{state:<7}", "red" if state == "FIRING" else "yellow", color)
        lines.append(f"  {tag} {name}{{{shown}}}{age}")
    return lines


_QUIET_LABELS = frozenset({"job", "guard", "engine", "model_name"})  # the same on every alert of a target
_OUTCOME_COLORS = {"succeeded": "green", "running": "yellow", "failed": "red", "rolled_back": "red"}


def _action_lines(snap: Snapshot, n: int, color: bool) -> list[str]:
    data = snap.actions
    history = list(data.get("history") or [])[:n]
    paused = (data.get("paused") or {}).get("paused")
    title = f"ACTIONS  last {len(history)}" + ("  (PAUSED)" if paused else "")
    lines = [paint(title, "bold", color)]
    rows: list[list[tuple[str, str | None]]] = []
    for h in history:
        trigger = str(h.get("trigger", ""))
        alert = str((h.get("labels") or {}).get("alertname", ""))
        why = f"{trigger}: {alert}" if alert else trigger
        outcome = str(h.get("outcome", ""))
        rows.append(
            [
                ("  " + clock_text(float(h.get("started_at", 0.0))), None),
                (str(h.get("action", "")), None),
                (str(h.get("type", "")), "dim"),
                (outcome, _OUTCOME_COLORS.get(outcome, "dim")),
                (why, None),
                (str(h.get("reason", ""))[:60], "dim"),
            ]
        )
    return lines + (table(rows, color) if rows else ["  none yet"])


def _error_lines(snap: Snapshot, color: bool) -> list[str]:
    """Why each target is down or failing: its last scrape, health and canary errors, each text once."""
    lines = []
    for t in snap.targets:
        own = t.get("watchdog") or {}
        probes = {"health": own.get("healthProbe"), "canary": own.get("canary")}
        seen: dict[str, list[str]] = {}
        if t.get("lastError"):
            seen.setdefault(str(t["lastError"]), []).append("scrape")
        for kind, doc in probes.items():
            if doc and doc.get("lastError"):
                seen.setdefault(str(doc["lastError"]), []).append(kind)
        name = str(own.get("name") or t.get("labels", {}).get("instance", "?"))
        for error, kinds in seen.items():
            lines.append(f"  {paint(name, 'red', color)}  {', '.join(kinds)}: {error}")
    return lines


def render(snap: Snapshot, now: float, *, actions: int = 8, color: bool = False) -> str:
    """One frame of the table, from a snapshot and the current time (no I/O)."""
    head = f"vllm-watchdog top  {snap.url}  {clock_text(now)}Z"
    parts = [paint(head, "bold", color), ""]
    parts += table(_target_rows(snap, now), color) if snap.targets else ["no targets"]
    parts += _error_lines(snap, color)
    parts += ["", *_gateway_lines(snap, color), "", *_alert_lines(snap, now, color), ""]
    parts += _action_lines(snap, actions, color)
    return "\n".join(parts) + "\n"


def run_top(
    url: str,
    *,
    interval: float,
    once: bool,
    out: TextIO,
    actions: int = 8,
    token: str | None = None,
    color: bool = False,
    plain: bool = False,
    clock: Callable[[], float] = time.time,
    sleep: Callable[[float], None] = time.sleep,
    frames: int | None = None,
    fleet: bool = False,
) -> int:
    """Print one frame (`once`) or redraw every `interval` seconds until Ctrl-C (or `frames` frames); `plain`
    (stdout is no terminal: a pipe, a log) prints each frame after the last, without screen escapes. `fleet`:
    the watchdog's fleet group (topfleet.py) rather than the watchdog itself."""
    shown = 0
    with httpx.Client(timeout=5.0, trust_env=False) as client:
        while True:
            try:
                if fleet:
                    frame = render_fleet(fetch_fleet(client, url, token=token), clock(), color=color)
                else:
                    snap = fetch(client, url, actions=actions, token=token)
                    frame = render(snap, clock(), actions=actions, color=color)
            except TopError as exc:
                if once:
                    print(f"vllm-watchdog top: {exc}", file=sys.stderr)
                    return EXIT_UNREACHABLE
                title = "vllm-watchdog top --fleet" if fleet else "vllm-watchdog top"
                frame = f"{title}  {url}  {clock_text(clock())}Z\n\ncannot read the API: {exc}\n"
            if once or plain:  # one frame after another, as a log
                out.write(("\n" if shown else "") + frame)
            else:
                out.write(CLEAR + frame)
            out.flush()
            shown += 1
            if once or (frames is not None and shown >= frames):
                return EXIT_OK
            try:
                sleep(interval)
            except KeyboardInterrupt:
                return EXIT_OK
