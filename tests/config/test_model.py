from __future__ import annotations

import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import pytest

from vllm_watchdog.config.model import DEFAULTS_NAME, load_config, parse_config
from vllm_watchdog.errors import ConfigError
from vllm_watchdog.redact import config_secrets
from vllm_watchdog.sources.config import GpuExporterConfig

FULL = """
global:
  scrape_interval: 2s
  evaluation_interval: 1s
  sample_limit: 500
  body_size_limit: 1MiB
listen: 127.0.0.1:9461
api_token: ${TOKEN}
targets:
  - name: vllm-0
    url: http://127.0.0.1:8000
    container: vllm-0
    canary: {model: m, interval: 10s, timeout: 3s}
    labels: {zone: a}
  - name: vllm-1
    url: http://127.0.0.1:8001/
    canary: false
gpus:
  nvml: true
  dcgm_url: http://127.0.0.1:9400/metrics
"""


def test_full_config_parses_into_typed_values() -> None:
    cfg = parse_config(FULL, "c.yml", env={"TOKEN": "s3cret"})
    assert cfg.global_.scrape_interval == 2.0
    assert cfg.global_.scrape_timeout == 2.0  # defaults to the interval, as Prometheus clips it
    assert cfg.global_.sample_limit == 500
    assert cfg.global_.body_size_limit == 1024 * 1024
    assert (cfg.listen_host, cfg.listen_port) == ("127.0.0.1", 9461)
    assert cfg.api_token == "s3cret"
    t0, t1 = cfg.targets
    assert t0.container == "vllm-0" and t0.labels == {"zone": "a"}
    assert t0.canary.model == "m" and t0.canary.interval == 10.0 and t0.canary.timeout == 3.0
    assert t1.metrics_url == "http://127.0.0.1:8001/metrics"
    assert t1.health_url == "http://127.0.0.1:8001/health"
    assert not t1.canary.enabled
    assert cfg.gpus.nvml and cfg.gpus.exporters == (
        GpuExporterConfig("dcgm", "http://127.0.0.1:9400/metrics"),
    )
    assert cfg.listens_on_loopback


def test_every_problem_is_reported_with_file_line_and_field() -> None:
    text = "global:\n  scrape_interval: 1x\n  bogus: 1\nlisten: nope\ntargets:\n  - url: ftp://h\n"
    with pytest.raises(ConfigError) as info:
        parse_config(text, "bad.yml", env={})
    lines = [str(p) for p in info.value.problems]
    assert "bad.yml:2: global.scrape_interval: not a valid duration string: '1x'" in lines[0]
    assert lines[1].startswith("bad.yml:3: global.bogus: unknown key")
    assert lines[2].startswith("bad.yml:4: listen: must be host:port")
    assert any(line.startswith("bad.yml:6: targets[0].name: is required") for line in lines)
    assert any(line.startswith("bad.yml:6: targets[0].url: must be an http(s) URL") for line in lines)


def test_unknown_top_level_key_and_missing_env_are_errors() -> None:
    with pytest.raises(ConfigError) as info:
        parse_config("api_token: ${NOPE}\nroutez: []\n", "c.yml", env={})
    text = str(info.value)
    assert "c.yml:1: api_token: environment variable NOPE is not set" in text
    assert "c.yml:2: routez: unknown key" in text


def test_env_default_and_dollar_escape() -> None:
    cfg = parse_config("api_token: ${T:-dflt}$$x\n", "c.yml", env={})
    assert cfg.api_token == "dflt$x"


def test_yaml_syntax_error_has_line() -> None:
    with pytest.raises(ConfigError, match=r"c.yml:3: \(yaml\): .*flow sequence started on line 2"):
        parse_config("targets:\n  - name: [unclosed\n", "c.yml", env={})


def test_duplicate_target_names_and_timeout_over_interval() -> None:
    text = (
        "global: {scrape_interval: 1s, scrape_timeout: 5s}\n"
        "targets:\n  - {name: a, url: 'http://127.0.0.1:1'}\n  - {name: a, url: 'http://127.0.0.1:2'}\n"
    )
    with pytest.raises(ConfigError) as info:
        parse_config(text, "c.yml", env={})
    text_out = str(info.value)
    assert "global.scrape_timeout: must not be greater than scrape_interval" in text_out
    assert "c.yml:4: targets[1].name: duplicate target name 'a'" in text_out


