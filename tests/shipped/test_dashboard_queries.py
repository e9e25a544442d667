"""Every dashboard query and every bundled rule's selectors return data from a real Prometheus.

Prometheus 2.42 (Debian package) scrapes, every second and set up as deploy/prometheus.yml sets it up (vLLM's
instance named after the watchdog's target, the watchdog with honor_labels, the bundled rules evaluated): the
session's real vLLM 0.32 (job "vllm"), a real watchdog process with its gateway in front of that vLLM (job
"vllm-watchdog") and a dcgm-exporter stand-in serving a fixture (job "dcgm": no GPU here, the only stand-in).
Bounded agent-like load goes through the gateway; then each panel's query runs through the HTTP API as Grafana
would run it, and must return a number.
"""

from __future__ import annotations

import contextlib
import json
import math
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
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
from tests.support.configs import target, write_config
from tests.support.dcgm_exporter_fake import dcgm_exporter
from tests.support.faultserver import FaultServer
from tests.support.prometheus_server import PrometheusServer, running_prometheus
from tests.support.vllm_server import VllmServer, free_port
from tests.support.watchdogproc import poll, start_watchdog

pytestmark = pytest.mark.vllm
ROOT = Path(__file__).resolve().parents[2]
WATCHDOG_JOB = "vllm-watchdog"
CLIENT = httpx.Client(limits=httpx.Limits(max_connections=32), trust_env=False)
# Repetitive text: vLLM's ngram drafter finds matches in it, and every request shares it (prefix-cache hits).
PREFIX = "alpha beta gamma delta " * 60
SESSIONS = ("agent-a", "agent-b", "agent-c")  # top_k 2: one of them lands in session="other"
# Panel queries allowed to return nothing here, with the reason. Keep it empty unless a signal cannot exist.
EXCLUDED: dict[tuple[str, str], str] = {}
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
class Stack:
    """What the test runs: Prometheus, the watchdog's API and gateway, and when the load ran."""

    prom: PrometheusServer
    api: str
    gateway: str
    log: Path
    load_start: float = 0.0
    load_end: float = 0.0


def watchdog_config(
    tmp: Path, vllm: VllmServer, dcgm: FaultServer, sink: FaultServer
) -> tuple[Path, int, int]:
    """The watchdog's config: the real vLLM behind a gateway, a dead target, the dcgm stand-in, a webhook."""
    port, gport = free_port(), free_port()
    rules = tmp / "dashboard.rules.yml"
    rules.write_text(RULES)
    cfg = write_config(
        tmp,
        target(vllm.url, canary={"interval": "2s", "timeout": "30s"}),
        target(f"http://127.0.0.1:{free_port()}", name="ghost"),
        port=port,
        rest=f"""
gpus: {{dcgm_url: "{dcgm.url}/metrics"}}
rule_files: ["{rules}"]
gateway:
  listen: 127.0.0.1:{gport}
  target: vllm-0
  max_in_flight: 4
  sessions: {{rate: 1, burst: 4, top_k: 2}}
actions:
  squeeze: {{type: throttle, factor: 0.5, floor: 1, step: 1, step_interval: 5s,
            max_per_window: {{count: 5, window: 1h}}}}
routes:
  - {{match: {{alertname: DashboardTrafficSeen}}, actions: [squeeze]}}
notifiers:
  - {{type: webhook, name: sink, url: "{sink.url}/hook"}}
""",
    )
    return cfg, port, gport


def prometheus_config(vllm: str, watchdog_port: int, dcgm_port: int) -> str:
    """Scrape and rule settings as deploy/prometheus.yml has them, every second: vLLM's instance is the
    watchdog's target name, the watchdog is scraped with honor_labels, and the bundled rules are evaluated."""
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(ROOT / "rules" / "*.rules.yml")],
        "scrape_configs": [
            {"job_name": "vllm", "static_configs": [{"targets": [vllm], "labels": {"target": "vllm-0"}}]},
            {
                "job_name": WATCHDOG_JOB,
                "honor_labels": True,
                "static_configs": [{"targets": [f"127.0.0.1:{watchdog_port}"]}],
            },
            {"job_name": "dcgm", "static_configs": [{"targets": [f"127.0.0.1:{dcgm_port}"]}]},
        ],
    }
    return json.dumps(config, indent=2)  # YAML reads JSON


