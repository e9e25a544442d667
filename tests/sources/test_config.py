"""The `gpus:` section: NVML, `dcgm_url` as the one-exporter shorthand, and a list of GPU exporters."""

from __future__ import annotations

import pytest

from vllm_watchdog.config.model import parse_config
from vllm_watchdog.errors import ConfigError
from vllm_watchdog.redact import config_secrets
from vllm_watchdog.sources.config import GpuConfig, GpuExporterConfig


def problems(text: str) -> list[str]:
    with pytest.raises(ConfigError) as info:
        parse_config(text, "c.yml", env={})
    return [str(p) for p in info.value.problems]


def test_dcgm_url_is_one_exporter_named_and_labelled_dcgm() -> None:
    short = parse_config("gpus: {dcgm_url: 'http://127.0.0.1:9400/metrics'}\n", "c.yml", env={})
    listed = parse_config(
        "gpus:\n  exporters:\n    - {name: dcgm, url: 'http://127.0.0.1:9400/metrics'}\n", "c.yml", env={}
    )
    assert (
        short.gpus
        == listed.gpus
        == GpuConfig(exporters=(GpuExporterConfig("dcgm", "http://127.0.0.1:9400/metrics"),))
    )
    assert short.gpus.exporters[0].job == "dcgm" and dict(short.gpus.exporters[0].labels) == {}
    assert parse_config("gpus: {nvml: true}\n", "c.yml", env={}).gpus == GpuConfig(nvml=True)


def test_several_exporters_each_with_its_name_job_and_labels() -> None:
    cfg = parse_config(
        "gpus:\n"
        "  exporters:\n"
        "    - {name: node-a, url: 'http://192.0.2.1:9400/metrics', labels: {rack: r1}}\n"
        "    - {name: node-b, url: 'http://192.0.2.2:9400/metrics', job: gpu}\n",
        "c.yml",
        env={},
    )
    a, b = cfg.gpus.exporters
    assert (a.name, a.job, dict(a.labels)) == ("node-a", "dcgm", {"rack": "r1"})
    assert (b.name, b.job, b.url) == ("node-b", "gpu", "http://192.0.2.2:9400/metrics")


def test_bad_exporters_are_reported_with_file_line_and_field() -> None:
    text = (
        "gpus:\n"  # 1
        "  exporters:\n"  # 2
        "    - {name: a, url: 'http://h:9400/metrics'}\n"  # 3
        "    - {name: a, url: 'http://h:9401/metrics'}\n"  # 4
        "    - {name: c, url: 'http://h:9400/metrics'}\n"  # 5
        "    - {url: 'ftp://h'}\n"  # 6
        "    - {name: e, url: 'http://h:1/', labels: {instance: x}, job: '', bogus: 1}\n"  # 7
    )
    assert problems(text) == [
        "c.yml:4: gpus.exporters[1].name: duplicate exporter name 'a'",
        "c.yml:5: gpus.exporters[2].url: another exporter scrapes 'http://h:9400/metrics'",
        "c.yml:6: gpus.exporters[3].name: is required",
        "c.yml:6: gpus.exporters[3].url: must be an http(s) URL, got 'ftp://h'",
        "c.yml:7: gpus.exporters[4].bogus: unknown key (allowed: job, labels, name, url)",
        "c.yml:7: gpus.exporters[4].job: must not be empty",
        "c.yml:7: gpus.exporters[4].labels: must not set 'instance'; it is derived from the exporter",
    ]


def test_dcgm_url_and_exporters_together_are_refused() -> None:
    text = (
        "gpus:\n  dcgm_url: 'http://h:9400/metrics'\n  exporters: [{name: a, url: 'http://h:9401/metrics'}]\n"
    )
    assert problems(text) == ["c.yml:2: gpus: set dcgm_url (one dcgm-exporter) or exporters, not both"]


def test_every_exporters_url_password_is_a_secret() -> None:
    cfg = parse_config(
        "gpus:\n  exporters:\n"
        "    - {name: a, url: 'http://u:pa55word-one@h:9400/metrics'}\n"
        "    - {name: b, url: 'http://u:pa55word-two@h:9401/metrics'}\n",
        "c.yml",
        env={},
    )
    assert {"pa55word-one", "pa55word-two"} <= set(config_secrets(cfg))
