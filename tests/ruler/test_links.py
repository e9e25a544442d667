"""The links an alert carries: generatorURL under the external URL, runbook_url resolved against its base."""

from __future__ import annotations

from pathlib import Path

import pytest

from vllm_watchdog.config.model import parse_config
from vllm_watchdog.errors import ConfigError
from vllm_watchdog.notifiers.alert import OutgoingAlert
from vllm_watchdog.notifiers.alertmanager import postable_alert
from vllm_watchdog.ruler.evaluation import RuleEvaluation, RuleEvaluationOptions
from vllm_watchdog.ruler.files import load_rule_files
from vllm_watchdog.store import SampleStore, make_labels

NOW = 1_700_000_000.0
RULES = """
groups:
  - name: g
    rules:
      - alert: Backlog
        expr: vllm:num_requests_waiting > 2
        annotations: {runbook_url: "docs/runbooks.md#backlog", summary: "{{ $labels.instance }}"}
      - alert: Elsewhere
        expr: vllm:num_requests_waiting > 2
        annotations: {runbook_url: "https://wiki.example/vllm#elsewhere"}
"""


def _sent(tmp_path: Path, config_text: str) -> dict[str, OutgoingAlert]:
    """Every alert the evaluation hands to the notifiers after one evaluation over one sample."""
    rules = tmp_path / "r.yml"
    rules.write_text(RULES)
    config = parse_config(
        config_text + f"rule_files: [{rules}]\ntargets: [{{name: v, url: 'http://127.0.0.1:8000'}}]\n",
        str(tmp_path / "w.yml"),
        env={},
    )
    store = SampleStore(retention=600.0)
    labels = {"job": "vllm", "instance": "127.0.0.1:8000", "target": "v"}
    store.append(make_labels("vllm:num_requests_waiting", labels), int(NOW * 1000), 5.0)
    sent: list[OutgoingAlert] = []
    ev = RuleEvaluation(
        config,
        load_rule_files(config.rule_files),
        store,
        RuleEvaluationOptions(on_alerts=lambda a, now: sent.extend(a)),
    )
    ev.after_scrape(NOW)
    return {a.labels["alertname"]: a for a in sent}


def test_generator_url_is_absolute_under_the_external_url(tmp_path: Path) -> None:
    sent = _sent(tmp_path, "external_url: https://watchdog.example/dog/\n")
    url = "https://watchdog.example/dog/graph?g0.expr=vllm%3Anum_requests_waiting+%3E+2&g0.tab=1"
    assert sent["Backlog"].generator_url == url
    assert postable_alert(sent["Backlog"])["generatorURL"] == url  # what Alertmanager receives


def test_external_url_defaults_to_the_listen_address_as_prometheus_does(tmp_path: Path) -> None:
    sent = _sent(tmp_path, "listen: 127.0.0.1:9555\n")
    assert sent["Backlog"].generator_url.startswith("http://127.0.0.1:9555/graph?g0.expr=vllm%3A")


def test_a_relative_runbook_url_resolves_against_the_runbook_base(tmp_path: Path) -> None:
    sent = _sent(tmp_path, "runbook_base_url: https://docs.example/vllm-watchdog/v0.1\n")
    assert sent["Backlog"].annotations["runbook_url"] == (
        "https://docs.example/vllm-watchdog/v0.1/docs/runbooks.md#backlog"
    )
    assert sent["Backlog"].annotations["summary"] == "127.0.0.1:8000"
    assert sent["Elsewhere"].annotations["runbook_url"] == "https://wiki.example/vllm#elsewhere"


def test_the_default_runbook_base_is_the_watchdogs_own_page(tmp_path: Path) -> None:
    """Unset, the base is the external URL: the watchdog serves docs/runbooks.md there (tests/api/test_runbooks.py)."""
    sent = _sent(tmp_path, "listen: 127.0.0.1:9555\n")
    assert sent["Backlog"].annotations["runbook_url"] == "http://127.0.0.1:9555/docs/runbooks.md#backlog"
    sent = _sent(tmp_path, "external_url: https://watchdog.example/dog/\n")
    assert (
        sent["Backlog"].annotations["runbook_url"] == "https://watchdog.example/dog/docs/runbooks.md#backlog"
    )


def test_external_url_is_an_http_url_without_query_or_fragment(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as exc:
        parse_config("external_url: https://w.example/?a=1\n", "w.yml", env={})
    assert "w.yml:1: external_url: must not have a query or fragment" in [str(p) for p in exc.value.problems]
    with pytest.raises(ConfigError) as exc:
        parse_config("runbook_base_url: docs/\n", "w.yml", env={})
    assert str(exc.value.problems[0]).startswith("w.yml:1: runbook_base_url: must be an http(s) URL")
