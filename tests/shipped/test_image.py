"""The sidecar image (deploy/Dockerfile) on the local Docker engine, and the compose file (deploy/compose.yaml).

The image is built by scripts/build-image.sh from a debootstrapped Debian base (cached tarball, no registry),
then run with host networking and a mounted config that watches the session's real vLLM.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from docker.errors import APIError, ContainerError, NotFound

from tests.support.apitargets import targets
from tests.support.configs import target, watchdog_yaml
from tests.support.docker_engine import (
    container_log,
    remove_container,
    session_labels,
    unique_name,
    wait_exited,
    wait_http,
)
from tests.support.vllm_server import VllmServer, free_port

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
COMPOSE = DEPLOY / "compose.yaml"
UID = 10001  # the image's fixed user (deploy/Dockerfile)
BUILD_TIMEOUT = 1800  # a cold build: debootstrap (~2 min), wheels, install; a warm one takes seconds
HEALTHY_LIMIT = 120.0  # HEALTHCHECK --interval=10s: the first check runs 10 s after the start
SETUP_HINT = "run scripts/setup.sh"


@pytest.fixture(scope="module")
def image(docker_client: Any) -> str:
    """The sidecar image, built (or found cached) by scripts/build-image.sh on the session's engine."""
    if shutil.which("debootstrap") is None:
        pytest.fail(f"debootstrap is missing (the image's base is debootstrapped): {SETUP_HINT}")
    began = time.monotonic()
    out = subprocess.run(
        ["bash", str(ROOT / "scripts" / "build-image.sh")],
        capture_output=True,
        text=True,
        timeout=BUILD_TIMEOUT,
    )
    if out.returncode != 0:
        pytest.fail(f"scripts/build-image.sh failed ({out.returncode}): {out.stderr[-4000:]}")
    tag = out.stdout.strip().splitlines()[-1]
    size = docker_client.images.get(tag).attrs["Size"]
    print(f"image {tag}: built in {time.monotonic() - began:.1f}s, {size / 1e6:.0f} MB")
    return tag


@pytest.fixture
def containers(docker_client: Any) -> Iterator[list[str]]:
    """Names of containers a test starts; removed with their anonymous volumes at teardown."""
    names: list[str] = []
    yield names
    for name in names:
        try:
            docker_client.containers.get(name).remove(force=True, v=True)  # v: its anonymous state volume
        except NotFound:
            pass
        except APIError:  # still dying: the shared helper retries
            remove_container(docker_client, name)


def test_check_passes_on_the_embedded_defaults(docker_client: Any, image: str) -> None:
    """`vllm-watchdog check` inside the image: the embedded defaults and the bundled rules are packaged."""
    out = docker_client.containers.run(
        image,
        ["check"],
        entrypoint=["vllm-watchdog"],
        remove=True,
        network_mode="host",
        labels=session_labels(),
    ).decode()
    assert out.startswith("<embedded defaults>: OK"), out
    assert "site-packages/vllm_watchdog/rules/vllm.rules.yml: OK" in out


def test_py_spy_is_in_the_image(docker_client: Any, image: str) -> None:
    """Incident bundles read vLLM's Python stacks with py-spy, installed in the venv beside the watchdog."""
    out = docker_client.containers.run(
        image,
        ["--version"],
        entrypoint=["/opt/vllm-watchdog/bin/py-spy"],
        remove=True,
        network_mode="host",
        labels=session_labels(),
    ).decode()
    assert out.startswith("py-spy "), out


def test_image_is_small_non_root_and_mounts_no_docker_socket(docker_client: Any, image: str) -> None:
    """Runs as the fixed non-root user, declares the state volume and the health check, holds no socket."""
    cfg = docker_client.images.get(image).attrs["Config"]
    assert cfg["User"] == f"{UID}:{UID}"
    assert list(cfg["Volumes"]) == ["/var/lib/vllm-watchdog"]
    assert cfg["Entrypoint"] == ["/opt/vllm-watchdog/bin/vllm-watchdog", "run"]
    assert cfg["Healthcheck"]["Test"][0] == "CMD"
    assert "STATE_DIRECTORY=/var/lib/vllm-watchdog" in cfg["Env"]
    assert docker_client.images.get(image).attrs["Size"] < 250e6


