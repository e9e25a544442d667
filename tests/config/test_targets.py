"""A target's labels: Prometheus' own `instance` (host:port of its URL), the `job` the operator names, `target`."""

from __future__ import annotations

import pytest

from vllm_watchdog.config.addresses import scrape_address
from vllm_watchdog.config.limits import ScrapeLimits
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


def test_scrape_limits_default_in_global_and_a_target_overrides_each() -> None:
    text = """
global: {label_limit: 40, label_value_length_limit: 0, series_limit: 50000}
targets:
  - {name: a, url: "http://127.0.0.1:8000"}
  - {name: b, url: "http://127.0.0.1:8001", sample_limit: 100, label_name_length_limit: 20, body_size_limit: 1MiB}
"""
    cfg = parse_config(text, "w.yml", env={})
    a, b = cfg.targets
    defaults = cfg.global_.limits
    assert defaults == ScrapeLimits(label_limit=40, label_value_length_limit=0, series_limit=50_000)
    assert a.scrape_limits(defaults) == defaults
    assert b.scrape_limits(defaults) == ScrapeLimits(
        sample_limit=100,
        body_size_limit=1 << 20,
        label_limit=40,
        label_name_length_limit=20,
        label_value_length_limit=0,
        series_limit=50_000,
    )
    # Unset, series_limit is twice the sample_limit in effect; 0 is no limit, as a label limit of 0 is.
    assert ScrapeLimits(sample_limit=100).held_series == 200
    assert (
        ScrapeLimits(series_limit=0).held_series == 0 and ScrapeLimits(series_limit=0).held_label_bytes == 0
    )


def test_scrape_limits_are_checked_with_file_and_line() -> None:
    text = """
global: {label_limit: -1, sample_limit: 10, series_limit: 5}
targets:
  - {name: a, url: "http://h:1", label_value_length_limit: many, body_size_limit: 0B, sample_limit: 0}
"""
    with pytest.raises(ConfigError) as exc:
        parse_config(text, "w.yml", env={})
    got = [str(p) for p in exc.value.problems]
    assert "w.yml:2: global.label_limit: must be >= 0, got -1" in got
    assert "w.yml:2: global.series_limit: must not be less than sample_limit (10), or 0 for no limit" in got
    assert "w.yml:4: targets[0].label_value_length_limit: must be an integer, got 'many'" in got
    assert "w.yml:4: targets[0].body_size_limit: must be greater than 0" in got
    assert "w.yml:4: targets[0].sample_limit: must be >= 1, got 0" in got
