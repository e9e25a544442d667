"""Parts of bench/detect_to_act.py: webhook receiver, configs, Prometheus + Alertmanager pairs, gauges."""

from __future__ import annotations

import json
import re
import threading
import time
from dataclasses import dataclass
from datetime import datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx

THRESHOLD = 2
RULES = f"""groups:
  - name: queue
    rules:
      - alert: QueueBacklog
        expr: vllm:num_requests_waiting > {THRESHOLD}
        for: 0s
        labels: {{severity: warning}}
"""
_GAUGE = r"^vllm:num_requests_{}(?:\{{[^}}]*\}})? ([0-9.eE+-]+)$"
WAITING, RUNNING = (re.compile(_GAUGE.format(k), re.M) for k in ("waiting", "running"))
# A stand-in for systemctl: the unit (the bench's vLLM, its main process) has been active for an hour; `stop`
# and `start` are logged and do nothing (vLLM keeps serving); anything else is logged and refused.
SYSTEMCTL_STUB = """#!/bin/sh
echo "$*" >> "{log}"
case "$1" in
  is-active) echo active ;;
  stop|start) ;;
  show)
    since=$(date -d @$(( $(date +%s) - 3600 )) '+%a %Y-%m-%d %H:%M:%S UTC' -u)
    mono=$(awk '{{printf "%d", ($1 > 3600 ? $1 - 3600 : 1) * 1000000}}' /proc/uptime)
    echo "Id=vllm-bench.service"; echo "Names=vllm-bench.service"; echo "LoadState=loaded"
    echo "ActiveState=active"; echo "SubState=running"; echo "MainPID={pid}"
    echo "ActiveEnterTimestamp=$since"; echo "ExecMainStartTimestamp=$since"
    echo "ActiveEnterTimestampMonotonic=$mono"; echo "ExecMainStartTimestampMonotonic=$mono" ;;
  *) echo "bench stub: refusing systemctl $*" >&2; exit 1 ;;
esac
"""


# -- webhook receiver -----------------------------------------------------------------------------
class Receiver:
    """Alertmanager webhooks on 127.0.0.1, in a thread: (arrival time, path, status) of each one."""

    def __init__(self) -> None:
        self.events: list[tuple[float, str, str]] = []
        lock, events = threading.Lock(), self.events

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                at = time.time()
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                try:
                    status = str(json.loads(body).get("status", "?"))
                except ValueError:
                    status = "garbage"
                with lock:
                    events.append((at, self.path, status))
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, name="webhooks", daemon=True)
        self.thread.start()

    def first(self, path: str, status: str, after: float) -> float | None:
        """When the first `status` webhook on `path` arrived after `after`."""
        return min(
            (t for t, p, s in list(self.events) if p == path and s == status and t >= after), default=None
        )

    def close(self) -> None:
        """Stop serving."""
        self.server.shutdown()
        self.server.server_close()


# -- configs --------------------------------------------------------------------------------------
def prometheus_config(vllm_port: int, am_port: int, rules: Path, interval: str | None) -> str:
    """Scrape vLLM directly and alert to one Alertmanager; interval None keeps Prometheus' 1m defaults."""
    glob = {"scrape_interval": interval, "evaluation_interval": interval} if interval else {}
    cfg = {
        "global": glob,
        "rule_files": [str(rules)],
        "alerting": {"alertmanagers": [{"static_configs": [{"targets": [f"127.0.0.1:{am_port}"]}]}]},
        "scrape_configs": [{"job_name": "vllm", "static_configs": [{"targets": [f"127.0.0.1:{vllm_port}"]}]}],
    }
    return json.dumps(cfg, indent=1) + "\n"  # YAML is a superset of JSON


def alertmanager_config(webhook: str, tight: bool) -> str:
    """One webhook receiver; tight: group_wait 0s, group_interval 1s; else Alertmanager's defaults."""
    route: dict[str, Any] = {"receiver": "bench"}
    if tight:
        route |= {"group_wait": "0s", "group_interval": "1s", "repeat_interval": "1h"}
    receivers = [{"name": "bench", "webhook_configs": [{"url": webhook, "send_resolved": True}]}]
    return json.dumps({"route": route, "receivers": receivers}, indent=1) + "\n"