@pytest.fixture(scope="module")
def stack(vllm_server: VllmServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """Everything running and scraped, with the load already driven through the gateway."""
    tmp = tmp_path_factory.mktemp("dashboards")
    with contextlib.ExitStack() as stack:
        dcgm = stack.enter_context(dcgm_exporter())
        sink = FaultServer()
        stack.callback(sink.close)
        sink.set("/hook", b"")
        cfg, port, gport = watchdog_config(tmp, vllm_server, dcgm, sink)
        log = tmp / "watchdog.log"
        wd = start_watchdog(cfg, log)
        stack.callback(lambda: (wd.terminate(), wd.wait(20)))
        api = f"http://127.0.0.1:{port}"
        poll(api + "/api/v1/gateway", lambda j: j["data"]["limit"] is not None, 60, "the gateway", log)
        config = prometheus_config(vllm_server.url.removeprefix("http://"), port, dcgm.port)
        prom = stack.enter_context(running_prometheus(config, tmp / "prom"))
        s = Stack(prom, api, f"http://127.0.0.1:{gport}", log)
        prom.wait_for('up{job="vllm"} == 1', timeout=30)
        s.load_start = time.time()
        drive_load(s.gateway)
        s.load_end = time.time()
        settle(s)
        yield s


# -- load -------------------------------------------------------------------------------------------------
def post(gateway: str, path: str, session: str, body: dict[str, Any]) -> int:
    """One request through the gateway, read to the end (streamed or not); returns the status."""
    headers = {"X-Session-ID": session}
    with CLIENT.stream("POST", gateway + path, json=body, headers=headers, timeout=180) as resp:
        for _ in resp.iter_bytes():
            pass
        return resp.status_code


def tool_messages(session: str, step: int) -> list[dict[str, Any]]:
    """An agent step that calls the same tool with the same arguments as before (a loop, in small)."""
    call = {"id": "call_1", "type": "function", "function": {"name": "search", "arguments": '{"q": "docs"}'}}
    return [
        {"role": "system", "content": PREFIX},
        {"role": "user", "content": f"{session} task step {step}"},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "content": "nothing found " * (step + 1)},
    ]


def agent(gateway: str, session: str, statuses: list[int]) -> None:
    """Four steps with a growing context: completion, streamed completion, chat with tool calls, streamed chat."""
    common = {"model": "tiny-llama", "max_tokens": 24, "temperature": 0, "ignore_eos": True}
    usage = {"stream_options": {"include_usage": True}}
    history = ""
    for step in range(4):
        history += f" {session} step {step}" * 20
        if step < 2:
            body = common | {"prompt": PREFIX + history} | ({"stream": True} | usage if step == 1 else {})
            statuses.append(post(gateway, "/v1/completions", session, body))
        else:
            body = (
                common
                | {"messages": tool_messages(session, step)}
                | ({"stream": True} | usage if step == 3 else {})
            )
            statuses.append(post(gateway, "/v1/chat/completions", session, body))


def flood(gateway: str, statuses: list[int]) -> None:
    """Six tiny requests at once from one session: its burst of 4 passes, the rest get 429 (session_rate)."""
    body = {"model": "tiny-llama", "prompt": PREFIX, "max_tokens": 2, "temperature": 0}
    threads = [
        threading.Thread(target=lambda: statuses.append(post(gateway, "/v1/completions", "burst", body)))
        for _ in range(6)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(180)


def hang_up(gateway: str) -> None:
    """A streamed completion the client abandons after its first event (an upstream client_disconnect)."""
    body = {"model": "tiny-llama", "prompt": PREFIX, "max_tokens": 64, "ignore_eos": True, "stream": True}
    headers = {"X-Session-ID": "agent-a"}
    with CLIENT.stream("POST", gateway + "/v1/completions", json=body, headers=headers, timeout=180) as resp:
        assert resp.status_code == 200
        next(resp.iter_lines())


def drive_load(gateway: str) -> None:
    """Bounded load: three agents at once, then a burst from one session, then one abandoned stream."""
    statuses: list[int] = []
    agents = [threading.Thread(target=agent, args=(gateway, s, statuses)) for s in SESSIONS]
    for t in agents:
        t.start()
    for t in agents:
        t.join(300)
    assert statuses == [200] * 12, statuses
    burst: list[int] = []
    flood(gateway, burst)
    assert 429 in burst and set(burst) == {200, 429}, burst  # tokens refill at 1/s: 4 or 5 pass
    hang_up(gateway)


# Series the load creates late; each must have a few samples, or rate() over them has nothing to work on.
LATE_SERIES = (
    'ALERTS{alertname="DashboardTrafficSeen", alertstate="firing"}',
    'vllm_watchdog_actions_total{action="squeeze", outcome="succeeded"}',
    'vllm_watchdog_gateway_upstream_errors_total{kind="client_disconnect"}',
    'vllm_watchdog_gateway_session_requests_total{session="other"}',
)


def settle(s: Stack) -> None:
    """Wait (bounded) until the watchdog has acted and Prometheus has scraped the state after the load."""
    for series in LATE_SERIES:
        s.prom.wait_for(f"count_over_time({series}[1m]) >= 3", timeout=30)
    s.prom.wait_for(f"timestamp(vllm_watchdog_build_info) > {s.load_end + 2:.3f}", timeout=30)
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


@pytest.mark.parametrize("name", NAMES)
def test_every_panel_query_returns_data(stack: Stack, name: str) -> None:
    doc = load(name)
    names = variable_names(doc)
    window = f"{max(10, round(time.time() - stack.load_start) // 4)}s"
    start, end = stack.load_start - 5, time.time() - 0.5
    report, empty = [], []
    for query in queries(name, doc):
        if query.where.startswith("variable "):
            continue  # test_every_variable_has_values
        expr = substitute(query.expr, names, window)
        got = run(stack.prom, expr, query.instant, start, end)
        finite = [v for v in got if math.isfinite(v)]
        top = f", max {max(finite):.4g}" if finite else ""
        report.append(f"{query.where}: {len(got)} values, {len(finite)} finite{top}")
        if not finite and (name, query.where) not in EXCLUDED:
            empty.append(f"{query.where}: {expr}")
    print(f"\n{name} ($__rate_interval={window}):\n  " + "\n  ".join(report))
    assert not empty, "No data:\n" + "\n".join(empty) + f"\nwatchdog log: {stack.log.read_text()[-2000:]}"


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
