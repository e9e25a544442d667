"""The `fleet:` section: defaults, every key, and problems reported with file:line."""

from __future__ import annotations

import pytest

from vllm_watchdog.config.model import parse_config
from vllm_watchdog.errors import ConfigError
from vllm_watchdog.fleet.config import FleetConfig, MaxDisrupted, parse_max_disrupted


def test_no_section_means_no_fleet_and_an_empty_one_takes_the_defaults() -> None:
    assert parse_config("targets: []\n", "c.yml").fleet is None
    assert parse_config("fleet: {}\n", "c.yml").fleet == FleetConfig()


def test_every_key() -> None:
    cfg = parse_config(
        """fleet:
  endpoints: [http://127.0.0.1:2379, "https://127.0.0.1:2381/"]
  group: llama-70b
  member: gpu-7:9460
  max_disrupted: 25%
  lease_ttl: 15s
  request_timeout: 3s
  slot_wait: 20m
  correlated_share: 40%
  prefix: /watchdogs/prod
  basic_auth: {username: watchdog, password: s3cret}
""",
        "c.yml",
    ).fleet
    assert cfg is not None
    assert cfg.endpoints == ("http://127.0.0.1:2379", "https://127.0.0.1:2381")
    assert (cfg.group, cfg.member, cfg.prefix) == ("llama-70b", "gpu-7:9460", "/watchdogs/prod")
    assert cfg.max_disrupted == MaxDisrupted(count=None, percent=25.0)
    assert (cfg.lease_ttl, cfg.request_timeout, cfg.slot_wait) == (15.0, 3.0, 1200.0)
    assert cfg.correlated_share == pytest.approx(0.4)
    assert cfg.http.basic_auth is not None and cfg.http.basic_auth.username == "watchdog"


@pytest.mark.parametrize(
    ("live", "setting", "slots"),
    [
        (10, "1", 1),
        (10, "3", 3),
        (4, "25%", 1),
        (8, "25%", 2),
        (5, "25%", 1),
        (10, "25%", 2),  # a Kubernetes PDB would allow 3 (it rounds up): docs/fleet.md says why not here
        (7, "50%", 3),
        (2, "25%", 1),
        (0, "50%", 1),
    ],
)
def test_max_disrupted_is_a_count_or_a_share_of_the_live_members_rounded_down_at_least_one(
    live: int, setting: str, slots: int
) -> None:
    assert parse_max_disrupted(setting).limit(live) == slots


@pytest.mark.parametrize(
    ("text", "where", "message"),
    [
        ("max_disrupted: 0", "c.yml:2: fleet.max_disrupted", "count of at least 1"),
        ("max_disrupted: 150%", "c.yml:2: fleet.max_disrupted", "percentage"),
        ("lease_ttl: 2500ms", "c.yml:2: fleet.lease_ttl", "whole seconds"),
        ("lease_ttl: 1s", "c.yml:2: fleet.lease_ttl", "at least 2s"),
        ("request_timeout: 5s", "c.yml:2: fleet.request_timeout", "a third of lease_ttl"),
        ("member: a/b", "c.yml:2: fleet.member", "letters, digits"),
        ("endpoints: [http://127.0.0.1:2379/v3]", "c.yml:2: fleet.endpoints[0]", "scheme://host:port"),
        ("endpoints: []", "c.yml:2: fleet.endpoints", "1 to 16"),
        ("correlated_share: 1.5", "c.yml:2: fleet.correlated_share", "between 0 and 1"),
        ("authorization: {credentials: x}", "c.yml:2: fleet", "authorization"),
    ],
)
def test_problems_name_file_line_and_field(text: str, where: str, message: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_config(f"fleet:\n  {text}\n", "c.yml")
    shown = str(err.value)
    assert where in shown and message in shown, shown


def test_the_correlated_hold_can_be_turned_off() -> None:
    cfg = parse_config("fleet: {correlated_share: null}\n", "c.yml").fleet
    assert cfg is not None and cfg.correlated_share is None


def test_the_fleet_view_shows_what_members_published_bounded_and_printable() -> None:
    from vllm_watchdog.fleet.members import MAX_SHOWN, format_members

    table = format_members(
        "g",
        [
            {
                "member": "m0",
                "targets": ["vllm-0"],
                "alerts": ["VLLMEngineHung (vllm-0)"],
                "running": {"vllm-0": "restart"},
            },
            {"member": "m1\x1b[2J", "targets": ["x" * 1000], "waiting": {"vllm-1": "disable_draft"}},
        ],
    )
    lines = table.splitlines()
    assert lines[0] == "group g: 2 live members"
    assert lines[1].split() == [
        "MEMBER",
        "TARGETS",
        "FIRING",
        "ALERTS",
        "RUNNING",
        "WAITING",
        "FOR",
        "A",
        "SLOT",
    ]
    assert "VLLMEngineHung (vllm-0)" in lines[2] and "vllm-0: restart" in lines[2]
    assert lines[3].startswith("m1?[2J") and "vllm-1: disable_draft" in lines[3]
    assert max(len(cell) for cell in lines[3].split()) <= MAX_SHOWN
