"""`rule_overrides:`: one bundled threshold changed, one bundled rule switched off, without copying the file."""

from __future__ import annotations

from pathlib import Path

import pytest

from vllm_watchdog.cli import main
from vllm_watchdog.errors import ConfigError
from vllm_watchdog.exitcodes import EXIT_CONFIG, EXIT_OK
from vllm_watchdog.ruler.files import RuleGroup
from vllm_watchdog.service.loading import load_all


def _rules(groups: tuple[RuleGroup, ...]) -> dict[str, list[object]]:
    out: dict[str, list[object]] = {}
    for g in groups:
        for r in g.rules:
            out.setdefault(r.name, []).append(r)
    return out


def _load(tmp_path: Path, overrides: str) -> tuple[RuleGroup, ...]:
    cfg = tmp_path / "c.yml"
    cfg.write_text(f"rule_files: [bundled:vllm.rules.yml]\nrule_overrides:\n{overrides}")
    return load_all(str(cfg), {})[1]


def test_overrides_change_and_switch_off_bundled_rules(tmp_path: Path) -> None:
    plain = _rules(_load(tmp_path, "  {}\n"))
    changed = _rules(
        _load(
            tmp_path,
            "  VLLMQueueSaturated: {for: 7m, labels: {severity: critical, team: serving}}\n"
            "  VLLMPrefixCacheThrash: {enabled: false}\n"
            "  VLLMKVCachePressure: {expr: 'vllm:kv_cache_usage_perc > 0.97', annotations: {summary: ''}}\n",
        )
    )
    (queue,) = changed["VLLMQueueSaturated"]
    (before,) = plain["VLLMQueueSaturated"]
    assert queue.for_ == 420 and queue.expr == before.expr  # type: ignore[attr-defined]
    assert queue.labels == {**before.labels, "severity": "critical", "team": "serving"}  # type: ignore[attr-defined]
    assert "VLLMPrefixCacheThrash" in plain and "VLLMPrefixCacheThrash" not in changed
    (kv,) = changed["VLLMKVCachePressure"]
    assert kv.expr == "vllm:kv_cache_usage_perc > 0.97" and "summary" not in kv.annotations  # type: ignore[attr-defined]
    assert set(plain) - set(changed) == {"VLLMPrefixCacheThrash"}


@pytest.mark.parametrize(
    ("override", "field", "message"),
    [
        ("  VLLMNoSuchRule: {for: 1m}\n", "rule_overrides.VLLMNoSuchRule", "no loaded rule is named"),
        (
            "  VLLMQueueSaturated: {expr: 'rate(x[5m]'}\n",
            "rule_overrides.VLLMQueueSaturated.expr",
            "1:11: parse error: unclosed left parenthesis",
        ),
        (
            "  instance:vllm_queue_depth:max1m: {for: 1m}\n",
            "rule_overrides.instance:vllm_queue_depth:max1m.for",
            "recording rule",
        ),
        (
            "  VLLMQueueSaturated: {labels: {'bad-name': x}}\n",
            "rule_overrides.VLLMQueueSaturated.labels",
            "invalid label name",
        ),
        (
            "  VLLMQueueSaturated: {annotations: {summary: '{{ .Oops'}}\n",
            "rule_overrides.VLLMQueueSaturated.annotations",
            "summary:",
        ),
        (
            "  VLLMQueueSaturated: {thresold: 3}\n",
            "rule_overrides.VLLMQueueSaturated.thresold",
            "unknown key",
        ),
    ],
)
def test_a_bad_override_names_its_file_line_and_field(
    tmp_path: Path, override: str, field: str, message: str
) -> None:
    with pytest.raises(ConfigError) as info:
        _load(tmp_path, override)
    (problem,) = info.value.problems
    assert (problem.file, problem.line) == (str(tmp_path / "c.yml"), 3)
    assert problem.field == field and message in problem.message, problem


def test_check_reports_an_override_that_matches_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = tmp_path / "c.yml"
    cfg.write_text("rule_files: [bundled:vllm.rules.yml]\nrule_overrides:\n  VLLMQueueSaturated: {for: 5m}\n")
    assert main(["check", str(cfg)]) == EXIT_OK
    cfg.write_text("rule_files: [bundled:vllm.rules.yml]\nrule_overrides:\n  VLLMQueueSaturatd: {for: 5m}\n")
    assert main(["check", str(cfg)]) == EXIT_CONFIG
    assert f"{cfg}:3: rule_overrides.VLLMQueueSaturatd: no loaded rule is named" in capsys.readouterr().err
