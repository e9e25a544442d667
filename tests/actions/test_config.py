"""Routes, actions and notifiers in the config: typed values and file:line errors."""

from __future__ import annotations

import pytest

from vllm_watchdog.actions.config import DRAFT_FLAGS, Budget, IncidentConfig
from vllm_watchdog.config.model import parse_config
from vllm_watchdog.errors import ConfigError

ISSUE_EXAMPLE = """
targets:
  - {name: vllm-0, url: "http://127.0.0.1:8000", container: vllm-0}
routes:
  - match: {alertname: VLLMEngineHung}
    actions: [restart]
    continue: false
  - matchers: ['alertname=~"VLLMSpec.*"', 'severity!="info"']
    actions: [draft_off]
actions:
  restart:     {type: restart, drain_timeout: 60s, stop_timeout: 90s, ready_timeout: 15m, cooldown: 15m, max_per_window: {count: 3, window: 6h}}
  draft_off:   {type: disable_draft, cooldown: 1h}
  draft_on:    {type: enable_draft}
  smaller:     {type: reconfigure, set: {--max-num-seqs: "8"}, remove: [--enable-chunked-prefill], restore_after: 10m}
  cap:         {type: gpu_power_limit, ratio: 0.8, restore_after: 5m, dry_run: true}
notifiers:
  - {type: alertmanager, url: "http://127.0.0.1:9093"}
  - {type: webhook, url: "http://127.0.0.1:8088/hook", headers: {Authorization: "Bearer ${TOKEN}"}, match: {severity: critical}}
state_dir: /var/lib/vllm-watchdog
dry_run: false
"""


def test_the_issue_example_parses_into_typed_values() -> None:
    cfg = parse_config(ISSUE_EXAMPLE, "c.yml", env={"TOKEN": "t0k"})
    r0, r1 = cfg.routes
    assert [str(m) for m in r0.matchers] == ["alertname='VLLMEngineHung'"]
    assert r0.actions == ("restart",) and not r0.continue_ and r0.line == 5
    assert [(m.name, m.op, m.value) for m in r1.matchers] == [
        ("alertname", "=~", "VLLMSpec.*"),
        ("severity", "!=", "info"),
    ]
    restart = cfg.actions["restart"]
    assert (restart.drain_timeout, restart.stop_timeout, restart.ready_timeout, restart.cooldown) == (
        60,
        90,
        900,
        900,
    )
    assert restart.max_per_window == Budget(3, 21600.0) and restart.disruptive
    assert cfg.actions["draft_off"].remove_args == DRAFT_FLAGS and cfg.actions["draft_off"].cooldown == 3600
    smaller = cfg.actions["smaller"]
    assert smaller.set_args == {"--max-num-seqs": "8"} and smaller.remove_args == (
        "--enable-chunked-prefill",
    )
    assert smaller.restore_after == 600
    cap = cfg.actions["cap"]
    assert cap.power_limit_ratio == 0.8 and cap.dry_run is True and not cap.disruptive
    am, hook = cfg.notifiers
    assert (am.name, am.type, am.send_resolved) == ("alertmanager-0", "alertmanager", True)
    assert hook.headers == {"Authorization": "Bearer t0k"} and [str(m) for m in hook.matchers] == [
        "severity='critical'"
    ]
    assert cfg.targets[0].mode == "docker" and cfg.dry_run is False


def test_defaults_per_type() -> None:
    cfg = parse_config("actions: {r: {type: restart}, on: {type: enable_draft}}\n", "c.yml", env={})
    assert cfg.actions["r"].max_per_window == Budget(3, 21600.0) and cfg.actions["r"].cooldown == 900
    assert cfg.actions["on"].cooldown == 0 and cfg.actions["on"].max_per_window is None


def test_incidents_default_to_on_and_parse_into_typed_values() -> None:
    assert parse_config("{}", "c.yml", env={}).incidents == IncidentConfig()
    assert IncidentConfig().enabled and IncidentConfig().budget == 5.0
    text = """incidents:
  enabled: false
  budget: 1500ms
  keep: 3
  max_bytes: 64MiB
  log_lines: 0
  metrics_window: 2m
  py_spy: /opt/py-spy
"""
    assert parse_config(text, "c.yml", env={}).incidents == IncidentConfig(
        enabled=False,
        budget=1.5,
        keep=3,
        max_bytes=64 * 1024 * 1024,
        log_lines=0,
        metrics_window=120.0,
        py_spy="/opt/py-spy",
    )


