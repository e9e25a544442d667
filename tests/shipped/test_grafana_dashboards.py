"""The bundled Grafana dashboards and provisioning files, checked without Grafana: structure, datasource wiring,
and every query parsed by the project's PromQL parser (tests/shipped/test_dashboard_queries.py runs them for real)."""

from __future__ import annotations

import importlib.util
import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from vllm_watchdog.promql.compile import (
    Sel,
    children,
    compile_plan,
)

ROOT = Path(__file__).resolve().parents[2]
GRAFANA = ROOT / "grafana"
DASHBOARDS = GRAFANA / "dashboards"
NAMES = ("vllm-serving.json", "gpu.json", "watchdog.json")
DS = {"type": "prometheus", "uid": "${DS_PROMETHEUS}"}
BUILTIN_INTERVALS = ("__rate_interval", "__interval", "__range")
VARIABLE = re.compile(r"\$(?:\{(\w+)\}|(\w+))")
LABEL_VALUES = re.compile(r"^label_values\((?:(.+),\s*)?(\w+)\)$")
# In-container paths that deploy/compose.yaml mounts grafana/ at.
PROVISIONING_MOUNT = "/etc/grafana/provisioning"
DASHBOARDS_MOUNT = "/var/lib/grafana/dashboards"


@dataclass(frozen=True)
class Query:
    """One PromQL expression of a dashboard and where it sits."""

    dashboard: str
    where: str  # e.g. "panel 7 'Tokens/s' B", "annotation 'Watchdog actions'", "variable instance"
    expr: str
    instant: bool = False


def load(name: str) -> dict[str, Any]:
    """One committed dashboard."""
    doc: dict[str, Any] = json.loads((DASHBOARDS / name).read_text())
    return doc