PING = "import docker; print(docker.from_env(timeout=30).ping())"


def test_docker_socket_works_only_with_its_group(docker_client: Any, image: str) -> None:
    """Mounting the engine's socket is not enough for the non-root user: docker-mode actions also need the
    socket's group id added (compose: group_add), as docs/install.md says."""
    host = os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock")
    assert host.startswith("unix://"), f"the socket test needs a unix socket, not {host}"
    sock = host.removeprefix("unix://")
    options: dict[str, Any] = {
        "entrypoint": ["python", "-c", PING],
        "volumes": [f"{sock}:/var/run/docker.sock"],
        "network_mode": "host",
        "labels": session_labels(),
    }
    name = unique_name("socket")
    try:
        docker_client.containers.run(image, name=name, **options)
        raise AssertionError("the image's user reached the Docker socket without its group")
    except ContainerError as exc:
        assert b"Permission denied" in exc.stderr
    finally:
        remove_container(docker_client, name)
    gid = os.stat(sock).st_gid
    out = docker_client.containers.run(image, remove=True, group_add=[str(gid)], **options)
    assert out.decode().strip() == "True"


def _poll(pred: Callable[[], Any], limit: float, what: str, logs: Callable[[], str]) -> Any:
    deadline = time.monotonic() + limit
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = pred()
            if last:
                return last
        except (httpx.HTTPError, KeyError, IndexError, ValueError) as exc:
            last = exc
        time.sleep(0.5)
    raise AssertionError(f"{what} not within {limit}s (last: {last}); container log: {logs()}")


@pytest.mark.vllm
def test_container_watches_real_vllm_and_stops_cleanly(
    docker_client: Any, image: str, vllm_server: VllmServer, containers: list[str], tmp_path: Path
) -> None:
    """Host network, a mounted config on free ports: /healthz 200, Docker says healthy, the process runs as
    the image's user, it scrapes the real vLLM, its gateway forwards, and SIGTERM stops it with exit 0."""
    api, gw = free_port(), free_port()
    config = tmp_path / "watchdog.yml"
    config.write_text(
        watchdog_yaml(
            target(vllm_server.url),
            port=api,
            token="${VLLM_WATCHDOG_TOKEN}",  # from the container's environment
            state_dir="/var/lib/vllm-watchdog",  # the image's VOLUME
            global_settings=None,  # the default intervals
            rest=f"""
rule_files: ["bundled:vllm.rules.yml", "bundled:gateway.rules.yml"]
gateway: {{listen: 127.0.0.1:{gw}, target: vllm-0}}
include: ["bundled:watchdog.yml"]
""",
        )
    )
    config.chmod(0o644)
    name = unique_name("watchdog-image")
    containers.append(name)
    found = docker_client.containers.run(
        image,
        name=name,
        network_mode="host",
        volumes=[f"{config}:/etc/vllm-watchdog/config.yml:ro"],
        environment={
            "VLLM_WATCHDOG_TOKEN": "image-test-token",
            "VLLM_WATCHDOG_HEALTHZ": f"http://127.0.0.1:{api}/healthz",
        },
        labels=session_labels(),
        detach=True,
    )
    base = f"http://127.0.0.1:{api}"

    def logs() -> str:
        return container_log(docker_client.containers.get(name))

    wait_http(docker_client, name, base + "/healthz", timeout=120)

    def health() -> bool:
        found.reload()
        return bool(found.attrs["State"]["Health"]["Status"] == "healthy")

    _poll(health, HEALTHY_LIMIT, "Docker health status healthy", logs)
    status = (Path("/proc") / str(found.attrs["State"]["Pid"]) / "status").read_text()
    uids = re.search(r"^Uid:\s+(\d+)\s+(\d+)\s+(\d+)\s+(\d+)", status, re.M)
    assert uids and {int(u) for u in uids.groups()} == {UID}, status

    def target_up() -> bool:
        target = targets(httpx.get(base + "/api/v1/targets", timeout=5).json())[0]
        return bool(target["up"])

    _poll(target_up, 60, "the vLLM target up", logs)
    series = httpx.get(
        base + "/api/v1/samples", params={"match": "vllm:num_requests_running"}, timeout=5
    ).json()
    assert series["data"], series  # real vLLM samples in the watchdog's store
    assert httpx.get(f"http://127.0.0.1:{gw}/v1/models", timeout=30).json()["data"][0]["id"] == "tiny-llama"
    mounts = {m["Destination"]: m for m in found.attrs["Mounts"]}
    assert "/var/run/docker.sock" not in mounts and "/run/docker.sock" not in mounts
    state = Path(mounts["/var/lib/vllm-watchdog"]["Source"])  # the image's VOLUME, anonymous here
    assert {p.stat().st_uid for p in state.iterdir()} == {UID}, list(state.iterdir())

    found.stop(timeout=30)  # SIGTERM; SIGKILL only after 30 s
    exited = wait_exited(docker_client, name, timeout=60)
    assert (exited["ExitCode"], exited["OOMKilled"]) == (0, False), logs()
    assert "shutting down" in logs()


