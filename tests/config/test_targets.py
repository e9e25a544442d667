"""A target's labels: Prometheus' own `instance` (host:port of its URL), the `job` the operator names, `target`."""

from __future__ import annotations

import pytest

from vllm_watchdog.config.addresses import scrape_address
from vllm_watchdog.config.model import parse_config
from vllm_watchdog.errors import ConfigError


@pytest.mark.parametrize(
    ("url", "instance"),
    [
        ("http://127.0.0.1:8000", "127.0.0.1:8000"),
        ("http://vllm.internal:8000/prefix/", "vllm.internal:8000"),
        ("http://vllm", "vllm:80"),  # the scheme's port, as Prometheus adds it to an address without one
        ("https://Vllm.Example", "Vllm.Example:443"),  # the host as written
        ("http://user:secret@[::1]:9000", "[::1]:9000"),  # no user info
        ("http://[fe80::1]", "[fe80::1]:80"),
    ],
)
def test_instance_is_the_scrape_address_as_prometheus_derives_it(url: str, instance: str) -> None:
    assert scrape_address(url) == instance


def test_job_is_vllm_unless_the_config_or_the_target_names_one() -> None:
    text = """
targets:
  - {name: a, url: "http://127.0.0.1:8000"}
  - {name: b, url: "http://127.0.0.1:8001", job: vllm-canary, labels: {env: prod}}
"""
    a, b = parse_config(text, "w.yml", env={}).targets
    assert a.series_labels == {"job": "vllm", "instance": "127.0.0.1:8000", "target": "a"}
    assert b.series_labels == {
        "env": "prod",
        "job": "vllm-canary",
        "instance": "127.0.0.1:8001",
        "target": "b",
    }
    a, b = parse_config("global: {job: inference}\n" + text, "w.yml", env={}).targets
    assert (a.job, b.job) == ("inference", "vllm-canary")


def test_labels_cannot_set_the_labels_the_watchdog_derives_and_a_job_is_not_empty() -> None:
    text = """
global: {job: ""}
targets:
  - {name: a, url: "http://h:1", labels: {target: other, instance: x}}
  - {name: b, url: "http://h:2", job: ""}
"""
    with pytest.raises(ConfigError) as exc:
        parse_config(text, "w.yml", env={})
    got = [str(p) for p in exc.value.problems]
    assert "w.yml:2: global.job: must not be empty" in got
    assert "w.yml:4: targets[0].labels: must not set 'instance'; it is derived from the target" in got
    assert "w.yml:4: targets[0].labels: must not set 'target'; it is derived from the target" in got
    assert "w.yml:5: targets[1].job: must not be empty" in got
