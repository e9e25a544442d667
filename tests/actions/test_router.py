"""Routes pick actions top to bottom, like Alertmanager; alerts name their target by name or host:port."""

from __future__ import annotations

from vllm_watchdog.actions.pipeline.router import route, target_of
from vllm_watchdog.config.model import parse_config

CONFIG = """
targets:
  - {name: vllm-0, url: "http://127.0.0.1:8000", container: c0}
  - {name: vllm-1, url: "http://127.0.0.1:8001", container: c1}
routes:
  - {match: {alertname: Hung}, actions: [restart], continue: true}
  - {match_re: {alertname: "Hung|Slow"}, actions: [notify_only, restart]}
  - {match: {severity: critical}, actions: [restart]}
actions:
  restart: {type: restart}
  notify_only: {type: restart, dry_run: true}
"""


def test_first_match_stops_unless_continue() -> None:
    cfg = parse_config(CONFIG, "c.yml", env={})
    assert route(cfg.routes, {"alertname": "Hung"}) == ["restart", "notify_only"]
    assert route(cfg.routes, {"alertname": "Slow", "severity": "critical"}) == [
        "notify_only",
        "restart",
    ]
    assert route(cfg.routes, {"alertname": "Other", "severity": "critical"}) == ["restart"]
    assert route(cfg.routes, {"alertname": "Other"}) == []


def test_target_by_name_or_host_port_never_guessed() -> None:
    cfg = parse_config(CONFIG, "c.yml", env={})
    assert target_of({"instance": "vllm-1"}, cfg.targets) == cfg.targets[1]
    assert target_of({"instance": "127.0.0.1:8000"}, cfg.targets) == cfg.targets[0]
    assert target_of({"target": "vllm-0", "instance": "vllm-1"}, cfg.targets) == cfg.targets[0]
    assert target_of({"instance": "10-unknown:80"}, cfg.targets) is None
    assert target_of({}, cfg.targets) is None  # two targets: an alert without a name picks none
    assert target_of({}, cfg.targets[:1]) == cfg.targets[0]


def test_an_alert_about_another_container_or_unit_names_no_target() -> None:
    more = '  - {name: vllm-2, url: "http://127.0.0.1:8002", unit: vllm.service}\nroutes:'
    cfg = parse_config(CONFIG.replace("routes:", more, 1), "c.yml", env={})
    c0, _, u2 = cfg.targets
    assert target_of({"instance": "vllm-0", "container": "c0"}, cfg.targets) == c0
    assert target_of({"instance": "vllm-0", "container": "/c0", "name": "c0"}, cfg.targets) == c0
    assert target_of({"instance": "vllm-0", "container": "evil"}, cfg.targets) is None
    assert target_of({"instance": "vllm-0", "name": "c1"}, cfg.targets) is None  # another target's container
    assert target_of({"instance": "vllm-2", "unit": "vllm.service"}, cfg.targets) == u2
    assert target_of({"instance": "vllm-2", "name": "vllm"}, cfg.targets) == u2
    assert target_of({"instance": "vllm-2", "unit": "sshd.service"}, cfg.targets) is None
    assert target_of({"instance": "vllm-2", "container": "vllm"}, cfg.targets) is None  # it has no container
    one = cfg.targets[:1]
    assert target_of({"container": "c0"}, one) == c0
    assert target_of({"container": "other"}, one) is None  # with one target too: never act on its behalf
    assert target_of({"unit": "other.service"}, one) is None
