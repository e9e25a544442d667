"""The bundled rules in a real Prometheus 2.42 that labels vLLM its own way.

Prometheus scrapes a fake vLLM (a real vLLM 0.32 /metrics capture) under a job of its own name, `inference`,
with its default `instance="host:port"`, and the watchdog's /metrics with `honor_labels: true`; the watchdog
watches the same server as target `gpu-box` with `global: {job: inference}`. Nothing relabels anything. The
bundled rule files are loaded as shipped except for their `for:` durations, cut to 1s so that alerts fire in
seconds. VLLMDown must fire through the join of Prometheus' own `up` with the watchdog's series, and not for
another job's target that goes down at the same time.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable
from pathlib import Path
from urllib.parse import urlsplit

from tests.support.configs import target, watchdog_yaml
from tests.support.faultserver import FaultServer
from tests.support.prometheus_server import PrometheusServer, running_prometheus
from tests.support.vllm_server import free_port
from tests.support.watchdogproc import poll, start_watchdog
from vllm_watchdog.config.addresses import scrape_address

ROOT = Path(__file__).resolve().parents[2]
CAPTURE = ROOT / "tests" / "fixtures" / "vllm-0.32.0-metrics.txt"
LIMIT = 60.0  # a bound on each wait, not a timing: Prometheus scrapes and evaluates every second


def _bundled_rules_firing_fast(into: Path) -> str:
    """Copies of rules/*.yml with every `for:` cut to 1s; the glob Prometheus loads them by."""
    into.mkdir()
    for path in sorted((ROOT / "rules").glob("*.yml")):
        text = re.sub(r"(?m)^(\s+)for: \S+$", r"\1for: 1s", path.read_text())
        (into / path.name).write_text(text)
    return str(into / "*.yml")


def _prometheus_config(rules: str, vllm: str, watchdog_port: int) -> str:
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [rules],
        "scrape_configs": [
            {"job_name": "inference", "static_configs": [{"targets": [vllm]}]},
            # Another job's target on the same host:port (its own path): down at the same time, not watched.
            {"job_name": "node", "metrics_path": "/node", "static_configs": [{"targets": [vllm]}]},
            {
                "job_name": "vllm-watchdog",
                "honor_labels": True,
                "static_configs": [{"targets": [f"127.0.0.1:{watchdog_port}"]}],
            },
        ],
    }
    return json.dumps(config)  # YAML reads JSON


def _firing(prom: PrometheusServer, selector: str) -> list[dict[str, str]]:
    data = prom.wait_for(f'ALERTS{{alertstate="firing",{selector}}}', timeout=LIMIT)
    return [r["metric"] for r in data["result"]]


def test_bundled_rules_join_prometheus_own_job_and_instance(
    tmp_path: Path, fault: FaultServer, cleanup: list[Callable[[], None]]
) -> None:
    fault.vllm_like(CAPTURE.read_text())
    fault.set("/node", "node_load1 0.5\n")
    hostport = fault.url.removeprefix("http://")
    port = free_port()
    cfg, log = tmp_path / "watchdog.yml", tmp_path / "watchdog.log"
    cfg.write_text(
        watchdog_yaml(
            target(fault.url, name="gpu-box"),
            port=port,
            global_settings={"scrape_interval": "1s", "evaluation_interval": "1s", "job": "inference"},
        )
    )
    proc = start_watchdog(cfg, log)
    cleanup.append(lambda: (proc.kill(), proc.wait(10)))
    poll(f"http://127.0.0.1:{port}/healthz", lambda j: j["status"] == "ok", LIMIT, "the watchdog", log)
    rules = _bundled_rules_firing_fast(tmp_path / "rules")
    prom_config = _prometheus_config(rules, hostport, port)
    with running_prometheus(prom_config, tmp_path / "prometheus") as prom:
        # Prometheus' own vLLM series and the watchdog's probe carry the same job and instance.
        joined = prom.wait_for(
            f'up{{job="inference",instance="{hostport}"}} == 1 and on (job, instance) vllm_watchdog_health_up == 1',
            timeout=LIMIT,
        )
        assert [r["metric"] for r in joined["result"]] == [
            {"__name__": "up", "job": "inference", "instance": hostport}
        ]
        info = prom.wait_for("vllm_watchdog_target_info", timeout=LIMIT)["result"]
        assert [r["metric"]["target"] for r in info] == ["gpu-box"]
        assert info[0]["metric"]["job"] == "inference" and info[0]["metric"]["instance"] == hostport
        prom.wait_for(f'vllm:num_requests_running{{job="inference",instance="{hostport}"}}', timeout=LIMIT)

        # /metrics fails while /health answers: only Prometheus' up says so, joined to the watchdog's target.
        fault.set("/metrics", b"boom", status=500)
        fault.set("/node", b"boom", status=500)
        (down,) = _firing(prom, 'alertname="VLLMDown"')
        assert down == {
            "__name__": "ALERTS",
            "alertname": "VLLMDown",
            "alertstate": "firing",
            "job": "inference",
            "instance": hostport,
            "severity": "critical",
        }
        prom.wait_for('up{job="node"} == 0', timeout=LIMIT)

        # /health fails too: the alert comes from the watchdog's probe and names the target.
        fault.set("/health", b"", status=503)
        (probe,) = _firing(prom, 'alertname="VLLMDown",target="gpu-box"')
        assert probe["job"] == "inference" and probe["instance"] == hostport
        downs = prom.api_query('ALERTS{alertname="VLLMDown"}')["result"]
        assert {r["metric"]["job"] for r in downs} == {"inference"}, downs  # never the node job's target
        assert proc.poll() is None, log.read_text()[-3000:]


def test_instance_is_what_prometheus_makes_of_the_same_address(tmp_path: Path) -> None:
    """scrape_address() against Prometheus' own target labels, for addresses with and without a port."""
    urls = ["http://127.0.0.1:8000", "http://localhost", "https://LocalHost/x", "http://[::1]:9000"]
    jobs = [
        {
            "job_name": f"j{i}",
            "scheme": urlsplit(url).scheme,
            "static_configs": [{"targets": [urlsplit(url).netloc]}],
        }
        for i, url in enumerate(urls)
    ]
    config = json.dumps({"global": {"scrape_interval": "1h"}, "scrape_configs": jobs})
    with running_prometheus(config, tmp_path / "prometheus") as prom:
        deadline = time.monotonic() + LIMIT
        while True:
            active = prom.http.get("/api/v1/targets").json()["data"]["activeTargets"]
            if len(active) == len(urls) or time.monotonic() > deadline:
                break
            time.sleep(0.2)
    got = {t["labels"]["job"]: t["labels"]["instance"] for t in active}
    assert got == {f"j{i}": scrape_address(url) for i, url in enumerate(urls)}
