"""Every dashboard query and every bundled rule's selectors return data from a real Prometheus, in three setups.

One Prometheus 2.42 (Debian package) scrapes every second, set up as deploy/prometheus.yml sets it up (vLLM's
own instance and a watchdog target's name, the watchdogs with honor_labels and their ALERTS dropped, the
bundled rules evaluated): the session's real vLLM 0.32 (job "vllm"), a dcgm-exporter stand-in serving a fixture
(job "dcgm": no GPU here, the only stand-in), and three real watchdog processes (job "vllm-watchdog"), one per
setup:
- monitoring: targets (one of them dead), the dcgm source, rules and a webhook; no gateway, no actions;
- gateway: the same with its gateway in front of vLLM;
- remediation: a gateway, and an action routed from a rule.
Bounded agent-like load goes through both gateways at once; then each panel's query runs through the HTTP API as
Grafana would run it, the watchdog dashboard's job and instance set to one setup's watchdog, and must return a
number (0 counts too: the watchdog's counters start at 0). Only panels about what a setup lacks may be empty
there, and they must be: that shows each setup's panels read that setup's watchdog.
"""

from __future__ import annotations

import contextlib
import json
import math
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.shipped.test_grafana_dashboards import (
    LABEL_VALUES,
    NAMES,
    load,
    queries,
    selectors,
    substitute,
    variable_names,
)
from tests.support.agent_traffic import agent, flood, hang_up
from tests.support.configs import target, write_config
from tests.support.dcgm_exporter_fake import dcgm_exporter
from tests.support.faultserver import FaultServer
from tests.support.prometheus_server import PrometheusServer, running_prometheus
from tests.support.vllm_server import VllmServer, free_port
from tests.support.watchdogproc import poll, start_watchdog

