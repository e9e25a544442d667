"""Building blocks of the dashboards: panels, queries, variables and a grid layout (used by build.py).

Panels read the datasource from the dashboard variable `DS_PROMETHEUS`, and `__inputs` declares an import
input of the same name: file provisioning resolves `${DS_PROMETHEUS}` through the variable (provisioning
ignores `__inputs`), and the UI import replaces every `${DS_PROMETHEUS}` with the datasource picked in the
import dialog.
"""

from __future__ import annotations

import json
from typing import Any

Json = dict[str, Any]
DS = {"type": "prometheus", "uid": "${DS_PROMETHEUS}"}
GRID_WIDTH = 24
LINE_WIDTH = 110  # render() keeps an object or list on one line if it fits
TAGS = ["vllm", "vllm-watchdog"]


def actions_new(sel: str, window: str) -> str:
    """Watchdog actions counted within `window` before each point, including the first of each kind.

    The watchdog exports every configured action, target and outcome from 0, but a series it did not know in
    advance (an alert naming a target the config lacks, refused) is born at 1, which increase() cannot see, so
    the increase is taken against 0 for a series that did not exist `window` earlier.
    """
    a = f"vllm_watchdog_actions_total{{{sel}}}" if sel else "vllm_watchdog_actions_total"
    return f"clamp_min({a} - ({a} offset {window} or {a} * 0), 0)"


def q(expr: str, legend: str = "", *, instant: bool = False, table: bool = False) -> Json:
    """One Prometheus query of a panel."""
    t: Json = {"datasource": DS, "expr": expr, "legendFormat": legend or "__auto"}
    if instant or table:
        t |= {"instant": True, "range": False}
    if table:
        t["format"] = "table"
    return t


def rate(metric: str, sel: str, by: str) -> str:
    """Per-second rate of a counter over the rate interval, summed by `by`."""
    selector = f"{metric}{{{sel}}}" if sel else metric
    return f"sum by ({by}) (rate({selector}[$__rate_interval]))"


def ratio(num: str, den: str, sel: str, by: str) -> str:
    """Rate of one counter over the rate of another."""
    return f"{rate(num, sel, by)} / {rate(den, sel, by)}"


def hist(metric: str, sel: str, by: str = "instance, le") -> list[Json]:
    """p50/p90/p99 of a histogram over the rate interval, one line per value of `by` (besides le)."""
    buckets = rate(metric + "_bucket", sel, by)
    prefix = "".join(f"{{{{{label.strip()}}}}} " for label in by.split(",") if label.strip() != "le")
    return [q(f"histogram_quantile({p}, {buckets})", f"{prefix}p{round(p * 100)}") for p in (0.5, 0.9, 0.99)]


def thresholds(*steps: tuple[float, str]) -> Json:
    """Absolute thresholds: green below the first step."""
    return {
        "mode": "absolute",
        "steps": [{"color": "green", "value": None}] + [{"color": c, "value": v} for v, c in steps],
    }


def panel(kind: str, title: str, desc: str, targets: list[Json], unit: str = "short", **extra: Any) -> Json:
    """A panel without position; `Board.add` places it. `extra` keys: min, max, no_value, mappings,
    thresholds, overrides, options, custom, transformations."""
    defaults: Json = {"unit": unit}
    for key in ("min", "max", "mappings", "thresholds"):
        if key in extra:
            defaults[key] = extra[key]
    if "no_value" in extra:
        defaults["noValue"] = extra["no_value"]
    if "custom" in extra:
        defaults["custom"] = extra["custom"]
    for i, t in enumerate(targets):
        t["refId"] = chr(ord("A") + i)
    p: Json = {
        "type": kind,
        "title": title,
        "description": desc,
        "datasource": DS,
        "fieldConfig": {"defaults": defaults, "overrides": extra.get("overrides", [])},
        "options": extra.get("options", {}),
        "targets": targets,
    }
    if "transformations" in extra:
        p["transformations"] = extra["transformations"]
    return p


