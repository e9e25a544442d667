"""`replay --plot`: a timeline PNG of a recording, with the replayed alerts and the audited actions marked.

The data comes first and the picture second: `build_timeline` replays the recording (the same Replayer as
`replay`), evaluates one PromQL expression per plotted line every `step` seconds of simulated time, turns the
alert transitions into firing spans and reads the actions from the audit log. `render_png` only draws that
`Timeline` (plotpng.py), so tests check what is drawn, not pixels. matplotlib is imported only there (the
`plot` extra).
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ..config.model import Config
from ..promql.engine import Engine
from ..promql.values import QueryError, Scalar, Vector
from ..ruler.files import RuleGroup
from .replay import Replayer, Transition, feed


class PlotError(Exception):
    """The plot cannot be made: matplotlib is missing, or the audit log cannot be read."""


@dataclass(frozen=True)
class Line:
    """One plotted line: a label and the PromQL expression evaluated at each step (one-element result)."""

    label: str
    expr: str
    style: str = "line"  # "line", or "failures": a marker wherever the value is 0


@dataclass(frozen=True)
class Panel:
    """One row of the figure."""

    key: str
    title: str
    unit: str
    lines: tuple[Line, ...]
    optional: bool = False  # drawn only if the recording has data for it


_ACC = "sum(rate(vllm:spec_decode_num_accepted_tokens_total[15s]))"
_DRAFT = "sum(rate(vllm:spec_decode_num_draft_tokens_total[15s]))"
PANELS: tuple[Panel, ...] = (
    Panel(
        "requests",
        "vLLM requests",
        "requests",
        (
            Line("running", "sum(vllm:num_requests_running)"),
            Line("waiting", "sum(vllm:num_requests_waiting)"),
        ),
    ),
    Panel(
        "tokens",
        "generation",
        "tokens/s",
        (Line("generated", "sum(rate(vllm:generation_tokens_total[10s]))"),),
    ),
    Panel("kv", "KV cache", "% used", (Line("KV usage", "100 * max(vllm:kv_cache_usage_perc)"),)),
    Panel(
        "spec",
        "speculative decoding",
        "accepted/drafted",
        (Line("acceptance", f"{_ACC} / {_DRAFT}"),),
    ),
    Panel(
        "canary",
        "canary completion",
        "seconds",
        (
            Line("latency", "max(vllm_watchdog_canary_latency_seconds)"),
            Line("failed", "min(vllm_watchdog_canary_success)", style="failures"),
        ),
    ),
    Panel(
        "gateway",
        "gateway",
        "requests",
        (
            Line("in flight", "sum(vllm_watchdog_gateway_in_flight)"),
            Line("cap", "min(vllm_watchdog_gateway_limit)"),
        ),
        optional=True,
    ),
)


@dataclass(frozen=True)
class AlertSpan:
    """An alert's active time: pending from `pending_at`, firing from `firing_at` (None: never fired) until
    `ended_at` (None: still active when the recording ends)."""

    alertname: str
    labels: tuple[tuple[str, str], ...]
    pending_at: float
    firing_at: float | None
    ended_at: float | None


@dataclass(frozen=True)
class ActionMark:
    """One audited action inside the recording's time range."""

    started_at: float
    finished_at: float | None
    action: str
    type: str
    target: str
    trigger: str
    outcome: str
    reason: str
    alertname: str

    @property
    def label(self) -> str:
        """The text drawn at the marker."""
        what = f"{self.action} (restore)" if self.trigger == "restore" else self.action
        return f"{what}: {self.outcome}"


@dataclass
class Timeline:
    """Everything the figure shows, in unix seconds."""

    start: float
    end: float
    series: dict[str, dict[str, tuple[list[float], list[float]]]] = field(default_factory=dict)
    spans: list[AlertSpan] = field(default_factory=list)
    actions: list[ActionMark] = field(default_factory=list)

    def has_data(self, panel: str) -> bool:
        """Whether any line of the panel has a value that is not NaN."""
        return any(not math.isnan(v) for _, vs in self.series.get(panel, {}).values() for v in vs)