pytestmark = pytest.mark.vllm
ROOT = Path(__file__).resolve().parents[2]
WATCHDOG_JOB = "vllm-watchdog"
SESSIONS = ("agent-a", "agent-b", "agent-c")  # top_k 2: one of them lands in session="other"
SETUPS = ("monitoring", "gateway", "remediation")
CANARY = {"interval": "2s", "timeout": "30s"}  # on the remediation setup's target only: one canary is enough
# The known answers are checked where the canary runs; every 3 s, so that the baseline is learnt and judged
# before the load ends (the default is a minute).
INTEGRITY = "integrity: {interval: 3s}\n"
# Watchdog-dashboard panels (by title, or by the title of their row) that show what a setup lacks: empty there,
# and only there. Keep it to what a setup cannot have.
NO_GATEWAY = "no gateway in this setup"
NO_ACTIONS = "no actions configured in this setup"
ABSENT: dict[str, dict[str, str]] = {
    "monitoring": {
        "Gateway admission": NO_GATEWAY,
        "Sessions (the top K by traffic; the rest summed as other)": NO_GATEWAY,
        "Gateway in flight / cap": NO_GATEWAY,
        "Actions taken": NO_ACTIONS,
        "Action outcomes (since start)": NO_ACTIONS,
        "Watchdog actions": NO_ACTIONS,  # the annotation
        "Rails A": NO_ACTIONS,  # the budgets left; B and C (running, drained) count 0
    },
    "gateway": {
        "Actions taken": NO_ACTIONS,
        "Action outcomes (since start)": NO_ACTIONS,
        "Watchdog actions": NO_ACTIONS,
        "Rails A": NO_ACTIONS,
    },
    "remediation": {},
    # the vLLM serving and GPU dashboards (no setup): the shared test vLLM runs without the NaN check
    "": {"NaN-logit requests/s": "vLLM counts NaN logits only with VLLM_COMPUTE_NANS_IN_LOGITS=1"},
}
# Serving-dashboard panels that may be empty or not (checked neither way), with the reason.
MAY_BE_EMPTY = dict.fromkeys(
    ("Speculation speedup by batch size", "Draft tokens by batch size", "Schedule gain"),
    "the goodput estimate (sources/specgoodput.py) needs scrape intervals in which the ngram proposer drafted "
    "in a batch-size range; whether this test's sampled agent traffic gives one is chance",
)
# Rule selectors with no series in a healthy system, with the reason: by metric name, or by the selector as the
# failure message prints it.
FAULT_ONLY = {
    "vllm_watchdog_gpu_xid_errors_total": "counted from NVML XID events inside the watchdog: no GPU here, and "
    "the watchdog keeps it in its own store (it is not on /metrics)",
    '{code=~"5..", code!="503", __name__="vllm_watchdog_gateway_responses_total"}': "the gateway has a series "
    "per status code it sent; 5xx other than 503 (drain) only come from failed forwarding (502/504) or vLLM errors",
    "vllm_watchdog_engine_paused": "read from vLLM's /is_paused, which only a vLLM in dev mode "
    "(VLLM_SERVER_DEV_MODE=1) serves; the shared test vLLM is not (tests/chaos/test_pause.py runs one that is)",
    "vllm_watchdog_engine_sleeping": "read from vLLM's /is_sleeping, dev mode only, as above",
    "vllm:corrupted_requests_total": "vLLM exports it only with VLLM_COMPUTE_NANS_IN_LOGITS=1, which the shared "
    "test vLLM runs without",
    "vllm_watchdog_spec_schedule_gain": "the speculation goodput estimate, from intervals in which vLLM "
    "drafted; the test's sampled traffic gives the ngram proposer too few drafts (bench/speculation.py has it)",
    "vllm_watchdog_engines_unhealthy": "read from vLLM's GET /fault_tolerance/status, which only a vLLM with "
    "--enable-fault-tolerance (data parallelism in external-LB mode) serves; the shared test vLLM runs without",
    "vllm_watchdog_known_answer_baseline_info": "read by VLLMAnswersUnchecked with state=learning only, which "
    "lasts seconds here: the remediation setup's baseline is learnt before the load ends",
}
RULES = """groups:
  - name: dashboard-test
    rules:
      - alert: DashboardTrafficSeen
        expr: sum by (target) (vllm_watchdog_gateway_admitted_total) > 0
        labels: {severity: info}
        annotations: {summary: "traffic through the gateway"}
      - alert: DashboardSessionsTracked
        expr: vllm_watchdog_gateway_sessions_tracked > 0
        for: 1h
        labels: {severity: info}
        annotations: {summary: "stays pending"}
"""


@dataclass
class Setup:
    """One watchdog process: its API, its gateway (if any) and the name of its vLLM target."""

    name: str
    port: int
    target: str
    gport: int | None = None
    log: Path = Path()

    @property
    def api(self) -> str:
        """The watchdog's API."""
        return f"http://127.0.0.1:{self.port}"

    @property
    def gateway(self) -> str:
        """The gateway's URL."""
        return f"http://127.0.0.1:{self.gport}"


@dataclass
class Stack:
    """What the test runs: Prometheus, the three watchdogs, and when the load ran."""

    prom: PrometheusServer
    setups: dict[str, Setup] = field(default_factory=dict)
    load_start: float = 0.0
    load_end: float = 0.0

    def logs(self) -> str:
        """The end of every watchdog's log, for a failure's message."""
        return "\n".join(f"{s.name}: {s.log.read_text()[-1500:]}" for s in self.setups.values())