def series(title: str, desc: str, targets: list[Json], unit: str = "short", **extra: Any) -> Json:
    """A time-series panel; bars=True draws bars (for counts per interval); line=<value> draws a red threshold
    line there (an alert's threshold, from rulefiles.threshold)."""
    custom: Json = (
        {"drawStyle": "bars", "fillOpacity": 60} if extra.pop("bars", False) else {"fillOpacity": 10}
    )
    line = extra.pop("line", None)
    if line is not None:
        custom["thresholdsStyle"] = {"mode": "line"}
        extra["thresholds"] = thresholds((line, "red"))
    options = {
        "legend": {"displayMode": "list", "placement": "bottom", "showLegend": True},
        "tooltip": {"mode": "multi", "sort": "desc"},
    }
    return panel("timeseries", title, desc, targets, unit, custom=custom, options=options, **extra)


def stat(title: str, desc: str, targets: list[Json], unit: str = "short", **extra: Any) -> Json:
    """A single-value panel showing the last value."""
    options = {
        "colorMode": "value",
        "graphMode": "area",
        "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
        "textMode": "auto",
    }
    return panel("stat", title, desc, targets, unit, options=options, **extra)


def timeline(title: str, desc: str, targets: list[Json], mappings: list[Json], **extra: Any) -> Json:
    """A state timeline: one lane per series, coloured by value mapping."""
    options = {"mergeValues": True, "showValue": "never", "legend": {"showLegend": False}}
    return panel("state-timeline", title, desc, targets, mappings=mappings, options=options, **extra)


def values(*pairs: tuple[int, str, str]) -> list[Json]:
    """Value mappings: (value, text, colour)."""
    return [
        {"type": "value", "options": {str(v): {"text": text, "color": color, "index": i}}}
        for i, (v, text, color) in enumerate(pairs)
    ]


def dashed(regex: str) -> Json:
    """An override drawing the series whose name matches `regex` as a dashed line without fill."""
    return {
        "matcher": {"id": "byRegexp", "options": regex},
        "properties": [
            {"id": "custom.lineStyle", "value": {"dash": [10, 10], "fill": "dash"}},
            {"id": "custom.fillOpacity", "value": 0},
        ],
    }


def variable(name: str, metric: str, label: str, selector: str = "") -> Json:
    """A multi-value query variable over `label` of `metric`, "All" meaning any value (.*)."""
    query = (
        f"label_values({metric}{{{selector}}}, {label})" if selector else f"label_values({metric}, {label})"
    )
    return {
        "name": name,
        "label": name,
        "type": "query",
        "datasource": DS,
        "definition": query,
        "query": query,
        "refresh": 2,
        "includeAll": True,
        "allValue": ".*",
        "multi": True,
        "current": {},
        "options": [],
        "sort": 1,
        "hide": 0,
        "regex": "",
    }


DATASOURCE_VARIABLE: Json = {
    "name": "DS_PROMETHEUS",
    "label": "Data source",
    "type": "datasource",
    "query": "prometheus",
    "current": {},
    "options": [],
    "refresh": 1,
    "regex": "",
    "hide": 0,
}


class Board:
    """Lays panels out left to right on Grafana's 24-column grid and numbers them in order."""

    def __init__(self) -> None:
        self.panels: list[Json] = []
        self.x = self.y = self.line_height = 0

    def _newline(self) -> None:
        self.y += self.line_height
        self.x = self.line_height = 0

    def row(self, title: str) -> None:
        """Start a new titled row."""
        self._newline()
        grid = {"h": 1, "w": GRID_WIDTH, "x": 0, "y": self.y}
        self.panels.append(
            {"id": len(self.panels) + 1, "type": "row", "title": title, "gridPos": grid, "collapsed": False}
        )
        self.y += 1

    def add(self, p: Json, w: int, h: int = 8) -> None:
        """Place a panel `w` columns wide and `h` high."""
        if self.x + w > GRID_WIDTH:
            self._newline()
        grid = {"h": h, "w": w, "x": self.x, "y": self.y}
        head = {"id": len(self.panels) + 1, "type": p["type"], "title": p["title"], "gridPos": grid}
        self.panels.append(head | p)
        self.x += w
        self.line_height = max(self.line_height, h)


