"""The `integrity:` section, the prompts file and the pinned baseline, as the config and `check` read them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from vllm_watchdog.cli import main
from vllm_watchdog.config.model import parse_config
from vllm_watchdog.errors import ConfigError
from vllm_watchdog.exitcodes import EXIT_CONFIG, EXIT_OK
from vllm_watchdog.integrity.baseline import FORMAT
from vllm_watchdog.integrity.config import IntegrityConfig
from vllm_watchdog.integrity.prompts import bundled_prompts, prompt_digest, prompt_set

HEAD = "targets:\n  - {name: a, url: 'http://127.0.0.1:8000'}\n"


def problems(text: str, source: str = "/etc/w.yml") -> list[str]:
    with pytest.raises(ConfigError) as info:
        parse_config(text, source)
    return [str(p) for p in info.value.problems]


def test_defaults_and_every_key(tmp_path: Path) -> None:
    assert parse_config(HEAD, "/etc/w.yml").integrity == IntegrityConfig()
    (tmp_path / "mine.yml").write_text(
        "prompts:\n  - {name: own, prompt: 'Say', reference: ' hi', max_tokens: 2}\n"
    )
    text = HEAD + (
        "integrity:\n  enabled: false\n  interval: 2m\n  max_tokens_per_minute: 300\n  timeout: 5s\n"
        "  prompts_file: mine.yml\n  baseline_file: pinned.json\n  tolerance: 0.05\n  tolerance_floor: 0.02\n"
        "  learn_probes: 4\n  confirm: false\n"
    )
    cfg = parse_config(text, str(tmp_path / "w.yml")).integrity
    assert (cfg.enabled, cfg.interval, cfg.max_tokens_per_minute, cfg.timeout) == (False, 120.0, 300, 5.0)
    assert cfg.prompts_file == str(tmp_path / "mine.yml") and cfg.baseline_file == str(
        tmp_path / "pinned.json"
    )
    assert (cfg.tolerance, cfg.tolerance_floor, cfg.learn_probes, cfg.confirm) == (0.05, 0.02, 4, False)
    assert [p.name for p in cfg.prompts] == ["own"]
    assert [p.name for p in prompt_set(cfg)] == [*(p.name for p in bundled_prompts()), "own"]
    auto = parse_config(HEAD + "integrity: {tolerance: auto}\n", "/etc/w.yml").integrity
    assert auto.tolerance is None


def test_bad_values_name_file_line_and_field() -> None:
    text = HEAD + (
        "integrity:\n  interval: 0s\n  tolerance: loud\n  learn_probes: 1\n  max_tokens_per_minute: -5\n"
        "  tolerance_floor: 0\n  bogus: 1\n"
    )
    found = problems(text)
    assert "/etc/w.yml:4: integrity.interval: must be greater than 0" in found
    assert any(p.startswith("/etc/w.yml:5: integrity.tolerance: must be a number") for p in found)
    assert any(p.startswith("/etc/w.yml:6: integrity.learn_probes: must be >= 2") for p in found)
    assert any(p.startswith("/etc/w.yml:7: integrity.max_tokens_per_minute: must be >= 1") for p in found)
    assert any(p.startswith("/etc/w.yml:8: integrity.tolerance_floor:") for p in found)
    assert any(p.startswith("/etc/w.yml:9: integrity.bogus: unknown key") for p in found)


def test_the_prompts_file_is_checked_with_its_own_file_and_line(tmp_path: Path) -> None:
    own = tmp_path / "mine.yml"
    own.write_text(
        "prompts:\n  - name: a\n    prompt: P\n    reference: R\n    max_tokens: 4\n"
        "  - {name: a, prompt: P, reference: R}\n  - {name: b, prompt: P}\n"
        f"  - {{name: c, prompt: '{'x' * 5000}', reference: R}}\n"
        "  - {name: d, prompt: P, reference: R, max_tokens: 100}\n"
    )
    found = problems(HEAD + "integrity: {prompts_file: mine.yml}\n", str(tmp_path / "w.yml"))
    assert f"{own}:9: prompts[4].max_tokens: must be <= 64, got 100" in found
    assert f"{own}:6: prompts[1].name: duplicate prompt name 'a'" in found
    assert f"{own}:7: prompts[2].reference: is required" in found
    assert f"{own}:8: prompts[3].prompt: at most 4096 characters, got 5000" in found
    missing = problems(HEAD + "integrity: {prompts_file: nope.yml}\n", str(tmp_path / "w.yml"))
    assert len(missing) == 1 and missing[0].startswith(
        f"{tmp_path / 'w.yml'}:3: integrity.prompts_file: cannot read"
    )


def _baseline(path: Path, digest_of: dict[str, str]) -> None:
    prompts = [
        {"name": n, "digest": d, "logprobs": [-0.5], "greedy": ["a"], "margins": [None], "tokens": 3}
        for n, d in digest_of.items()
    ]
    data = {"format": FORMAT, "identity": {"served_name": "m"}, "tolerance": 0.01, "prompts": prompts}
    path.write_text(json.dumps(data))


def test_check_validates_the_pinned_baseline(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = tmp_path / "w.yml"
    cfg.write_text(HEAD + "rule_files: []\nintegrity: {baseline_file: pinned.json}\n")
    _baseline(tmp_path / "pinned.json", {p.name: prompt_digest(p) for p in bundled_prompts()})
    assert main(["check", str(cfg)]) == EXIT_OK
    assert "pinned.json: OK: pinned baseline of m-" in capsys.readouterr().out
    _baseline(tmp_path / "pinned.json", {p.name: "0" for p in bundled_prompts()})
    assert main(["check", str(cfg)]) == EXIT_CONFIG
    assert "pinned.json:1: baseline_file: learnt from other prompts" in capsys.readouterr().err
    (tmp_path / "pinned.json").write_text("{not json")
    assert main(["check", str(cfg)]) == EXIT_CONFIG
    assert "baseline_file: not JSON" in capsys.readouterr().err
