"""The dashboards take from the bundled rule files what they show of them: each threshold line is the number
its alert compares with (grafana/rulefiles.py reads it from rules/*.rules.yml), and the ALERTS panels show the
bundled alerts and nothing else. Also: latency per instance, and links that keep variables and time."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path
from typing import Any

import pytest

from tests.shipped.test_grafana_dashboards import GRAFANA, NAMES, all_queries, load

# (dashboard, panel title) -> (alert, the metric whose comparison constant the panel draws)
LINES = {
    ("vllm-serving.json", "Waiting"): ("VLLMQueueSaturated", "vllm:num_requests_waiting"),
    ("vllm-serving.json", "Requests running / waiting"): ("VLLMQueueSaturated", "vllm:num_requests_waiting"),
    ("vllm-serving.json", "Waiting by reason"): ("VLLMQueueSaturated", "vllm:num_requests_waiting_by_reason"),
    ("vllm-serving.json", "KV cache (fullest)"): ("VLLMKVCachePressure", "vllm:kv_cache_usage_perc"),
    ("vllm-serving.json", "KV cache usage"): ("VLLMKVCachePressure", "vllm:kv_cache_usage_perc"),
    ("vllm-serving.json", "Preemptions/s"): ("VLLMPreempting", "vllm:num_preemptions_total"),
    ("vllm-serving.json", "Time to first token"): (
        "VLLMTimeToFirstTokenHigh",
        "vllm:time_to_first_token_seconds_bucket",
    ),
    ("vllm-serving.json", "Queue time"): ("VLLMQueueTimeHigh", "vllm:request_queue_time_seconds_bucket"),
    ("vllm-serving.json", "Admission rejection ratio"): ("VLLMRejecting", "vllm:admission_rejections_total"),
    ("vllm-serving.json", "Schedule gain"): (
        "VLLMSpecDecodeScheduleMistuned",
        "vllm_watchdog_spec_schedule_gain",
    ),
    ("vllm-serving.json", "Draft acceptance rate"): (
        "VLLMSpecDecodeAcceptanceLow",
        "instance:vllm_spec_decode_acceptance_ratio:rate10m",
    ),
    ("vllm-serving.json", "Error finish ratio"): ("VLLMRequestErrors", "vllm:request_success_total"),
    ("vllm-serving.json", "Repetition finish ratio"): ("VLLMDegenerateOutput", "vllm:request_success_total"),
    ("gpu.json", "Hottest GPU"): ("VLLMGPUHot", "DCGM_FI_DEV_GPU_TEMP"),
    ("gpu.json", "Temperature"): ("VLLMGPUHot", "DCGM_FI_DEV_GPU_TEMP"),
    ("gpu.json", "Closest to its power limit"): ("VLLMGPUPowerCapped", "DCGM_FI_DEV_POWER_USAGE"),
    ("gpu.json", "Share of the power limit"): ("VLLMGPUPowerCapped", "DCGM_FI_DEV_POWER_USAGE"),
    ("watchdog.json", "Gateway queue time"): (
        "GatewayQueueBackedUp",
        "vllm_watchdog_gateway_queue_time_seconds_bucket",
    ),
    ("watchdog.json", "Oldest in-flight request"): (
        "GatewayRequestStuck",
        "vllm_watchdog_gateway_oldest_in_flight_seconds",
    ),
    ("watchdog.json", "Gateway 5xx ratio"): ("GatewayServerErrors", "vllm_watchdog_gateway_responses_total"),
    ("watchdog.json", "Since the last check"): (
        "VLLMAnswersUnchecked",
        "vllm_watchdog_known_answer_last_check_timestamp_seconds",
    ),
}


def rulefiles() -> Any:
    """grafana/rulefiles.py, loaded from its file (grafana/ is scripts, not a package)."""
    spec = importlib.util.spec_from_file_location("grafana_rulefiles", GRAFANA / "rulefiles.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def panel(name: str, title: str) -> dict[str, Any]:
    """The one panel of a dashboard with this title."""
    (found,) = [p for p in load(name)["panels"] if p["title"] == title]
    return found


@pytest.mark.parametrize(("name", "title"), sorted(LINES), ids=[f"{n}:{t}" for n, t in sorted(LINES)])
def test_threshold_is_the_rules_own_number(name: str, title: str) -> None:
    alert, metric = LINES[(name, title)]
    expected = rulefiles().threshold(alert, metric)
    p = panel(name, title)
    steps = p["fieldConfig"]["defaults"]["thresholds"]["steps"]
    assert [s["value"] for s in steps[1:]] == [expected], steps
    if p["type"] == "timeseries":
        assert p["fieldConfig"]["defaults"]["custom"]["thresholdsStyle"] == {"mode": "line"}
        assert alert in p["description"]


def test_every_threshold_line_is_listed_above() -> None:
    drawn = {
        (name, p["title"])
        for name in NAMES
        for p in load(name)["panels"]
        if "thresholdsStyle" in p.get("fieldConfig", {}).get("defaults", {}).get("custom", {})
    }
    assert drawn <= set(LINES), drawn - set(LINES)


def test_threshold_follows_the_rule_file(tmp_path: Path) -> None:
    rules = rulefiles()
    source = (rules.RULES / "vllm.rules.yml").read_text()
    (tmp_path / "vllm.rules.yml").write_text(source)
    assert rules.threshold("VLLMGPUHot", "DCGM_FI_DEV_GPU_TEMP", tmp_path) == 85
    hotter = re.sub(r"(\)\s*> )85\b", r"\g<1>91", source, count=1)
    (tmp_path / "vllm.rules.yml").write_text(hotter)
    rules.alerts.cache_clear()
    assert rules.threshold("VLLMGPUHot", "DCGM_FI_DEV_GPU_TEMP", tmp_path) == 91
    assert rules.threshold("VLLMQueueSaturated", "vllm:num_requests_running", tmp_path) == 0
    with pytest.raises(LookupError):
        rules.threshold("VLLMGPUHot", "DCGM_FI_DEV_POWER_USAGE", tmp_path)


def test_alerts_panels_show_the_bundled_alerts_only() -> None:
    names = sorted(rulefiles().alerts())
    regex = f'alertname=~"{"|".join(names)}"'
    alert_queries = [q for q in all_queries() if "ALERTS" in q.expr]
    assert len(alert_queries) >= 4
    for query in alert_queries:
        for selector in re.findall(r"ALERTS(?:_FOR_STATE)?(\{[^}]*\})?", query.expr):
            assert regex in selector, (query.where, query.expr)


def test_latency_quantiles_are_per_instance() -> None:
    for query in all_queries():
        if query.dashboard == "vllm-serving.json" and "histogram_quantile" in query.expr:
            assert "sum by (instance, le)" in query.expr, query.where


@pytest.mark.parametrize("name", NAMES)
def test_links_keep_variables_and_time_range(name: str) -> None:
    for link in load(name)["links"]:
        assert link["includeVars"] is True and link["keepTime"] is True, link