# -- deploy/compose.yaml, statically --------------------------------------------------------------


def _compose() -> dict[str, Any]:
    data = yaml.safe_load(COMPOSE.read_text())
    assert isinstance(data, dict)
    return data


def _binds(service: dict[str, Any]) -> list[tuple[str, str]]:
    """(host path, container path) of a service's bind mounts (short syntax); named volumes are skipped."""
    out = []
    for entry in service.get("volumes", []):
        source, target = entry.split(":")[:2]
        if source.startswith((".", "/")):
            out.append((source, target))
    return out


def test_compose_wiring() -> None:
    """Every bind-mounted host path exists in the repository, every named volume is declared, every
    service is on the host network or publishes on 127.0.0.1 only."""
    compose = _compose()
    assert set(compose["services"]) >= {"vllm", "watchdog", "prometheus", "alertmanager", "grafana"}
    for name, service in compose["services"].items():
        for source, _ in _binds(service):
            host = (DEPLOY / source).resolve()
            assert host.is_relative_to(ROOT) and host.exists(), f"{name}: {source} does not exist"
        for entry in service.get("volumes", []):
            source = entry.split(":")[0]
            if not source.startswith((".", "/")):
                assert source in compose["volumes"], f"{name}: volume {source} is not declared"
        if service.get("network_mode") != "host":
            assert all(str(p).startswith("127.0.0.1:") for p in service.get("ports", [])), name
        else:
            assert "ports" not in service, f"{name}: ports are meaningless on the host network"


def test_compose_listeners_bind_loopback() -> None:
    """On the host network each server's own flags keep it on 127.0.0.1."""
    services = _compose()["services"]
    command = " ".join(str(a) for a in services["vllm"]["command"])
    assert "--host 127.0.0.1" in command
    assert "--web.listen-address=127.0.0.1:9090" in services["prometheus"]["command"]
    assert "--web.listen-address=127.0.0.1:9093" in services["alertmanager"]["command"]
    assert "--cluster.listen-address=" in services["alertmanager"]["command"]
    assert services["grafana"]["environment"]["GF_SERVER_HTTP_ADDR"] == "127.0.0.1"
    assert "127.0.0.1:9400" in services["dcgm-exporter"]["command"]
    watchdog = yaml.safe_load((DEPLOY / "watchdog.yml").read_text())
    assert watchdog["listen"].startswith("127.0.0.1:") and watchdog["gateway"]["listen"].startswith(
        "127.0.0.1:"
    )


def test_compose_watchdog_has_no_docker_socket_unless_uncommented() -> None:
    """The watchdog service mounts no Docker socket; the optional mount is there, commented out."""
    service = _compose()["services"]["watchdog"]
    assert not any("docker.sock" in str(v) for v in service.get("volumes", []))
    assert "group_add" not in service
    text = COMPOSE.read_text()
    assert re.search(r"^\s+# - /var/run/docker.sock:/var/run/docker.sock$", text, re.M)
    mounts = dict((t, s) for s, t in _binds(service))
    assert mounts["/etc/vllm-watchdog/config.yml"] == "./watchdog.yml"


