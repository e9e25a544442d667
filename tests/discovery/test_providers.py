"""The discoveries of a config together: the effective target list, names the config already has, the
max_targets bound, reloads that keep what unchanged discoveries found, and the own metrics."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from tests.support.clock import Clock
from vllm_watchdog.config.model import Config, parse_config
from vllm_watchdog.discovery.metrics import DiscoveryCollector
from vllm_watchdog.discovery.providers import DiscoveryOptions, TargetDiscovery

pytestmark = pytest.mark.anyio


def config(tmp_path: Path, extra: str = "") -> Config:
    text = f"""targets: [{{name: static-0, url: "http://127.0.0.1:8000"}}]
file_sd_configs:
  - {{files: ["{tmp_path}/a/*.json"], max_targets: 3{extra}}}
  - {{files: ["{tmp_path}/b/*.json"]}}
"""
    return parse_config(text, str(tmp_path / "c.yml"), env={})


def write(path: Path, *entries: tuple[str, int]) -> None:
    """One group per (name, port)."""
    path.parent.mkdir(exist_ok=True)
    groups = [{"targets": [f"127.0.0.1:{port}"], "labels": {"__watchdog_target__": n}} for n, port in entries]
    path.write_text(json.dumps(groups))


def names(d: TargetDiscovery) -> list[str]:
    return [t.name for t in d.effective().targets]


async def test_static_targets_come_first_and_keep_their_names(tmp_path: Path) -> None:
    write(tmp_path / "a" / "1.json", ("sd-a", 8001), ("static-0", 8002))
    write(tmp_path / "b" / "1.json", ("sd-a", 8003), ("sd-b", 8004))
    d = TargetDiscovery(config(tmp_path), DiscoveryOptions(clock=Clock()))
    d.first_look()
    assert names(d) == ["static-0", "sd-a", "sd-b"]
    by_name = {t.name: t for t in d.effective().targets}
    assert by_name["static-0"].url == "http://127.0.0.1:8000" and by_name["static-0"].discovered is None
    assert by_name["sd-a"].url == "http://127.0.0.1:8001"  # the first discovery's, not the second's
    assert [(x.discovery, x.name, x.reason) for x in d.dropped] == [
        ("file_sd_configs[0]", "static-0", "the name is taken by the config's targets"),
        ("file_sd_configs[1]", "sd-a", "the name is taken by file_sd_configs[0]"),
    ]


async def test_a_look_says_whether_the_effective_targets_changed(tmp_path: Path) -> None:
    write(tmp_path / "a" / "1.json", ("sd-a", 8001))
    d = TargetDiscovery(config(tmp_path), DiscoveryOptions(clock=Clock()))
    d.first_look()
    assert not await d.refresh("file_sd_configs[0]")  # nothing changed
    write(tmp_path / "a" / "1.json", ("sd-a", 8001), ("sd-b", 8002))
    assert await d.refresh("file_sd_configs[0]")
    assert names(d) == ["static-0", "sd-a", "sd-b"]
    write(tmp_path / "a" / "2.json", ("static-0", 8003))  # found, but the name is taken: no change
    assert not await d.refresh("file_sd_configs[0]")
    write(tmp_path / "a" / "3.json", ("sd-a", 8001))  # the same target, found in another file:
    write(tmp_path / "a" / "1.json", ("sd-b", 8002))  # what the API shows of it changes
    assert await d.refresh("file_sd_configs[0]")
    (sd_a,) = [t for t in d.effective().targets if t.name == "sd-a"]
    assert sd_a.discovered is not None and sd_a.discovered.source.endswith("3.json:0")
    assert not await d.refresh("no such discovery")


async def test_more_than_max_targets_keeps_the_last_good_set(tmp_path: Path) -> None:
    write(tmp_path / "a" / "1.json", ("sd-a", 8001))
    d = TargetDiscovery(config(tmp_path), DiscoveryOptions(clock=Clock()))
    d.first_look()
    write(tmp_path / "a" / "1.json", ("sd-a", 8001), ("sd-b", 8002))
    write(tmp_path / "a" / "2.json", ("sd-c", 8003), ("sd-d", 8004))  # each file is within the bound
    assert not await d.refresh("file_sd_configs[0]")
    assert names(d) == ["static-0", "sd-a"]
    first = d.discoveries["file_sd_configs[0]"]
    assert first.failures == 1 and "4 targets found, more than max_targets (3)" in first.problems[-1]
    (tmp_path / "a" / "2.json").unlink()
    assert await d.refresh("file_sd_configs[0]")
    assert names(d) == ["static-0", "sd-a", "sd-b"] and first.problems == ()


async def test_a_reload_keeps_what_unchanged_discoveries_found_and_looks_through_new_ones(
    tmp_path: Path,
) -> None:
    write(tmp_path / "a" / "1.json", ("sd-a", 8001))
    write(tmp_path / "b" / "1.json", ("sd-b", 8002))
    d = TargetDiscovery(config(tmp_path), DiscoveryOptions(clock=Clock()))
    d.first_look()
    kept = d.discoveries["file_sd_configs[1]"]
    (tmp_path / "b" / "1.json").unlink()  # not looked at again by the reload: the unchanged one keeps it
    await d.apply(config(tmp_path, ", target: {canary: false}"))
    assert d.discoveries["file_sd_configs[1]"] is kept
    by_name = {t.name: t for t in d.effective().targets}
    assert sorted(by_name) == ["sd-a", "sd-b", "static-0"]
    assert not by_name["sd-a"].canary.enabled  # the changed discovery looked again, with its new template


async def test_own_metrics(tmp_path: Path) -> None:
    write(tmp_path / "a" / "1.json", ("sd-a", 8001), ("static-0", 8002))
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "bad.json").write_text("{")
    d = TargetDiscovery(config(tmp_path), DiscoveryOptions(clock=Clock()))
    d.first_look()
    registry = CollectorRegistry()
    registry.register(DiscoveryCollector(d))
    text = generate_latest(registry).decode()
    for line in (
        'vllm_watchdog_sd_discovered_targets{discovery="file_sd_configs[0]",mechanism="file_sd"} 2.0',
        'vllm_watchdog_sd_dropped_targets{discovery="file_sd_configs[0]"} 1.0',
        'vllm_watchdog_sd_problems{discovery="file_sd_configs[1]"} 1.0',
        'vllm_watchdog_sd_file_read_errors_total{discovery="file_sd_configs[1]"} 1.0',
        'vllm_watchdog_sd_refresh_failures_total{discovery="file_sd_configs[0]",mechanism="file_sd"} 0.0',
        f'vllm_watchdog_sd_file_mtime_seconds{{discovery="file_sd_configs[0]",filename="{tmp_path}/a/1.json"}}',
    ):
        assert line in text, text


async def test_a_look_that_raises_is_a_failed_look(tmp_path: Path) -> None:
    write(tmp_path / "a" / "1.json", ("sd-a", 8001))
    d = TargetDiscovery(config(tmp_path), DiscoveryOptions(clock=Clock()))
    d.first_look()

    class Broken:
        def refresh(self) -> None:
            raise TypeError("an answer nobody foresaw")

    first = d.discoveries["file_sd_configs[0]"]
    first.looker = Broken()
    assert not await d.refresh("file_sd_configs[0]")
    assert first.failures == 1 and names(d) == ["static-0", "sd-a"]  # what it found last stays
