"""Docker label discovery: how a labelled container becomes a docker-mode target (from the engine's list
answers), then against the real engine with cheap stub containers on the host network."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import pytest

from tests.support.docker_engine import SESSION
from tests.support.stub_server import StubContainers
from tests.support.vllm_server import free_port
from vllm_watchdog.actions.runtimes.docker import BACKUP_SUFFIX
from vllm_watchdog.actions.runtimes.targetruntimes import docker_from_env
from vllm_watchdog.config.targets import TargetConfig
from vllm_watchdog.discovery.config import DockerSdConfig
from vllm_watchdog.discovery.docker import DockerDiscovery, docker_targets

SD = DockerSdConfig(name="docker_sd_configs[0]")
P = SD.label_prefix


def container(name: str, labels: dict[str, str], mode: str = "host", **more: Any) -> dict[str, Any]:
    """A `GET /containers/json` entry."""
    return {
        "Id": "f" * 64,
        "Names": ["/" + name],
        "Labels": labels,
        "HostConfig": {"NetworkMode": mode},
        **more,
    }


def look(
    summaries: list[dict[str, Any]], sd: DockerSdConfig, previous: dict[str, TargetConfig]
) -> tuple[tuple[TargetConfig, ...], tuple[str, ...]]:
    found = docker_targets(summaries, sd, previous)
    return found.targets, found.problems


def test_a_labelled_container_on_the_host_network_is_a_docker_target() -> None:
    labels = {
        P + "target": "gpu-0",
        P + "port": "8001",
        P + "gpus": "0,1",
        P + "job": "vllm-fleet",
        P + "label.model": "llama",
        "org.opencontainers.image.title": "vllm",
    }
    (t,), problems = look([container("vllm-0", labels)], SD, {})
    assert problems == ()
    assert (t.name, t.url, t.container, t.mode, t.gpus, t.job) == (
        "gpu-0",
        "http://127.0.0.1:8001",
        "vllm-0",
        "docker",
        (0, 1),
        "vllm-fleet",
    )
    assert dict(t.labels) == {"model": "llama"}
    assert t.discovered is not None and t.discovered.source == "docker:vllm-0"
    assert t.discovered.labels["__meta_docker_container_name"] == "/vllm-0"
    assert t.discovered.labels["__meta_docker_container_label_org_opencontainers_image_title"] == "vllm"
    assert t.discovered.labels["__address__"] == "127.0.0.1:8001"


def test_the_template_and_defaults_fill_in_what_labels_leave_out() -> None:
    sd = replace(
        SD, port=9000, scheme="https", target=TargetConfig("-", "http://-", job="c", health_probe=False)
    )
    (t,), _ = look([container("v", {P + "target": "a"})], sd, {})
    assert (t.url, t.job, t.health_probe) == ("https://127.0.0.1:9000", "c", False)


def test_a_published_port_is_reached_on_loopback_only() -> None:
    ports = [{"IP": "0.0.0.0", "PrivatePort": 8000, "PublicPort": 49153, "Type": "tcp"}]
    (t,), _ = look([container("a", {P + "target": "a"}, "bridge", Ports=ports)], SD, {})
    assert t.url == "http://127.0.0.1:49153"
    ports = [{"IP": "::", "PrivatePort": 8000, "PublicPort": 49154, "Type": "tcp"}]
    (t,), _ = look([container("a", {P + "target": "a"}, "bridge", Ports=ports)], SD, {})
    assert t.url == "http://[::1]:49154"
    elsewhere = [{"IP": "0.0.0.0", "PrivatePort": 8080, "PublicPort": 49155, "Type": "tcp"}]  # another port
    found, (problem,) = look([container("a", {P + "target": "a"}, "bridge", Ports=elsewhere)], SD, {})
    assert found == () and "neither on the host network nor publishing port 8000 on loopback" in problem


def test_a_stopped_container_keeps_the_address_it_had() -> None:
    ports = [{"IP": "127.0.0.1", "PrivatePort": 8000, "PublicPort": 49153, "Type": "tcp"}]
    (before,), _ = look([container("a", {P + "target": "a"}, "bridge", Ports=ports)], SD, {})
    (after,), _ = look([container("a", {P + "target": "a"}, "bridge")], SD, {"a": before})
    assert after == before


def test_a_relaunch_keeps_its_target_and_a_name_two_containers_claim_is_refused() -> None:
    labels = {P + "target": "a", P + "port": "8001"}
    mid_replace = [container("vllm-a" + BACKUP_SUFFIX, labels)]  # renamed, replacement not made yet
    (t,), _ = look(mid_replace, SD, {})
    assert t.container == "vllm-a"
    (t,), _ = look([*mid_replace, container("vllm-a", labels)], SD, {})
    assert t.container == "vllm-a"
    found, (problem,) = look([container("x", labels), container("y", labels)], SD, {})
    assert found == () and problem == "target 'a' is claimed by 2 containers; none is used"


@pytest.mark.parametrize(
    ("labels", "problem"),
    [
        ({P + "target": "a b"}, "label vllm-watchdog.target must be letters"),
        ({P + "target": "a", P + "port": "http"}, "label vllm-watchdog.port must be a TCP port"),
        ({P + "target": "a", P + "port": "99999999999"}, "label vllm-watchdog.port must be a TCP port"),
        ({P + "target": "a", P + "scheme": "ftp"}, "label vllm-watchdog.scheme must be http or https"),
        ({P + "target": "a", P + "label.instance": "x"}, "does not name a label a target may set"),
        ({P + "target": "a", P + "label.__x": "x"}, "does not name a label a target may set"),
        ({P + "target": "a", P + "gpus": "0;1"}, "label vllm-watchdog.gpus must be GPU indices"),
    ],
)
def test_bad_labels_are_problems_naming_the_container(labels: dict[str, str], problem: str) -> None:
    found, problems = look([container("c", labels)], SD, {})
    assert found == () and problems[0].startswith("container 'c': ") and problem in problems[0], problems


def test_an_engine_that_does_not_answer_is_a_failed_look() -> None:
    def refuse() -> Any:
        raise OSError("connection refused")

    assert DockerDiscovery(SD, refuse).refresh() is None


# -- against the real engine -----------------------------------------------------------------------


@pytest.fixture
def stubs(docker_client: Any, hostroot_image: str) -> Iterator[StubContainers]:
    helper = StubContainers(docker_client, hostroot_image)
    yield helper
    helper.close()


def test_labelled_stub_containers_are_found_on_the_real_engine(stubs: StubContainers) -> None:
    prefix = f"sdtest-{SESSION}."  # no other run's containers carry it
    sd = DockerSdConfig(name="docker_sd_configs[0]", label_prefix=prefix)
    port = free_port()
    name, _ = stubs.run([], port=port, labels={prefix + "target": "sd-a", prefix + "port": str(port)})
    stubs.run([], labels={"unrelated": "x"})  # no target label: not looked at
    discovery = DockerDiscovery(sd, docker_from_env)
    try:
        found = discovery.refresh()
        assert found is not None and found.problems == ()
        (t,) = found.targets
        assert (t.name, t.url, t.container, t.mode) == ("sd-a", f"http://127.0.0.1:{port}", name, "docker")
        assert t.discovered is not None and t.discovered.labels["__meta_docker_network_mode"] == "host"

        stubs.client.containers.get(name).stop(timeout=5)  # a restart stops it: still the same target
        found = discovery.refresh()
        assert found is not None and [(t.name, t.container) for t in found.targets] == [("sd-a", name)]

        stubs.client.containers.get(name).rename(name + BACKUP_SUFFIX)  # a relaunch in progress
        stubs.names.append(name + BACKUP_SUFFIX)
        found = discovery.refresh()
        assert found is not None and [(t.name, t.container) for t in found.targets] == [("sd-a", name)]

        stubs.client.containers.get(name + BACKUP_SUFFIX).remove(force=True)
        found = discovery.refresh()
        assert found is not None and found.targets == ()
    finally:
        discovery.close()


def test_an_engine_outage_is_logged_once_and_its_end_too(caplog: pytest.LogCaptureFixture) -> None:
    answers: list[Any] = [OSError("refused"), OSError("refused")]

    class Engine:
        class api:  # the SDK's attribute
            @staticmethod
            def containers(**_: Any) -> list[dict[str, Any]]:
                return []

        def close(self) -> None:
            pass

    def client() -> Any:
        if answers:
            raise answers.pop()
        return Engine()

    looker = DockerDiscovery(SD, client)
    with caplog.at_level(logging.INFO):
        assert looker.refresh() is None and looker.refresh() is None
        found = looker.refresh()
    assert found is not None and found.targets == ()
    said = [r.getMessage() for r in caplog.records]
    assert said == ["docker_sd: Docker engine not reachable", "docker_sd: Docker engine reachable again"]
