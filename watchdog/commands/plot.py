"""`replay --plot`: a timeline PNG of a recording, with the replayed alerts and the audited actions marked.

The data comes first and the picture second: `build_timeline` replays the recording (the same Replayer as
`replay`), evaluates one PromQL expression per plotted line every `step` seconds of simulated time, turns the
alert transitions into firing spans and reads the actions from the audit log. `render_png` only draws that
`Timeline`, so tests check what is drawn, not pixels. matplotlib is imported only there (the `plot` extra).
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
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
    from ..actions.state import ACTIONS_DB, ActionStore  # noqa: PLC0415 (keeps `replay` without --audit light)

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


# -- drawing --------------------------------------------------------------------------------------
_OUTCOME_COLORS = {
    "succeeded": "tab:green",
    "failed": "tab:red",
    "rolled_back": "tab:red",
    "running": "tab:orange",
}
REPEAT_WINDOW = 120.0  # the same action again within this many seconds is one numbered entry ("x3")


@dataclass(frozen=True)
class ActionEntry:
    """A numbered entry of the figure's action list: one action, or a run of repeats of it."""

    number: int
    at: float  # seconds from the figure's start to the first mark
    marks: tuple[ActionMark, ...]

    @property
    def text(self) -> str:
        """The entry's line under the figure."""
        m = self.marks[0]
        why = f"alert {m.alertname}" if m.alertname else m.trigger
        if m.trigger == "restore":
            why = f"restore after {m.alertname or 'the alert'} resolved"
        times = f" (x{len(self.marks)})" if len(self.marks) > 1 else ""
        reason = f": {m.reason}" if m.reason else ""
        return f"{self.number}  +{self.at:.0f}s  {m.action}{times} [{why}] {m.outcome}{reason}"


def action_entries(marks: Sequence[ActionMark], x0: float = 0.0) -> list[ActionEntry]:
    """Number the drawn actions (skips and refusals are not drawn); repeats of one action, outcome and
    trigger within REPEAT_WINDOW of each other share an entry. Entry times are relative to x0."""
    entries: list[ActionEntry] = []
    runs: dict[tuple[str, str, str], int] = {}  # key -> index into entries of its open run
    for m in marks:
        if m.outcome in ("skipped", "refused"):
            continue
        key = (m.action, m.outcome, m.trigger)
        at = runs.get(key)
        if at is not None and m.started_at - entries[at].marks[-1].started_at <= REPEAT_WINDOW:
            e = entries[at]
            entries[at] = ActionEntry(e.number, e.at, (*e.marks, m))
            continue
        runs[key] = len(entries)
        entries.append(ActionEntry(len(entries) + 1, m.started_at - x0, (m,)))
    return entries


def _failure_spans(ts: Sequence[float], vs: Sequence[float], step: float) -> list[tuple[float, float]]:
    """Runs of samples equal to 0, as (start, width)."""
    spans: list[tuple[float, float]] = []
    for t, v in zip(ts, vs, strict=True):
        if v != 0:
            continue
        if spans and t - (spans[-1][0] + spans[-1][1]) <= step * 1.01:
            spans[-1] = (spans[-1][0], t + step - spans[-1][0])
        else:
            spans.append((t, step))
    return spans


def _utc(t: float) -> str:
    return datetime.fromtimestamp(t, tz=timezone.utc).strftime("%Y-%m-%d %H:%M:%SZ")


def render_png(tl: Timeline, out: str, *, title: str = "", panels: Sequence[Panel] = PANELS) -> list[str]:
    """Draw the timeline into a PNG at `out`; returns the panel keys drawn. PlotError without matplotlib."""
    try:
        import matplotlib  # noqa: PLC0415 (optional dependency, imported only to draw)

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt  # noqa: PLC0415
    except ImportError as exc:
        raise PlotError(f"--plot needs matplotlib: pip install 'vllm-watchdog[plot]' ({exc})") from None
    shown = [p for p in panels if not p.optional or tl.has_data(p.key)]
    names = sorted({s.alertname for s in tl.spans})
    x0 = tl.start
    entries = action_entries(tl.actions, x0)
    lane_h, list_h = 0.5 + 0.22 * (len(names) + 1), 0.2 + 0.16 * len(entries)
    heights = [1.3] * len(shown) + [lane_h, list_h]
    fig, axes = plt.subplots(
        len(heights),
        1,
        figsize=(12, sum(heights) + 0.4),
        gridspec_kw={"height_ratios": heights},
        layout="constrained",
    )
    plots, lane, listing = axes[: len(shown)], axes[-2], axes[-1]
    span = max(tl.end - x0, 1.0)
    for ax, panel in zip(plots, shown, strict=True):
        for ln in panel.lines:
            ts, vs = tl.series[panel.key][ln.label]
            xs = [t - x0 for t in ts]
            if ln.style == "failures":
                step = xs[1] - xs[0] if len(xs) > 1 else 1.0
                for i, (a, w) in enumerate(_failure_spans(xs, vs, step)):
                    ax.axvspan(a, a + w, color="tab:red", alpha=0.2, lw=0, label=ln.label if i == 0 else None)
            else:
                ax.plot(xs, vs, linewidth=1.2, label=ln.label)
        ax.set_ylabel(panel.unit, fontsize=8)
        ax.set_title(panel.title, fontsize=9, loc="left", pad=2)
        ax.tick_params(labelsize=7, labelbottom=False)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="upper right", frameon=False)
        top = max(ax.get_ylim()[1], 1e-9)
        ax.set_ylim(-0.05 * top, top)  # a line at 0 stays visible above the axis
        ax.set_xlim(0, span)
    for i, name in enumerate(names):
        for s in (s for s in tl.spans if s.alertname == name):
            end = (s.ended_at if s.ended_at is not None else tl.end) - x0
            fire = s.firing_at - x0 if s.firing_at is not None else end
            lane.broken_barh([(s.pending_at - x0, fire - (s.pending_at - x0))], (i - 0.3, 0.6), color="gold")
            if s.firing_at is not None:
                lane.broken_barh([(fire, end - fire)], (i - 0.3, 0.6), color="tab:red")
    row = len(names)
    for e in entries:
        color = _OUTCOME_COLORS.get(e.marks[0].outcome, "grey")
        for m in e.marks:
            x = m.started_at - x0
            for ax in plots:
                ax.axvline(x, color=color, linestyle="--", linewidth=0.8, alpha=0.6)
            done = (m.finished_at if m.finished_at is not None else tl.end) - m.started_at
            lane.broken_barh([(x, max(done, span / 400))], (row - 0.3, 0.6), color=color)
        lane.annotate(str(e.number), (e.at, row + 0.35), fontsize=7, ha="center", color=color)
    lane.set_yticks(range(len(names) + 1), [*names, "actions"], fontsize=7)
    lane.set_ylim(-0.6, len(names) + 1.1)
    lane.set_xlim(0, span)
    lane.set_title(
        "alerts (yellow: pending, red: firing) and actions (start to finish)", fontsize=9, loc="left"
    )
    lane.tick_params(labelsize=7)
    lane.grid(alpha=0.3, axis="x")
    lane.set_xlabel(f"seconds since {_utc(tl.start)}", fontsize=8)
    listing.axis("off")
    lines = [e.text[:150] for e in entries] or ["no actions in the audit log for this time range"]
    listing.text(0.0, 1.0, "\n".join(lines), fontsize=7, va="top", ha="left", family="monospace")
    if title:
        fig.suptitle(title, fontsize=10)
    fig.savefig(out, dpi=80)
    plt.close(fig)
    return [p.key for p in shown]