def _value(engine: Engine, expr: str, t: float) -> float:
    try:
        result = engine.query(expr, t)
    except QueryError:
        return math.nan
    if isinstance(result, Scalar):
        return result.value
    if isinstance(result, Vector) and result:
        return result[0].value
    return math.nan


def alert_spans(transitions: Sequence[Transition]) -> list[AlertSpan]:
    """Pending/firing spans, one per activation of each alert (by name and labels), in start order."""
    open_: dict[tuple[str, tuple[tuple[str, str], ...]], list[Any]] = {}
    done: list[AlertSpan] = []
    for tr in transitions:
        key = (tr.alertname, tr.labels)
        if tr.state == "pending":
            open_[key] = [tr.t, None]
        elif tr.state == "firing":
            open_.setdefault(key, [tr.t, None])[1] = tr.t
        elif tr.state in ("resolved", "inactive") and key in open_:
            pending, firing = open_.pop(key)
            done.append(AlertSpan(tr.alertname, tr.labels, pending, firing, tr.t))
    done += [AlertSpan(k[0], k[1], p, f, None) for k, (p, f) in open_.items()]
    return sorted(done, key=lambda s: (s.pending_at, s.alertname))


def read_audit(path: str, start: float, end: float) -> list[ActionMark]:
    """Actions started within [start, end] from a state_dir (or its actions.sqlite), oldest first."""
    from ..actions.store.actionstore import ACTIONS_DB, ActionStore  # noqa: PLC0415 (keeps `replay` without --audit light)

    db = os.path.join(path, ACTIONS_DB) if os.path.isdir(path) else path
    if not os.path.isfile(db):
        raise PlotError(f"no audit log at {db} (give --audit the watchdog's state_dir)")
    store = ActionStore(db)
    try:
        rows = store.history(limit=None, steps=False)
    finally:
        store.close()
    marks = [
        ActionMark(
            r.started_at,
            r.finished_at,
            r.action,
            r.type,
            r.target,
            r.trigger,
            r.outcome,
            r.reason,
            str(r.labels.get("alertname", "")),
        )
        for r in rows
        if start <= r.started_at <= end
    ]
    return sorted(marks, key=lambda m: m.started_at)


def build_timeline(
    config: Config,
    groups: tuple[RuleGroup, ...],
    input_path: str,
    *,
    audit: str | None = None,
    step: float = 1.0,
    start: float | None = None,
    end: float | None = None,
    panels: Sequence[Panel] = PANELS,
) -> tuple[Timeline, Replayer]:
    """Replay the recording, sampling the panels' lines every `step` seconds; ScrapeLogError if unreadable."""
    rp = Replayer(config, groups)
    engine = Engine(rp.store, lookback=config.global_.lookback_delta)
    series: dict[str, dict[str, tuple[list[float], list[float]]]] = {
        p.key: {ln.label: ([], []) for ln in p.lines} for p in panels
    }
    next_at: float | None = None

    def sample_before(t: float, inclusive: bool = False) -> None:
        nonlocal next_at
        if next_at is None:
            next_at = math.floor(t) if start is None else start
        while next_at < t or (inclusive and next_at <= t):
            for p in panels:
                for ln in p.lines:
                    ts, vs = series[p.key][ln.label]
                    ts.append(next_at)
                    vs.append(_value(engine, ln.expr, next_at))
            next_at += step

    feed(rp, input_path, start=start, end=end, on_record=sample_before)
    first, last = rp.stats.first, rp.stats.last
    if first is None or last is None:
        return Timeline(start or 0.0, end or 0.0, series), rp
    t_end = last if end is None else end
    sample_before(t_end, inclusive=True)
    t_start = first if start is None else max(start, first)
    tl = Timeline(t_start, t_end, series, alert_spans(rp.transitions))
    if audit is not None:
        tl.actions = read_audit(audit, t_start, t_end)
    return tl, rp