def watchdog_config(tmp: Path, setup: Setup, vllm: VllmServer, dcgm: FaultServer, sink: FaultServer) -> Path:
    """A setup's config: its vLLM target (and a dead one when monitoring), the dcgm stand-in, a webhook; the
    gateway unless monitoring; an action routed from a rule when remediating. One canary is enough."""
    tmp.mkdir()
    rules = tmp / "dashboard.rules.yml"
    rules.write_text(RULES)
    canary = CANARY if setup.name == "remediation" else False
    targets = [target(vllm.url, name=setup.target, canary=canary)]
    if setup.name == "monitoring":
        targets.append(target(f"http://127.0.0.1:{free_port()}", name="ghost"))
    rest = f"""
gpus: {{dcgm_url: "{dcgm.url}/metrics"}}
rule_files: ["{rules}"]
notifiers:
  - {{type: webhook, name: sink, url: "{sink.url}/hook"}}
"""
    if setup.gport is not None:
        rest += f"""gateway:
  listen: 127.0.0.1:{setup.gport}
  target: {setup.target}
  max_in_flight: 4
  max_queue_time: 300s  # vLLM runs one sequence at a time for both gateways: waits are long on a busy machine
  sessions: {{rate: 1, burst: 4, top_k: 2}}
"""
    if setup.name == "remediation":
        rest += INTEGRITY
        rest += """actions:
  squeeze: {type: throttle, factor: 0.5, floor: 1, step: 1, step_interval: 5s,
            max_per_window: {count: 5, window: 1h}}
routes:
  - {match: {alertname: DashboardTrafficSeen}, actions: [squeeze]}
"""
    # Only the remediation watchdog scrapes vLLM every second: each scrape costs vLLM CPU that its engine needs.
    scrape = "1s" if setup.name == "remediation" else "3s"
    settings = {"scrape_interval": scrape, "evaluation_interval": "1s"}
    return write_config(tmp, *targets, port=setup.port, rest=rest, global_settings=settings)


def prometheus_config(vllm: str, watchdog_ports: list[int], dcgm_port: int) -> str:
    """Scrape and rule settings as deploy/prometheus.yml has them, every second: vLLM keeps Prometheus' own
    instance (host:port, as the watchdogs label it too) and carries a watchdog target's name, the watchdogs are
    scraped with honor_labels and their ALERTS dropped (Prometheus writes its own from the same rules), and the
    bundled rules are evaluated."""
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(ROOT / "rules" / "*.rules.yml")],
        "scrape_configs": [
            {"job_name": "vllm", "static_configs": [{"targets": [vllm], "labels": {"target": "vllm-0"}}]},
            {
                "job_name": WATCHDOG_JOB,
                "honor_labels": True,
                "static_configs": [{"targets": [f"127.0.0.1:{port}" for port in watchdog_ports]}],
                "metric_relabel_configs": [
                    {"source_labels": ["__name__"], "regex": "ALERTS|ALERTS_FOR_STATE", "action": "drop"}
                ],
            },
            {"job_name": "dcgm", "static_configs": [{"targets": [f"127.0.0.1:{dcgm_port}"]}]},
        ],
    }
    return json.dumps(config, indent=2)  # YAML reads JSON