def test_rule_file_globs_resolve_relative_to_config(tmp_path: Path) -> None:
    (tmp_path / "rules").mkdir()
    (tmp_path / "rules" / "b.yml").write_text("groups: []\n")
    (tmp_path / "rules" / "a.yml").write_text("groups: []\n")
    cfg_path = tmp_path / "c.yml"
    cfg_path.write_text("rule_files: ['rules/*.yml', 'bundled:vllm.rules.yml']\n")
    cfg = load_config(str(cfg_path), env={})
    assert [Path(p).name for p in cfg.rule_files] == ["a.yml", "b.yml", "vllm.rules.yml"]


def test_missing_config_file_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(str(tmp_path / "absent.yml"), env={})


def test_embedded_defaults_watch_local_vllm_with_canary() -> None:
    cfg = load_config(None, env={})
    assert cfg.source == DEFAULTS_NAME
    assert [t.url for t in cfg.targets] == ["http://127.0.0.1:8000"]
    assert cfg.targets[0].canary.enabled
    assert cfg.listen_host == "127.0.0.1" and cfg.api_token is None
    assert cfg.rule_files and all(Path(p).is_file() for p in cfg.rule_files)


def test_non_loopback_listen_is_detected() -> None:
    assert not parse_config("listen: 0.0.0.0:9460\n", "c.yml", env={}).listens_on_loopback
    assert parse_config("listen: '[::1]:9460'\n", "c.yml", env={}).listens_on_loopback


def check(cfg: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """`vllm-watchdog check` as a process, bounded in time and memory: a hang or a read of /dev/zero fails."""

    def bounded() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))

    return subprocess.run(
        [sys.executable, "-m", "vllm_watchdog", "check", "--config", str(cfg)],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **(env or {})},
        preexec_fn=bounded,
    )


def test_check_refuses_fifos_devices_and_proc_files_at_once(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "inc.yml")
    os.mkfifo(tmp_path / "fifo.rules.yml")
    cfg = tmp_path / "c.yml"
    cfg.write_text(
        "targets: [{name: a, url: 'http://127.0.0.1:8000'}]\n"
        "include: [inc.yml]\n"
        "rule_files: [fifo.rules.yml, '/dev/zer*', /proc/self/environ]\n"
    )
    start = time.monotonic()
    out = check(cfg)
    assert time.monotonic() - start < 30
    assert out.returncode == 3, out.stderr
    assert out.stderr.splitlines() == [
        "/dev/zero:1: (file): cannot read: not a regular file but a character device",
        "/proc/self/environ:1: (file): cannot read: not a regular file but a kernel pseudo-file",
        f"{cfg}:2: include[0]: cannot read included file {tmp_path}/inc.yml (not a regular file but a FIFO)",
        f"{tmp_path}/fifo.rules.yml:1: (file): cannot read: not a regular file but a FIFO",
    ]


def test_check_of_a_fifo_config_does_not_hang(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "c.yml")
    out = check(tmp_path / "c.yml")
    assert out.returncode == 3
    assert out.stderr == f"{tmp_path}/c.yml:1: (file): cannot read: not a regular file but a FIFO\n"


SECRET_ENV = {
    "URL_PASS": "url-password-9c1f",
    "API_TOKEN": "api-token-value-77aa",
    "SCRAPE_SECRET": "scrape-secret-5e5e",
    "WEBHOOK_KEY": "webhook-key-value-31",
}
LEAKY = """\
api_token: ${API_TOKEN}
targets:
  - name: a
    url: http://user:${URL_PASS}@127.0.0.1:notaport
global:
  scrape_interval: ${SCRAPE_SECRET}
  sample_limit: ${API_TOKEN}
notifiers:
  - type: webhook
    url: http://127.0.0.1:9/hook
    headers: {X-Api-Key: "${WEBHOOK_KEY}"}
    send_resolved: ${WEBHOOK_KEY}
"""