def test_modes_are_exclusive_and_typed() -> None:
    text = """
targets:
  - {name: a, url: "http://127.0.0.1:8000", command: [python, -m, vllm.entrypoints.openai.api_server], env: {X: "1"}}
  - {name: b, url: "http://127.0.0.1:8001", unit: vllm.service, gpus: [0, 1]}
  - {name: c, url: "http://127.0.0.1:8002"}
"""
    a, b, c = parse_config(text, "c.yml", env={}).targets
    assert a.mode == "process" and a.command[0] == "python" and a.env == {"X": "1"}
    assert b.mode == "systemd" and b.gpus == (0, 1)
    assert c.mode is None
    with pytest.raises(
        ConfigError, match=r"c.yml:2: targets\[0\]: set at most one of container, command or unit"
    ):
        parse_config(
            'targets:\n  - {name: a, url: "http://127.0.0.1:1", container: x, unit: y}\n', "c.yml", env={}
        )


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("actions: {a: {type: reboot}}", "c.yml:1: actions.a.type: unknown action type 'reboot'"),
        ("actions: {a: {cooldown: 1m}}", "c.yml:1: actions.a.type: is required"),
        (
            "actions: {a: {type: restart, cooldown: soon}}",
            "c.yml:1: actions.a.cooldown: not a valid duration",
        ),
        ("actions: {a: {type: restart, max_per_window: {count: 3}}}", "actions.a.max_per_window: needs both"),
        ("actions: {a: {type: restart, set: {--x: 1}}}", "actions.a.set: only applies to type reconfigure"),
        ("actions: {a: {type: reconfigure}}", "actions.a: a reconfigure action needs `set` or `remove`"),
        ("actions: {a: {type: reconfigure, set: {max-num-seqs: 1}}}", "must be a long vLLM flag"),
        ("actions: {a: {type: gpu_power_limit}}", "set exactly one of `watts` or `ratio`"),
        ("actions: {a: {type: gpu_power_limit, ratio: 1.5}}", "actions.a.ratio: must be in (0, 1]"),
        (
            "routes: [{match: {alertname: X}, actions: [nope]}]",
            "c.yml:1: routes[0].actions: unknown action 'nope'",
        ),
        ("routes: [{match: {alertname: X}}]", "routes[0].actions: is required"),
        ("routes: [{matchers: ['alertname=~\"(\"'], actions: []}]", "invalid regular expression"),
        ("routes: [{matchers: ['what'], actions: []}]", "bad matcher 'what'"),
        (
            "notifiers: [{type: pager, url: 'http://127.0.0.1:1'}]",
            "notifiers[0].type: unknown notifier type 'pager'",
        ),
        ("notifiers: [{type: webhook}]", "notifiers[0].url: is required"),
        ("notifiers: [{type: webhook, url: 'ftp://x'}]", "notifiers[0].url: must be an http(s) URL"),
        ("dry_run: maybe", "c.yml:1: dry_run: must be true or false"),
        ("incidents: {budget: 0s}", "c.yml:1: incidents.budget: must be greater than 0 and at most 60s"),
        ("incidents: {budget: 2m}", "incidents.budget: must be greater than 0 and at most 60s"),
        ("incidents: {keep: 0}", "incidents.keep: must be >= 1"),
        ("incidents: {max_bytes: 0B}", "incidents.max_bytes: must be greater than 0"),
        ("incidents: {log_lines: 100000}", "incidents.log_lines: must be at most 10000"),
        ("incidents: {locals: true}", "incidents.locals: unknown key"),
        ("incidents: {enabled: sometimes}", "incidents.enabled: must be true or false"),
    ],
)
def test_bad_remediation_config_names_file_line_and_field(text: str, expected: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(text + "\n", "c.yml", env={})
    assert any(expected in str(p) for p in info.value.problems), [str(p) for p in info.value.problems]
