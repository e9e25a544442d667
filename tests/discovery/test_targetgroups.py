"""A file_sd file made into targets: Prometheus' format, the reserved labels, and the refusals that keep the
last good version of a file (a problem names file, line and field, never the file's contents)."""

from __future__ import annotations

import json
import os
from dataclasses import replace
from pathlib import Path

import pytest

from vllm_watchdog.config.targets import TargetConfig
from vllm_watchdog.discovery.config import FileSdConfig
from vllm_watchdog.discovery.targetgroups import MAX_FILE_BYTES, name_from_address, parse_groups, read_groups

SD = FileSdConfig(name="file_sd_configs[0]", files=("/sd/*.json",))
DOCKER_OK = replace(SD, runtimes=frozenset({"docker", "systemd"}))


def parse(doc: object, path: str = "/sd/a.json", sd: FileSdConfig = SD) -> tuple[TargetConfig, ...]:
    targets, problems = parse_groups(json.dumps(doc), path, sd)
    assert problems == []
    return targets


def problems_of(text: str, path: str = "/sd/a.yml", sd: FileSdConfig = SD) -> list[str]:
    targets, problems = parse_groups(text, path, sd)
    assert targets == ()  # a file with any problem lists nothing: the caller keeps its last good version
    return [str(p) for p in problems]


def test_a_group_is_one_target_per_address_with_its_labels_and_job() -> None:
    doc = [
        {"targets": ["127.0.0.1:8001", "127.0.0.1:8002"], "labels": {"model": "llama", "job": "vllm-prod"}},
        {"targets": ["127.0.0.1:8003"]},
    ]
    a, b, c = parse(doc)
    assert (a.name, a.url, a.job, dict(a.labels)) == (
        "127.0.0.1_8001",
        "http://127.0.0.1:8001",
        "vllm-prod",
        {"model": "llama"},
    )
    assert (b.name, b.url) == ("127.0.0.1_8002", "http://127.0.0.1:8002")
    assert (c.job, dict(c.labels), c.mode) == ("vllm", {}, None)  # watch only
    assert a.series_labels == {
        "model": "llama",
        "job": "vllm-prod",
        "instance": "127.0.0.1:8001",
        "target": "127.0.0.1_8001",
    }
    assert a.discovered is not None
    assert (a.discovered.mechanism, a.discovered.config, a.discovered.source) == (
        "file_sd",
        SD.name,
        "/sd/a.json:0",
    )
    assert c.discovered is not None and c.discovered.source == "/sd/a.json:1"
    assert a.discovered.labels == {
        "__address__": "127.0.0.1:8001",
        "__scheme__": "http",
        "__metrics_path__": "/metrics",
        "__meta_filepath": "/sd/a.json",
        "model": "llama",
        "job": "vllm-prod",
    }


def test_reserved_labels_name_the_target_its_scrape_and_its_runtime() -> None:
    doc = [
        {
            "targets": ["127.0.0.1:8443"],
            "labels": {
                "__watchdog_target__": "gpu-3",
                "__scheme__": "https",
                "__metrics_path__": "/m",
                "__watchdog_container__": "vllm-3",
                "__watchdog_gpus__": "3, 4",
                "__meta_rack": "r1",
            },
        },
        {"targets": ["127.0.0.1:8001"], "labels": {"__watchdog_unit__": "vllm@1.service"}},
    ]
    a, b = parse(doc, sd=DOCKER_OK)
    assert (a.name, a.url, a.metrics_url, a.container, a.gpus, a.mode) == (
        "gpu-3",
        "https://127.0.0.1:8443",
        "https://127.0.0.1:8443/m",
        "vllm-3",
        (3, 4),
        "docker",
    )
    assert dict(a.labels) == {}  # `__` labels never reach the series
    assert a.discovered is not None and a.discovered.labels["__meta_rack"] == "r1"
    assert (b.unit, b.mode) == ("vllm@1.service", "systemd")


def test_the_template_says_how_every_discovered_server_is_watched() -> None:
    template = TargetConfig(
        "-", "http://-", job="fleet", health_probe=False, labels={"dc": "x", "model": "t"}
    )
    sd = replace(SD, scheme="https", target=template)
    (t,) = parse([{"targets": ["127.0.0.1:9"], "labels": {"model": "own"}}], sd=sd)
    assert (t.url, t.job, t.health_probe, dict(t.labels)) == (
        "https://127.0.0.1:9",
        "fleet",
        False,
        {"dc": "x", "model": "own"},
    )


def test_yaml_files_read_as_json_files_do() -> None:
    text = "- targets: ['127.0.0.1:8001']\n  labels: {model: llama}\n"
    targets, problems = parse_groups(text, "/sd/a.yml", SD)
    assert problems == [] and [(t.name, dict(t.labels)) for t in targets] == [
        ("127.0.0.1_8001", {"model": "llama"})
    ]
    assert parse_groups("", "/sd/a.yml", SD) == ((), [])  # an empty file lists nothing, as in Prometheus
    tabbed = json.dumps([{"targets": ["127.0.0.1:1"]}], indent="\t")  # valid JSON that YAML alone refuses
    assert [t.name for t in parse_groups(tabbed, "/sd/a.json", SD)[0]] == ["127.0.0.1_1"]