def test_compose_watchdog_config_is_valid() -> None:
    """deploy/watchdog.yml passes `vllm-watchdog check`, and its target is the vLLM container's name."""
    env = {**os.environ, "VLLM_WATCHDOG_TOKEN": "compose-test"}
    out = subprocess.run(
        [
            str(Path(sys.executable).parent / "vllm-watchdog"),
            "check",
            "--config",
            str(DEPLOY / "watchdog.yml"),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    config = yaml.safe_load((DEPLOY / "watchdog.yml").read_text())
    assert config["targets"][0]["name"] == _compose()["services"]["vllm"]["container_name"]


def test_compose_prometheus_loads_the_bundled_rules(tmp_path: Path) -> None:
    """`promtool check config` on deploy/prometheus.yml, with its rule_files resolved through the compose
    mount of ../rules: it finds the bundled rule files and every one is valid."""
    if shutil.which("promtool") is None:
        pytest.fail(f"promtool is missing (Debian package prometheus): {SETUP_HINT}")
    mounts = {
        target: (DEPLOY / source).resolve() for source, target in _binds(_compose()["services"]["prometheus"])
    }
    text = (DEPLOY / "prometheus.yml").read_text()
    prom = yaml.safe_load(text)
    for pattern in prom["rule_files"]:
        container_dir = str(Path(pattern).parent)
        assert container_dir in mounts, f"{pattern} is not under a mounted directory"
        text = text.replace(container_dir, str(mounts[container_dir]))
    assert {j["job_name"] for j in prom["scrape_configs"]} >= {"vllm", "vllm-watchdog"}
    (tmp_path / "prometheus.yml").write_text(text)
    out = subprocess.run(
        ["promtool", "check", "config", str(tmp_path / "prometheus.yml")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    found = re.search(r"SUCCESS: (\d+) rule files found", out.stdout + out.stderr)
    assert found and int(found.group(1)) >= 2, out.stdout


def test_compose_alertmanager_config_is_valid() -> None:
    """`amtool check-config` accepts deploy/alertmanager.yml."""
    if shutil.which("amtool") is None:
        pytest.fail(f"amtool is missing (Debian package prometheus-alertmanager): {SETUP_HINT}")
    out = subprocess.run(
        ["amtool", "check-config", str(DEPLOY / "alertmanager.yml")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stdout + out.stderr


def test_compose_grafana_provisioning_matches_the_mounts() -> None:
    """The dashboard provider reads the directory the dashboards are mounted at; the datasource is the
    compose Prometheus on 127.0.0.1:9090."""
    mounts = {
        target: (DEPLOY / source).resolve() for source, target in _binds(_compose()["services"]["grafana"])
    }
    provisioning = mounts["/etc/grafana/provisioning"]
    providers = [
        p
        for f in sorted((provisioning / "dashboards").glob("*.y*ml"))
        for p in yaml.safe_load(f.read_text())["providers"]
    ]
    assert providers, f"no dashboard provider in {provisioning / 'dashboards'}"
    for provider in providers:
        path = Path(provider["options"]["path"])
        mounted = [t for t in mounts if path == Path(t) or Path(t) in path.parents]
        assert mounted, f"provider {provider.get('name')} reads {path}, which compose does not mount"
        host = mounts[mounted[0]] / path.relative_to(mounted[0])
        assert list(host.rglob("*.json")), f"no dashboards in {host}"
    sources = [
        d
        for f in sorted((provisioning / "datasources").glob("*.y*ml"))
        for d in yaml.safe_load(f.read_text())["datasources"]
    ]
    local = ("http://127.0.0.1:9090", "http://localhost:9090")
    assert any(d["type"] == "prometheus" and d["url"].rstrip("/") in local for d in sources), sources