def variables(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """The dashboard's template variables."""
    return list(doc["templating"]["list"])


def queries(name: str, doc: dict[str, Any]) -> list[Query]:
    """Every PromQL expression: panel targets, Prometheus annotations, and the selectors of query variables."""
    out = []
    for p in doc["panels"]:
        for t in p.get("targets", []):
            where = f"panel {p['id']} {p['title']!r} {t['refId']}"
            out.append(Query(name, where, t["expr"], bool(t.get("instant"))))
    for a in doc["annotations"]["list"]:
        if "expr" in a:
            out.append(Query(name, f"annotation {a['name']!r}", a["expr"]))
    for v in variables(doc):
        if v["type"] == "query":
            m = LABEL_VALUES.match(v["query"])
            assert m and m.group(1), f"{name}: variable {v['name']}: not label_values(selector, label)"
            out.append(Query(name, f"variable {v['name']}", m.group(1), instant=True))
    return out


def substitute(expr: str, names: set[str], interval: str) -> str:
    """Replace dashboard variables with `.*` (their "All" value) and Grafana's interval variables."""

    def value(m: re.Match[str]) -> str:
        var = m.group(1) or m.group(2)
        if var in BUILTIN_INTERVALS:
            return interval
        assert var in names, f"undefined variable ${var} in {expr}"
        return ".*"

    return VARIABLE.sub(value, expr)


def selectors(expr: str) -> list[tuple[str | None, str]]:
    """The vector selectors of an expression: (metric name or None, the selector alone, without offset/range)."""
    out: set[tuple[str | None, str]] = set()
    todo = [compile_plan(expr)]
    while todo:
        node = todo.pop()
        if isinstance(node, Sel):
            matchers = ", ".join(f"{m.name}{m.op}{json.dumps(m.value)}" for m in node.selector.matchers)
            out.add((node.selector.name, "{" + matchers + "}"))
        todo.extend(children(node))
    return sorted(out, key=lambda s: s[1])


def all_queries() -> list[Query]:
    """Every query of every bundled dashboard."""
    return [q for name in NAMES for q in queries(name, load(name))]


def variable_names(doc: dict[str, Any]) -> set[str]:
    """Names of the dashboard's variables."""
    return {v["name"] for v in variables(doc)}


def build_module() -> Any:
    """grafana/build.py, loaded from its file (a script, not part of the package; `build` is also a folder)."""
    sys.path.insert(0, str(GRAFANA))  # for its sibling modules (panels, board_*)
    try:
        spec = importlib.util.spec_from_file_location("grafana_build", GRAFANA / "build.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path.remove(str(GRAFANA))


# -- the tests --------------------------------------------------------------------------------------------
def test_committed_json_is_what_the_generator_writes() -> None:
    build = build_module()
    docs = build.documents()
    assert sorted(docs) == sorted(NAMES)
    assert sorted(p.name for p in DASHBOARDS.glob("*.json")) == sorted(NAMES)
    for name, doc in docs.items():
        assert (DASHBOARDS / name).read_text() == build.render(doc), f"run: python grafana/build.py ({name})"


@pytest.mark.parametrize("name", NAMES)
def test_structure_ids_and_layout(name: str) -> None:
    doc = load(name)
    ids = [p["id"] for p in doc["panels"]]
    assert len(ids) == len(set(ids)), f"duplicate panel ids in {name}"
    cells: set[tuple[int, int]] = set()
    for p in doc["panels"]:
        g = p["gridPos"]
        assert g["x"] >= 0 and g["w"] > 0 and g["x"] + g["w"] <= 24, p["title"]
        mine = {(x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])}
        assert not mine & cells, f"{name}: panel {p['title']!r} overlaps another"
        cells |= mine
        assert p["title"] and (p["type"] == "row" or p["description"]), p
    uids = [load(n)["uid"] for n in NAMES]
    assert len(set(uids)) == len(uids) and all(len(u) <= 40 for u in uids)


@pytest.mark.parametrize("name", NAMES)
def test_every_query_uses_the_datasource_variable(name: str) -> None:
    doc = load(name)
    (inp,) = doc["__inputs"]
    assert (inp["name"], inp["type"], inp["pluginId"]) == ("DS_PROMETHEUS", "datasource", "prometheus")
    ds_vars = [v for v in variables(doc) if v["type"] == "datasource"]
    assert [(v["name"], v["query"]) for v in ds_vars] == [("DS_PROMETHEUS", "prometheus")]
    for p in doc["panels"]:
        if p["type"] == "row":
            assert "targets" not in p
            continue
        assert p["datasource"] == DS, p["title"]
        assert p["targets"], p["title"]
        refs = [t["refId"] for t in p["targets"]]
        assert len(refs) == len(set(refs)), p["title"]
        assert all(t["datasource"] == DS for t in p["targets"]), p["title"]
    for a in doc["annotations"]["list"]:
        if not a.get("builtIn"):
            assert a["datasource"] == DS, a["name"]
    for v in variables(doc):
        if v["type"] == "query":
            assert v["datasource"] == DS and v["allValue"] == ".*", v["name"]
    # Nothing else may name a datasource: a fixed uid would break both import and provisioning elsewhere.
    grafana_builtin = {"type": "grafana", "uid": "-- Grafana --"}
    assert all(ds in (DS, grafana_builtin) for ds in datasources(doc))


def datasources(value: Any) -> list[Any]:
    """Every value of a "datasource" key anywhere in a JSON document."""
    if isinstance(value, list):
        return [d for v in value for d in datasources(v)]
    if isinstance(value, dict):
        own = [value["datasource"]] if "datasource" in value else []
        return own + [d for v in value.values() for d in datasources(v)]
    return []


@pytest.mark.parametrize("query", all_queries(), ids=lambda q: f"{q.dashboard}:{q.where}")
def test_every_query_parses(query: Query) -> None:
    names = variable_names(load(query.dashboard))
    expr = substitute(query.expr, names, "1m")
    assert compile_plan(expr) is not None
    assert selectors(expr), expr
    for var in ("job", "instance"):
        # variables are multi-value regexes: only =~ can take "a|b" or ".*"
        assert f'{var}="${var}"' not in query.expr and f'{var}!="${var}"' not in query.expr


def test_rates_use_the_rate_interval() -> None:
    for q in all_queries():
        for window in re.findall(r"\[([^\]]+)\]", q.expr):
            assert window == "$__rate_interval", f"{q.dashboard} {q.where}: [{window}]"


def test_provisioning_files() -> None:
    sources = yaml.safe_load((GRAFANA / "provisioning" / "datasources" / "prometheus.yml").read_text())
    (ds,) = sources["datasources"]
    assert sources["apiVersion"] == 1 and ds["type"] == "prometheus" and ds["isDefault"] is True
    assert ds["url"].startswith("http") and ds["jsonData"]["timeInterval"]
    boards = yaml.safe_load((GRAFANA / "provisioning" / "dashboards" / "vllm-watchdog.yml").read_text())
    (provider,) = boards["providers"]
    assert boards["apiVersion"] == 1 and provider["type"] == "file"
    assert provider["options"]["path"] == DASHBOARDS_MOUNT
    assert all((DASHBOARDS / n).is_file() for n in NAMES)


# Grafana's rules for a uid (pkg/util/shortid_generator.go: IsValidShortUID, IsShortUIDTooLong), and one uid
# space for folders and dashboards in an org (its dashboard store refuses to save a dashboard whose uid is a
# folder's: "Dashboard cannot be changed to a folder", and the other way round).
GRAFANA_UID = re.compile(r"[a-zA-Z0-9\-_]{1,40}")


def test_provisioned_uids_follow_grafanas_rules_and_never_clash() -> None:
    boards = yaml.safe_load((GRAFANA / "provisioning" / "dashboards" / "vllm-watchdog.yml").read_text())
    sources = yaml.safe_load((GRAFANA / "provisioning" / "datasources" / "prometheus.yml").read_text())
    folders = [p["folderUid"] for p in boards["providers"] if p.get("folderUid")]
    dashboards = [load(n)["uid"] for n in NAMES]
    datasources = [d["uid"] for d in sources["datasources"] if "uid" in d]
    for uid in (*folders, *dashboards, *datasources):
        assert GRAFANA_UID.fullmatch(uid), uid
    assert len(set(folders + dashboards)) == len(folders) + len(dashboards), (folders, dashboards)
    assert len({p["name"] for p in boards["providers"]}) == len(boards["providers"])


def test_compose_mounts_grafana_where_provisioning_expects_it() -> None:
    compose = yaml.safe_load((ROOT / "deploy" / "compose.yaml").read_text())
    services = compose["services"]
    mounts = {}
    for volume in services["grafana"].get("volumes", []):
        source, target = (
            volume.split(":")[:2] if isinstance(volume, str) else (volume["source"], volume["target"])
        )
        mounts[target] = (ROOT / "deploy" / source).resolve()
    assert mounts.get(PROVISIONING_MOUNT) == GRAFANA / "provisioning", mounts
    assert mounts.get(DASHBOARDS_MOUNT) == DASHBOARDS, mounts
    # the provisioned datasource reaches the compose Prometheus (all services on the host network)
    listen = [
        a.split("=", 1)[1] for a in services["prometheus"]["command"] if a.startswith("--web.listen-address=")
    ]
    sources = yaml.safe_load((GRAFANA / "provisioning" / "datasources" / "prometheus.yml").read_text())
    assert sources["datasources"][0]["url"] == f"http://{listen[0]}"