def test_values_are_data_not_templates() -> None:
    (t,) = parse([{"targets": ["127.0.0.1:1"], "labels": {"note": "${HOME} $$"}}])
    assert t.labels["note"] == "${HOME} $$"  # no environment substitution in a discovery file


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ('{"targets": []}', "/sd/a.json:1: (root): must be a list"),
        ('[{"targets": ["a:1"]}', "/sd/a.json:1: (json): Expecting ',' delimiter"),
        ('[{"targets": ["127.0.0.1:1"], "labls": {}}]', "[0].labls: unknown key (did you mean 'labels'?"),
        ('[{"targets": ["127.0.0.1/x"]}]', "[0].targets[0]: must be host:port"),
        ('[{"targets": ["user@127.0.0.1:1"]}]', "[0].targets[0]: must be host:port"),
        ('[{"targets": ["127.0.0.1:99999"]}]', "[0].targets[0]: must be an http(s) URL"),
        ('[{"targets": ["127.0.0.1:1"], "labels": {"instance": "x"}}]', "must not set 'instance'"),
        (
            '[{"targets": ["127.0.0.1:1"], "labels": {"target": "x"}}]',
            "name the target with __watchdog_target__",
        ),
        ('[{"targets": ["127.0.0.1:1"], "labels": {"0bad": "x"}}]', "invalid label name '0bad'"),
        ('[{"targets": ["127.0.0.1:1"], "labels": {"a": "\\ud800"}}]', "label a must be valid text"),
        (
            '[{"targets": ["127.0.0.1:1"], "labels": {"__scheme__": "ftp"}}]',
            "__scheme__ must be http or https",
        ),
        (
            '[{"targets": ["127.0.0.1:1"], "labels": {"__metrics_path__": "m"}}]',
            "__metrics_path__ must start",
        ),
        (
            '[{"targets": ["127.0.0.1:1"], "labels": {"__watchdog_target__": "a b"}}]',
            "__watchdog_target__ must be",
        ),
        (
            '[{"targets": ["127.0.0.1:1", "127.0.0.1:2"], "labels": {"__watchdog_target__": "a"}}]',
            "names one server; this group lists 2 addresses",
        ),
        ('[{"targets": ["127.0.0.1:1"]}, {"targets": ["127.0.0.1:1"]}]', "2 targets are named '127.0.0.1_1'"),
        (
            '[{"targets": ["127.0.0.1:1"], "labels": {"__watchdog_container__": "c"}}]',
            "__watchdog_container__ needs runtimes: [docker] in file_sd_configs[0]",
        ),
    ],
)
def test_a_bad_file_is_refused_naming_file_line_and_field(text: str, problem: str) -> None:
    assert any(problem in p for p in problems_of(text, "/sd/a.json")), problems_of(text, "/sd/a.json")


def test_runtime_labels_are_checked_where_allowed() -> None:
    bad = '[{"targets": ["127.0.0.1:1"], "labels": {"__watchdog_container__": "-x"}}]'
    assert any("not a Docker container name" in p for p in problems_of(bad, "/sd/a.json", DOCKER_OK))
    bad = '[{"targets": ["127.0.0.1:1"], "labels": {"__watchdog_unit__": "a;b"}}]'
    assert any("not a systemd unit name" in p for p in problems_of(bad, "/sd/a.json", DOCKER_OK))
    both = (
        '[{"targets": ["127.0.0.1:1"], "labels": {"__watchdog_unit__": "u", "__watchdog_container__": "c"}}]'
    )
    assert any("at most one of" in p for p in problems_of(both, "/sd/a.json", DOCKER_OK))
    gpus = '[{"targets": ["127.0.0.1:1"], "labels": {"__watchdog_gpus__": "0,x"}}]'
    assert any("GPU indices" in p for p in problems_of(gpus, "/sd/a.json", DOCKER_OK))


def test_a_file_listing_more_than_max_targets_is_refused_before_they_are_built() -> None:
    many = json.dumps([{"targets": [f"127.0.0.1:{1000 + i}" for i in range(50_000)]}])
    assert problems_of(many, "/sd/a.json") == [
        "/sd/a.json:1: [0].targets: 50000 addresses, more than max_targets (64)"
    ]
    groups = json.dumps([{"targets": [f"127.0.0.1:{1000 + i}"]} for i in range(65)])
    assert problems_of(groups, "/sd/a.json") == ["/sd/a.json:1: [64]: more than max_targets (64)"]


def test_hostile_files_cost_little_and_are_not_echoed() -> None:
    bomb = "a: &a [x, x, x, x, x, x, x, x, x, x]\nb: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a, *a]\n"
    assert problems_of(bomb) == ["/sd/a.yml:2: (yaml): aliases (*name) are not allowed here"]
    deep = "[" * 10_000 + "]" * 10_000
    assert problems_of(deep, "/sd/a.json")  # JSON nesting: refused, no RecursionError escapes
    secret = "- targets: [127.0.0.1:1]\n  labels: {'root:$6$hash:19000:0:99999:7:::': x}\n"
    assert all("$6$hash" not in p for p in problems_of(secret))


def test_reading_is_bounded(tmp_path: Path) -> None:
    big = tmp_path / "big.json"
    big.write_text("[" + " " * MAX_FILE_BYTES + "]")
    targets, problems = read_groups(str(big), SD)
    assert targets == () and "larger than" in problems[0].message
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)
    targets, problems = read_groups(str(fifo), SD)  # refused before it is opened: no hang
    assert targets == () and "FIFO" in problems[0].message


def test_names_from_addresses() -> None:
    assert name_from_address("127.0.0.1:8000") == "127.0.0.1_8000"
    assert name_from_address("[::1]:8000") == "1__8000"
    assert name_from_address("localhost:8000") == "localhost_8000"