def test_check_masks_substituted_secrets_and_url_passwords(tmp_path: Path) -> None:
    cfg = tmp_path / "c.yml"
    cfg.write_text(LEAKY)
    out = check(cfg, SECRET_ENV)
    assert out.returncode == 3
    for value in SECRET_ENV.values():
        assert value not in out.stderr + out.stdout
    lines = out.stderr.splitlines()
    assert (
        f"{cfg}:4: targets[0].url: must be an http(s) URL, got 'http://user:<redacted>@127.0.0.1:notaport'"
        in lines
    )
    assert any(
        line.startswith(f"{cfg}:6: global.scrape_interval: not a valid duration string: '<redacted>'")
        for line in lines
    )
    assert f"{cfg}:7: global.sample_limit: must be an integer, got '<redacted>'" in lines
    assert any(
        line.startswith(f"{cfg}:12: notifiers[0].send_resolved: ") and "<redacted>" in line for line in lines
    )


def test_secrets_substituted_from_the_environment_are_the_logs_secrets_too() -> None:
    cfg = parse_config(
        "api_token: ${TOKEN}\ntargets: [{name: a, url: 'http://127.0.0.1:1', env: {HF_TOKEN: '${HF}'}}]\n"
        "notifiers: [{type: webhook, url: 'http://127.0.0.1:9/${PATH_PART}', headers: {X-Trace: '${MY_SECRET}'}}]\n",
        "c.yml",
        env={"TOKEN": "t" * 12, "HF": "h" * 12, "PATH_PART": "not-a-secret-path", "MY_SECRET": "m" * 12},
    )
    secrets = set(config_secrets(cfg))
    assert {"t" * 12, "h" * 12, "m" * 12} <= secrets  # secret field, secret field, secret-named variable
    assert "not-a-secret-path" not in secrets


def test_a_bundled_rule_file_cannot_leave_the_bundled_folder(tmp_path: Path) -> None:
    cfg = tmp_path / "c.yml"
    cfg.write_text("rule_files: ['bundled:../../../../../../../etc/passwd', 'bundled:/etc/hostname']\n")
    with pytest.raises(ConfigError) as info:
        load_config(str(cfg), env={})
    assert [str(p) for p in info.value.problems] == [
        f"{cfg}:1: rule_files[0]: a bundled name must stay inside the bundled folder",
        f"{cfg}:1: rule_files[1]: a bundled name must stay inside the bundled folder",
    ]
    assert info.value.rule_files == ()


def test_an_unknown_key_is_named_only_when_it_looks_like_one() -> None:
    huge = "k" * (256 << 10)
    text = f"bogus_key: 1\n? '{huge}'\n: 1\n'a b $x': 2\nglobal:\n  ? {huge}\n  : 1\n"  # `?`: a long key
    with pytest.raises(ConfigError) as info:
        parse_config(text, "c.yml", env={})
    got = [str(p) for p in info.value.problems]
    assert got[0].startswith("c.yml:1: bogus_key: unknown key (allowed: ")
    assert got[1].startswith("c.yml:2: (root): unknown field at line 2 (allowed: ")
    assert got[2].startswith("c.yml:4: (root): unknown field at line 4 (allowed: ")
    assert got[3].startswith("c.yml:6: global: unknown field at line 6 (allowed: ")
    assert all(len(p) < 400 for p in got)


def test_quoted_values_are_clipped() -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(f"global: {{sample_limit: '{'9x' * 100_000}'}}\n", "c.yml", env={})
    (problem,) = info.value.problems
    assert problem.message.startswith("must be an integer, got '9x9x")
    assert problem.message.endswith("…(200000 characters)")
    assert len(problem.message) < 200


def test_check_masks_url_passwords_in_rule_file_problems(tmp_path: Path) -> None:
    rules = tmp_path / "r.yml"
    rules.write_text("groups: [{name: g, rules: [{record: 'http://u:rule-file-pw-123@h', expr: up}]}]\n")
    cfg = tmp_path / "c.yml"
    cfg.write_text(f"rule_files: [{rules}]\n")
    out = check(cfg)
    assert out.returncode == 3
    assert "rule-file-pw-123" not in out.stderr
    assert (
        f"{rules}:1: groups[0].rules[0].record: invalid recording rule name: http://u:<redacted>@h"
        in out.stderr
    )
