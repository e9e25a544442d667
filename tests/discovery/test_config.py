"""`file_sd_configs:` and `docker_sd_configs:` in the config, with file:line errors, and `check` reading the
file_sd files it finds."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support.configs import target, write_config
from vllm_watchdog.cli import main
from vllm_watchdog.config.model import parse_config
from vllm_watchdog.errors import ConfigError
from vllm_watchdog.exitcodes import EXIT_CONFIG, EXIT_OK
from vllm_watchdog.redact import config_secrets


def problems(text: str) -> list[str]:
    with pytest.raises(ConfigError) as exc:
        parse_config(text, "/etc/w/c.yml", env={})
    return [str(p) for p in exc.value.problems]


def test_discoveries_parse_with_their_defaults_and_template() -> None:
    cfg = parse_config(
        """
global: {job: fleet}
file_sd_configs:
  - files: [targets/*.json, /abs/one.yml]
    refresh_interval: 30s
    runtimes: [docker]
    target: {canary: false, labels: {dc: x}, health_timeout: 5s}
docker_sd_configs:
  - {}
  - {label_prefix: "acme.", port: 9000, scheme: https, max_targets: 8, target: {job: containers}}
""",
        "/etc/w/c.yml",
        env={},
    )
    (fsd,) = cfg.file_sd_configs
    assert fsd.name == "file_sd_configs[0]"
    assert fsd.files == ("/etc/w/targets/*.json", "/abs/one.yml")  # relative to the config file
    assert (fsd.refresh_interval, fsd.scheme, fsd.runtimes, fsd.max_targets) == (30.0, "http", {"docker"}, 64)
    t = fsd.target
    assert (t.canary.enabled, dict(t.labels), t.health_timeout, t.job) == (False, {"dc": "x"}, 5.0, "fleet")
    plain, acme = cfg.docker_sd_configs
    assert (plain.name, plain.label_prefix, plain.port, plain.refresh_interval) == (
        "docker_sd_configs[0]",
        "vllm-watchdog.",
        8000,
        15.0,
    )
    assert (acme.label_prefix, acme.port, acme.scheme, acme.max_targets, acme.target.job) == (
        "acme.",
        9000,
        "https",
        8,
        "containers",
    )


def test_every_problem_is_named_with_file_line_and_field() -> None:
    found = problems(
        """file_sd_configs:
  - files: [a.txt, "dir*/x.json", "a*b*.json"]
    refresh_interval: 0s
    runtimes: [process]
  - refresh_interval: 5s
  - files: [a.json]
    target: {name: x, container: c, labels: {instance: i}}
docker_sd_configs:
  - {port: 70000, scheme: ftp, max_targets: 100000}
  - {}
"""
    )
    expected = [
        "c.yml:2: file_sd_configs[0].files[0]: must end in .json, .yml or .yaml",
        "c.yml:2: file_sd_configs[0].files[1]: must end in .json",
        "c.yml:2: file_sd_configs[0].files[2]: must end in .json",
        "c.yml:3: file_sd_configs[0].refresh_interval: must be greater than 0",
        "c.yml:4: file_sd_configs[0].runtimes: unknown runtime 'process' (allowed: docker, systemd)",
        "c.yml:5: file_sd_configs[1].files: is required",
        "c.yml:7: file_sd_configs[2].target.name: unknown key",
        "c.yml:7: file_sd_configs[2].target.container: unknown key",
        "c.yml:7: file_sd_configs[2].target.labels: must not set 'instance'",
        "c.yml:9: docker_sd_configs[0].port: must be a TCP port",
        "c.yml:9: docker_sd_configs[0].scheme: must be http or https",
        "c.yml:9: docker_sd_configs[0].max_targets: must be at most 4096",
        "c.yml:9: docker_sd_configs: two docker_sd_configs watch the same label_prefix",
    ]
    for want in expected:
        assert any(p.startswith("/etc/w/" + want) for p in found), (want, found)


def test_the_gateway_fronts_a_target_of_the_config_only() -> None:
    found = problems(
        """targets: [{name: a, url: "http://127.0.0.1:1"}]
file_sd_configs: [{files: [sd.json]}]
gateway: {listen: "127.0.0.1:9999", target: sd-0}
"""
    )
    assert any("gateway.target" in p and "sd-0" in p for p in found), found


def test_check_validates_the_files_found_now(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    sd = tmp_path / "sd"
    sd.mkdir()
    (sd / "good.json").write_text(json.dumps([{"targets": ["127.0.0.1:8001", "127.0.0.1:8002"]}]))
    cfg = write_config(
        tmp_path,
        target("http://127.0.0.1:8000", "a"),
        port=9460,
        rest="file_sd_configs: [{files: [sd/*.json]}]\n",
    )
    assert main(["check", str(cfg)]) == EXIT_OK
    assert f"  {sd / 'good.json'}: OK: 2 targets (file_sd_configs[0])" in capsys.readouterr().out
    (sd / "bad.json").write_text('[{"targets": ["127.0.0.1:1"], "labels": {"instance": "x"}}]')
    assert main(["check", str(cfg)]) == EXIT_CONFIG
    err = capsys.readouterr().err
    assert f"{sd / 'bad.json'}:1: [0].labels: must not set 'instance'" in err


def test_a_templates_secrets_are_masked_as_a_targets_are() -> None:
    cfg = parse_config(
        """file_sd_configs:
  - files: [a.json]
    target: {canary: {api_key: sk-canary-key}, basic_auth: {username: u, password: template-password}}
docker_sd_configs:
  - target: {authorization: {credentials: docker-template-token}}
""",
        "/etc/w/c.yml",
        env={},
    )
    secrets = set(config_secrets(cfg))
    assert {"sk-canary-key", "template-password", "docker-template-token"} <= secrets
    assert not any(s in repr(cfg) for s in secrets)