def write_watchdog(
    tmp: Path, port: int, vllm_url: str, vllm_pid: int, incident_budget: float | None
) -> tuple[Path, Path]:
    """Config, rules and systemctl stub: 1 s scrape and evaluation, the rule routed to a restart of a
    systemd-mode target whose unit is the stub (so vLLM is never stopped) and whose main process is the real
    vLLM; rails that let every flood act; an incident collected with `incident_budget`, or none (None).
    Returns the config path and the stub's."""
    rules, stub = tmp / "queue.rules.yml", tmp / "systemctl"
    rules.write_text(RULES)
    stub.write_text(SYSTEMCTL_STUB.format(log=tmp / "systemctl.calls", pid=vllm_pid))
    stub.chmod(0o755)
    target = {"name": "vllm-0", "url": vllm_url, "canary": False, "unit": "vllm-bench.service"}
    restart = {"type": "restart", "startup_grace": "0s", "cooldown": "0s", "drain_timeout": "0s"}
    restart |= {"max_per_window": None, "crash_loop_window": "0s", "ready_timeout": "60s"}
    incidents = (
        {"enabled": False} if incident_budget is None else {"budget": f"{incident_budget * 1000:.0f}ms"}
    )
    cfg = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "listen": f"127.0.0.1:{port}",
        "state_dir": str(tmp / "state"),
        "targets": [target],
        "rule_files": [str(rules)],
        "routes": [{"match": {"alertname": "QueueBacklog"}, "actions": ["restart"]}],
        "actions": {"restart": restart},
        "incidents": incidents,
    }
    path = tmp / "watchdog.yml"
    path.write_text(json.dumps(cfg, indent=1) + "\n")
    return path, stub


@dataclass
class Scenario:
    """One Prometheus + Alertmanager pair whose webhooks arrive on `path`."""

    name: str
    describe: str
    prom: Any  # tests/prometheus_server.PrometheusServer
    am: Any  # tests/alertmanager_server.AlertmanagerServer
    path: str
    bound: float
    running: bool = True

    def stop(self) -> None:
        """Stop both processes."""
        self.running = False
        self.prom.close()
        self.am.close()


def start_scenario(
    name: str, tmp: Path, vllm_port: int, receiver: Receiver, tight: bool, bound: float
) -> Scenario:
    """Start Alertmanager, then Prometheus pointing at it."""
    from tests.support.alertmanager_server import AlertmanagerServer
    from tests.support.prometheus_server import PrometheusServer

    work = tmp / name
    (work / "am").mkdir(parents=True)
    (work / "prom").mkdir()
    (work / "queue.rules.yml").write_text(RULES)
    am = AlertmanagerServer(work / "am", None)
    am.config_path.write_text(alertmanager_config(f"{receiver.url}/{name}", tight))
    am.start()
    config = prometheus_config(vllm_port, am.port, work / "queue.rules.yml", "1s" if tight else None)
    prom = PrometheusServer(config, work / "prom")
    try:
        prom.start()
    except Exception:
        am.close()
        raise
    what = (
        "scrape 1s, eval 1s, group_wait 0s, group_interval 1s"
        if tight
        else "scrape 1m, eval 1m, group_wait 30s"
    )
    return Scenario(name, what, prom, am, f"/{name}", bound)


def rfc3339_seconds(text: str) -> float | None:
    """Unix seconds of an RFC 3339 UTC time as Prometheus and the watchdog write it (ns are cut to us)."""
    m = re.match(r"(.*?T\d\d:\d\d:\d\d)(\.\d+)?Z$", text)
    if m is None:
        return None
    frac = (m.group(2) or ".0")[:7]
    return datetime.fromisoformat(f"{m.group(1)}{frac}+00:00").timestamp()


async def queue_depth(client: httpx.AsyncClient, vllm_url: str) -> tuple[float, float] | None:
    """(waiting, running) from vLLM's /metrics, summed over engines; None if it did not answer."""
    try:
        text = (await client.get(vllm_url + "/metrics", timeout=0.5)).text
    except httpx.HTTPError:
        return None
    return sum(map(float, WAITING.findall(text))), sum(map(float, RUNNING.findall(text)))


async def active_at(client: httpx.AsyncClient, base: str) -> float | None:
    """When the QueueBacklog alert became active, from a Prometheus-style GET /api/v1/alerts at `base`."""
    alerts = (await client.get(base + "/api/v1/alerts", timeout=2)).json()["data"]["alerts"]
    active = [rfc3339_seconds(a["activeAt"]) for a in alerts if a["labels"]["alertname"] == "QueueBacklog"]
    return min((a for a in active if a is not None), default=None)