def dashboard(
    uid: str, title: str, desc: str, board: Board, variables: list[Json], notes: list[Json]
) -> Json:
    """The whole dashboard document, importable (`__inputs`) and provisionable (datasource variable)."""
    builtin = {
        "builtIn": 1,
        "datasource": {"type": "grafana", "uid": "-- Grafana --"},
        "enable": True,
        "hide": True,
        "iconColor": "rgba(0, 211, 255, 1)",
        "name": "Annotations & Alerts",
        "type": "dashboard",
    }
    panel_types = sorted({p["type"] for p in board.panels if p["type"] != "row"})
    return {
        "__inputs": [
            {
                "name": "DS_PROMETHEUS",
                "label": "Prometheus",
                "description": "Prometheus that scrapes vLLM, vllm-watchdog and dcgm-exporter",
                "type": "datasource",
                "pluginId": "prometheus",
                "pluginName": "Prometheus",
            }
        ],
        "__requires": [
            {"type": "grafana", "id": "grafana", "name": "Grafana", "version": "10.0.0"},
            {"type": "datasource", "id": "prometheus", "name": "Prometheus", "version": "1.0.0"},
        ]
        + [{"type": "panel", "id": t, "name": t, "version": ""} for t in panel_types],
        "uid": uid,
        "title": title,
        "description": desc,
        "tags": TAGS,
        "editable": True,
        "graphTooltip": 1,
        "refresh": "30s",
        "schemaVersion": 39,
        "time": {"from": "now-1h", "to": "now"},
        "timepicker": {},
        "timezone": "",
        "version": 1,
        "links": [
            {
                "type": "dashboards",
                "tags": ["vllm-watchdog"],
                "asDropdown": True,
                "title": "vllm-watchdog",
                "includeVars": True,  # the other dashboards open on the same job, instance and time range
                "keepTime": True,
            }
        ],
        "annotations": {"list": [builtin, *notes]},
        "templating": {"list": [DATASOURCE_VARIABLE, *variables]},
        "panels": board.panels,
    }


def action_annotation(sel: str) -> Json:
    """Marks every watchdog action (action, target, outcome) on the time axis."""
    return {
        "name": "Watchdog actions",
        "datasource": DS,
        "enable": True,
        "hide": False,
        "iconColor": "orange",
        "expr": f"sum by (action, target, outcome) ({actions_new(sel, '1m')}) > 0",
        "step": "30s",
        "titleFormat": "{{action}} on {{target}}: {{outcome}}",
        "tagKeys": "action,target,outcome",
        "textFormat": "",
        "useValueForTime": False,
    }


def table(title: str, desc: str, targets: list[Json], unit: str, organize: Json) -> Json:
    """A table of instant query results, columns picked and renamed by an organize transformation."""
    options = {"showHeader": True}
    return panel("table", title, desc, targets, unit, transformations=[organize], options=options)


def heatmap(title: str, desc: str, expr: str, unit: str) -> Json:
    """A heatmap of a Prometheus histogram's bucket counts per interval (`expr` keeps `le`)."""
    target = q(expr, "{{le}}") | {"format": "heatmap"}
    options = {
        "calculate": False,
        "cellGap": 1,
        "color": {"mode": "scheme", "scheme": "Oranges", "exponent": 0.5, "fill": "dark-orange", "steps": 64},
        "yAxis": {"axisPlacement": "left", "unit": unit},
        "rowsFrame": {"layout": "auto"},
        "tooltip": {"mode": "single", "yHistogram": True},
        "legend": {"show": True},
    }
    return panel("heatmap", title, desc, [target], unit, options=options)


def bars(title: str, desc: str, targets: list[Json]) -> Json:
    """A horizontal bar gauge of instant values."""
    options = {
        "displayMode": "basic",
        "orientation": "horizontal",
        "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
        "showUnfilled": True,
    }
    return panel("bargauge", title, desc, targets, options=options, no_value="none")


def render(doc: Json) -> str:
    """The file text of one dashboard: indented JSON, with objects and lists that fit kept on one line."""
    return _render(doc, 0) + "\n"


def _render(value: Any, depth: int) -> str:
    flat = json.dumps(value, ensure_ascii=False)
    if not isinstance(value, (dict, list)) or len(flat) + 2 * depth <= LINE_WIDTH or not value:
        return flat
    pad = "  " * (depth + 1)
    if isinstance(value, dict):
        items = [f"{pad}{json.dumps(k)}: {_render(v, depth + 1)}" for k, v in value.items()]
        return "{\n" + ",\n".join(items) + "\n" + "  " * depth + "}"
    items = [pad + _render(v, depth + 1) for v in value]
    return "[\n" + ",\n".join(items) + "\n" + "  " * depth + "]"
