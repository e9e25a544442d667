"""The bundled rule files and what ships with them.

Every rule file passes `promtool check rules`; its unit tests under rules/tests/ pass with both `promtool test
rules` and `vllm-watchdog test-rules`; every alert has a firing and a silent unit test, severity, summary,
description and a runbook in docs/runbooks.md; the embedded defaults (which include watchdog/defaults/watchdog.yml) pass
`vllm-watchdog check`.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.promtool import PROMTOOL
from vllm_watchdog.config.model import load_config

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "rules"
RULE_FILES = sorted(RULES.glob("*.rules.yml"))
TEST_FILES = sorted((RULES / "tests").glob("*.yml"))
RUNBOOKS = ROOT / "docs" / "runbooks.md"
SEVERITIES = {"critical", "warning", "info"}


def _alerts() -> list[tuple[str, dict[str, Any]]]:
    out = []
    for path in RULE_FILES:
        for group in yaml.safe_load(path.read_text())["groups"]:
            out += [(path.name, rule) for rule in group["rules"] if "alert" in rule]
    return out


ALERTS = _alerts()


def test_rule_files_are_found() -> None:
    assert {p.name for p in RULE_FILES} >= {"vllm.rules.yml", "gateway.rules.yml"}
    assert len(ALERTS) >= 30


@pytest.mark.parametrize("path", RULE_FILES, ids=lambda p: p.name)
def test_promtool_accepts_the_bundled_rule_file(path: Path) -> None:
    out = subprocess.run([PROMTOOL, "check", "rules", str(path)], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr


def test_promtool_accepts_every_yml_file_of_the_rules_directory() -> None:
    """`promtool check rules rules/*.yml`, as a Prometheus glob would load them: rules/ holds rule files only."""
    shipped = sorted(RULES.glob("*.yml"))
    assert {p.name for p in RULE_FILES} <= {p.name for p in shipped}
    out = subprocess.run([PROMTOOL, "check", "rules", *map(str, shipped)], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr


@pytest.mark.parametrize("path", TEST_FILES, ids=lambda p: p.name)
def test_rule_unit_tests_pass_with_promtool_and_with_us(path: Path) -> None:
    ours = subprocess.run(
        [sys.executable, "-m", "vllm_watchdog", "test-rules", str(path)], capture_output=True, text=True
    )
    theirs = subprocess.run([PROMTOOL, "test", "rules", str(path)], capture_output=True, text=True)
    assert theirs.returncode == 0, theirs.stdout + theirs.stderr
    assert ours.returncode == 0, ours.stdout + ours.stderr


def _alert_tests() -> tuple[set[str], set[str]]:
    """Alert names with a firing case, and with a case that expects silence, across rules/tests/."""
    firing: set[str] = set()
    silent: set[str] = set()
    for path in TEST_FILES:
        for test in yaml.safe_load(path.read_text())["tests"]:
            for case in test.get("alert_rule_test") or []:
                (firing if case.get("exp_alerts") else silent).add(case["alertname"])
    return firing, silent


@pytest.mark.parametrize(("file", "rule"), ALERTS, ids=[r["alert"] for _, r in ALERTS])
def test_every_alert_is_unit_tested_firing_and_silent(file: str, rule: dict[str, Any]) -> None:
    firing, silent = _alert_tests()
    assert rule["alert"] in firing, f"{file}: {rule['alert']} has no alert_rule_test where it fires"
    assert rule["alert"] in silent, f"{file}: {rule['alert']} has no alert_rule_test where it stays silent"


@pytest.mark.parametrize(("file", "rule"), ALERTS, ids=[r["alert"] for _, r in ALERTS])
def test_every_alert_has_severity_summary_description_and_runbook_url(
    file: str, rule: dict[str, Any]
) -> None:
    name = rule["alert"]
    assert rule.get("labels", {}).get("severity") in SEVERITIES, f"{file}: {name}: severity"
    annotations = rule.get("annotations", {})
    assert annotations.get("summary", "").strip(), f"{file}: {name}: summary"
    assert annotations.get("description", "").strip(), f"{file}: {name}: description"
    assert annotations.get("runbook_url") == f"docs/runbooks.md#{name.lower()}", (
        f"{file}: {name}: runbook_url"
    )


def test_every_alert_has_a_runbook_section_and_no_runbook_is_orphaned() -> None:
    headings = set(re.findall(r"^## (\w+)\s*$", RUNBOOKS.read_text(), flags=re.MULTILINE))
    names = {rule["alert"] for _, rule in ALERTS}
    assert names - headings == set(), "alerts without a runbook section"
    own = {"VLLMWatchdogRestartBudgetExhausted", "VLLMWatchdogCrashLoop"}  # raised by the watchdog itself
    own |= {"VLLMWatchdogActionRolledBack", "VLLMWatchdogActionFailed"}
    own |= {"VLLMWatchdogFleetUnreachable", "VLLMWatchdogFleetCorrelatedFault"}  # fleet/alerts.py
    assert headings - names - own == set(), "runbook sections for alerts that do not exist"


def test_rule_tests_cover_only_alerts_that_exist() -> None:
    firing, silent = _alert_tests()
    assert (firing | silent) - {rule["alert"] for _, rule in ALERTS} == set()


def test_embedded_defaults_pass_check_and_route_the_bundled_alerts() -> None:
    out = subprocess.run([sys.executable, "-m", "vllm_watchdog", "check"], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "vllm.rules.yml: OK" in out.stdout and "gateway.rules.yml: OK" in out.stdout
    cfg = load_config(None, env={})
    routed = {m.value for r in cfg.routes for m in r.matchers if m.name == "alertname"}
    assert any("VLLMEngineHung" in v and "VLLMDown" in v for v in routed)
    assert {
        "VLLMQueueSaturated",
        "VLLMSpecDecodeAcceptanceLow",
        "VLLMSpecDecodeNoDrafts",
        "VLLMSpecDecodeScheduleMistuned",
        "VLLMGPUHot",
        "VLLMAnswersDiverged",
    } <= {name for v in routed for name in v.split("|")}
    names = {rule["alert"] for _, rule in ALERTS}
    for value in routed:  # every route names alerts that exist
        assert set(value.split("|")) <= names, value