@pytest.fixture(scope="module")
def stack(vllm_server: VllmServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """Everything running and scraped, with the load already driven through both gateways."""
    tmp = tmp_path_factory.mktemp("dashboards")
    with contextlib.ExitStack() as stack:
        dcgm = stack.enter_context(dcgm_exporter())
        sink = FaultServer()
        stack.callback(sink.close)
        sink.set("/hook", b"")
        setups = {
            "monitoring": Setup("monitoring", free_port(), "mon-0"),
            "gateway": Setup("gateway", free_port(), "gw-0", free_port()),
            "remediation": Setup("remediation", free_port(), "vllm-0", free_port()),
        }
        for s in setups.values():  # all three start at once
            s.log = tmp / f"{s.name}.log"
            wd = start_watchdog(watchdog_config(tmp / s.name, s, vllm_server, dcgm, sink), s.log)
            stack.callback(lambda wd=wd: (wd.terminate(), wd.wait(20)))
        # Prometheus starts while they do: it scrapes them once they listen (before, their `up` is 0)
        ports = [s.port for s in setups.values()]
        config = prometheus_config(vllm_server.url.removeprefix("http://"), ports, dcgm.port)
        prom = stack.enter_context(running_prometheus(config, tmp / "prom"))
        for s in setups.values():
            ready = (
                (lambda j: j["data"]["limit"] is not None)
                if s.gport
                else (lambda j: j["status"] == "success")
            )
            poll(s.api + ("/api/v1/gateway" if s.gport else "/api/v1/targets"), ready, 60, s.name, s.log)
        st = Stack(prom, setups)
        prom.wait_for('up{job="vllm"} == 1', timeout=30)
        st.load_start = time.time()
        drive_load(setups["remediation"].gateway, setups["gateway"].gateway)
        st.load_end = time.time()
        settle(st)
        yield st


# -- load -------------------------------------------------------------------------------------------------
def drive_load(gateway: str, other: str) -> None:
    """Bounded load: three agents at once, and one with short answers through the other gateway, then a burst
    from one session, then one abandoned stream."""
    statuses: list[int] = []
    agents = [threading.Thread(target=agent, args=(gateway, s, statuses)) for s in SESSIONS]
    agents.append(threading.Thread(target=agent, args=(other, "agent-g", statuses, 4)))
    for t in agents:
        t.start()
    for t in agents:
        t.join(300)
    assert statuses == [200] * 16, statuses
    burst: list[int] = []
    flood(gateway, burst)
    assert 429 in burst and set(burst) == {200, 429}, burst  # tokens refill at 1/s: 4 or 5 pass
    hang_up(gateway)


# Series the load creates late; each must have a few samples, or rate() over them has nothing to work on.
LATE_SERIES = (
    'ALERTS{alertname="VLLMGPUPowerCapped"}',  # Prometheus' own, pending: the stand-in's GPU 0 is at 98%
    'vllm_watchdog_actions_total{action="squeeze", outcome="succeeded"}',
    'vllm_watchdog_gateway_upstream_errors_total{kind="client_disconnect"} > 0',
    'vllm_watchdog_gateway_session_requests_total{session="other"}',
    'vllm_watchdog_gateway_session_requests_total{session="agent-g"}',
    "vllm_watchdog_known_answer_ok",  # after the baseline is learnt (learn_probes checks)
)


def settle(s: Stack) -> None:
    """Wait (bounded) until the watchdog has acted and Prometheus has scraped the state after the load."""
    for series in LATE_SERIES:
        s.prom.wait_for(f"count_over_time(({series})[1m:1s]) >= 3", timeout=30)
    s.prom.wait_for(f"min(timestamp(vllm_watchdog_build_info)) > {s.load_end + 2:.3f}", timeout=30)
    s.prom.wait_for(f'timestamp(vllm:num_requests_running{{job="vllm"}}) > {s.load_end + 2:.3f}', timeout=30)


# -- queries ----------------------------------------------------------------------------------------------
def run(prom: PrometheusServer, expr: str, instant: bool, start: float, end: float) -> list[float]:
    """Every value the query returns, as Grafana would ask: a range query at 1 s steps, or an instant one."""
    if instant:
        data = prom.api_query(expr, end)
        rows = data["result"] if data["resultType"] == "vector" else [{"value": data["result"]}]
        return [float(r["value"][1]) for r in rows]
    params = {"query": expr, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": "1"}
    body = prom.http.get("/api/v1/query_range", params=params).json()
    assert body["status"] == "success", (expr, body)
    return [float(v) for r in body["data"]["result"] for _, v in r["values"]]


CASES = [("vllm-serving.json", ""), ("gpu.json", "")] + [("watchdog.json", s) for s in SETUPS]


def places(doc: dict[str, Any]) -> dict[str, tuple[str, str]]:
    """Panel id -> its title and the title of the row it sits in."""
    out, row = {}, ""
    for p in doc["panels"]:
        row = p["title"] if p["type"] == "row" else row
        out[str(p["id"])] = (p["title"], row)
    return out


def absent(setup: str, place: tuple[str, str], ref: str) -> str | None:
    """Why a query (panel title and refId, or row) may be empty in this setup (None: it must have data)."""
    reasons = ABSENT.get(setup, {})
    title, row = place
    return reasons.get(f"{title} {ref}") or reasons.get(title) or reasons.get(row)


@pytest.mark.parametrize(("name", "setup"), CASES, ids=[f"{n}-{s}" if s else n for n, s in CASES])
def test_every_panel_query_returns_data(stack: Stack, name: str, setup: str) -> None:
    doc = load(name)
    names, place = variable_names(doc), places(doc)
    window = f"{max(10, round(time.time() - stack.load_start) // 4)}s"
    start, end = stack.load_start - 5, time.time() - 0.5
    report, empty, not_empty = [], [], []
    for query in queries(name, doc):
        if query.where.startswith("variable "):
            continue  # test_every_variable_has_values
        expr = query.expr
        if setup:  # the watchdog dashboard's job and instance pick this setup's watchdog
            expr = expr.replace("$job", WATCHDOG_JOB).replace(
                "$instance", f"127.0.0.1:{stack.setups[setup].port}"
            )
        expr = substitute(expr, names, window)
        got = run(stack.prom, expr, query.instant, start, end)
        finite = [v for v in got if math.isfinite(v)]
        top = f", max {max(finite):.4g}" if finite else ""
        report.append(f"{query.where}: {len(got)} values, {len(finite)} finite{top}")
        kind, rest = query.where.split(" ", 1)  # "panel 7 'Title' A" or "annotation 'Name'"
        if kind == "panel" and place[rest.split()[0]][0] in MAY_BE_EMPTY:
            continue
        if kind == "panel":
            why = absent(setup, place[rest.split()[0]], rest.rsplit(" ", 1)[1])
        else:
            why = absent(setup, (rest.strip("'\""), ""), "")
        if not finite and why is None:
            empty.append(f"{query.where}: {expr}")
        if finite and why is not None:
            not_empty.append(f"{query.where} ({why}): {expr}")
    print(f"\n{name} {setup} ($__rate_interval={window}):\n  " + "\n  ".join(report))
    assert not empty, "No data:\n" + "\n".join(empty) + f"\nwatchdog logs: {stack.logs()}"
    # data where the setup lacks what the panel shows: another setup's watchdog leaks in, or ABSENT is stale
    assert not not_empty, "Data where none can be:\n" + "\n".join(not_empty)


@pytest.mark.parametrize("name", NAMES)
def test_every_variable_has_values(stack: Stack, name: str) -> None:
    doc = load(name)
    for v in doc["templating"]["list"]:
        if v["type"] != "query":
            continue
        m = LABEL_VALUES.match(v["query"])
        assert m is not None, v["query"]
        selector, label = m.groups()
        match = substitute(selector, variable_names(doc), "1m")
        body = stack.prom.http.get(f"/api/v1/label/{label}/values", params={"match[]": match}).json()
        assert body["status"] == "success" and body["data"], (v["name"], match, body)
    if name == "watchdog.json":  # one instance per setup
        body = stack.prom.http.get(
            "/api/v1/label/instance/values", params={"match[]": "vllm_watchdog_build_info"}
        )
        ports = {f"127.0.0.1:{s.port}" for s in stack.setups.values()}
        assert set(body.json()["data"]) == ports


def rules() -> list[tuple[str, dict[str, Any]]]:
    """(file, rule) for every rule of the bundled rule files, read now (they change while we work)."""
    out = []
    for path in sorted((ROOT / "rules").glob("*.rules.yml")):
        for group in yaml.safe_load(path.read_text())["groups"]:
            out += [(path.name, rule) for rule in group["rules"]]
    return out


def test_bundled_rule_selectors_and_records_return_data(stack: Stack) -> None:
    missing, skipped, checked = [], set(), 0
    for file, rule in rules():
        name = rule.get("alert") or rule["record"]
        for metric, selector in selectors(rule["expr"]):
            if metric in FAULT_ONLY or selector in FAULT_ONLY:
                skipped.add(selector)
                continue
            checked += 1
            if not stack.prom.api_query(selector)["result"]:
                missing.append(f"{file} {name}: {selector}")
        if "record" in rule:  # Prometheus evaluates the bundled rules (deploy/prometheus.yml does too)
            checked += 1
            if not stack.prom.api_query(rule["record"])["result"]:
                missing.append(f"{file} record {name}: {rule['expr']}")
    print(f"\nrule selectors and records checked: {checked}; skipped: {sorted(skipped)}")
    assert not missing, "No data in Prometheus for:\n" + "\n".join(missing)
