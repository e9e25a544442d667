"""`replay --plot`'s picture: a `Timeline` (plot.py) drawn into a PNG, one panel per plotted family, a lane
of alert spans and actions, and the numbered list of actions. matplotlib is imported only here (the `plot`
extra).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from .plot import PANELS, ActionMark, Panel, PlotError, Timeline

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
    entries = action_entries(tl.actions, tl.start)
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
    for ax, panel in zip(plots, shown, strict=True):
        _draw_panel(ax, panel, tl)
    _draw_alerts(lane, tl, names)
    _draw_actions(lane, plots, tl, entries, row=len(names))
    _draw_lane_axes(lane, tl, names)
    listing.axis("off")
    lines = [e.text[:150] for e in entries] or ["no actions in the audit log for this time range"]
    listing.text(0.0, 1.0, "\n".join(lines), fontsize=7, va="top", ha="left", family="monospace")
    if title:
        fig.suptitle(title, fontsize=10)
    fig.savefig(out, dpi=80)
    plt.close(fig)
    return [p.key for p in shown]


def _span(tl: Timeline) -> float:
    return max(tl.end - tl.start, 1.0)


def _draw_panel(ax: Any, panel: Panel, tl: Timeline) -> None:
    """One panel's lines (failures as red bands), on seconds since the timeline's start."""
    for ln in panel.lines:
        ts, vs = tl.series[panel.key][ln.label]
        xs = [t - tl.start for t in ts]
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
    ax.set_xlim(0, _span(tl))


def _draw_alerts(lane: Any, tl: Timeline, names: Sequence[str]) -> None:
    """Each alert's pending (yellow) and firing (red) spans, one row per alert name."""
    x0 = tl.start
    for i, name in enumerate(names):
        for s in (s for s in tl.spans if s.alertname == name):
            end = (s.ended_at if s.ended_at is not None else tl.end) - x0
            fire = s.firing_at - x0 if s.firing_at is not None else end
            lane.broken_barh([(s.pending_at - x0, fire - (s.pending_at - x0))], (i - 0.3, 0.6), color="gold")
            if s.firing_at is not None:
                lane.broken_barh([(fire, end - fire)], (i - 0.3, 0.6), color="tab:red")


def _draw_actions(lane: Any, plots: Sequence[Any], tl: Timeline, entries: Sequence[Any], row: int) -> None:
    """Each action: a bar on the lane's last row and a dashed line across the panels, coloured by outcome."""
    x0, span = tl.start, _span(tl)
    for e in entries:
        color = _OUTCOME_COLORS.get(e.marks[0].outcome, "grey")
        for m in e.marks:
            x = m.started_at - x0
            for ax in plots:
                ax.axvline(x, color=color, linestyle="--", linewidth=0.8, alpha=0.6)
            done = (m.finished_at if m.finished_at is not None else tl.end) - m.started_at
            lane.broken_barh([(x, max(done, span / 400))], (row - 0.3, 0.6), color=color)
        lane.annotate(str(e.number), (e.at, row + 0.35), fontsize=7, ha="center", color=color)


def _draw_lane_axes(lane: Any, tl: Timeline, names: Sequence[str]) -> None:
    lane.set_yticks(range(len(names) + 1), [*names, "actions"], fontsize=7)
    lane.set_ylim(-0.6, len(names) + 1.1)
    lane.set_xlim(0, _span(tl))
    lane.set_title(
        "alerts (yellow: pending, red: firing) and actions (start to finish)", fontsize=9, loc="left"
    )
    lane.tick_params(labelsize=7)
    lane.grid(alpha=0.3, axis="x")
    lane.set_xlabel(f"seconds since {_utc(tl.start)}", fontsize=8)
