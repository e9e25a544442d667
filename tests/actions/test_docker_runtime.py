"""DockerRuntime against a real Docker engine, with cheap server containers.

A real vLLM container goes through the same replace, rollback and commit end to end, through a running
watchdog, in tests/actions/test_remediation_docker.py (disable_draft, a flag vLLM rejects, enable_draft)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import docker
import httpx
import pytest
from docker.types import LogConfig, Mount, Ulimit

from tests.support.docker_engine import (
    ServerContainers,
    host_binds,
    remove_container,
    session_labels,
    unique_name,
    wait_exited,
    wait_http,
)
from vllm_watchdog.actions.runtimes.docker import (
    BACKUP_SUFFIX,
    DockerRuntime,
    create_request,
    launch_from_inspect,
)
from vllm_watchdog.actions.runtimes.exits import ExitStatus
from vllm_watchdog.actions.runtimes.runtime import Launch
from vllm_watchdog.errors import ActionError, RefusedError

pytestmark = pytest.mark.anyio

SPEC_CONFIG = '{"method":"ngram","num_speculative_tokens":4,"prompt_lookup_max":4}'


def rich(tmp_path: Path) -> dict[str, Any]:
    """Options for `ServerContainers.run` that set nearly every container setting Docker has."""
    (tmp_path / "data").mkdir(exist_ok=True)
    return {
        "environment": {"MODE": "rich", "HF_HUB_OFFLINE": "1"},
        "volumes": [*host_binds(), f"{tmp_path / 'data'}:/data:rw"],
        "mounts": [Mount("/mnt/cache", str(tmp_path), type="bind", read_only=True)],
        "labels": session_labels(role="rich"),
        "working_dir": "/usr",
        "user": "65534:65534",
        "group_add": ["100"],
        "stop_signal": "SIGTERM",
        "healthcheck": {"test": ["CMD", "/usr/bin/true"], "interval": 60 * 10**9, "retries": 3},
        "restart_policy": {"Name": "unless-stopped"},
        "ulimits": [Ulimit(name="nofile", soft=4096, hard=8192)],
        "shm_size": "128m",
        "cap_add": ["SYS_NICE"],
        "cap_drop": ["MKNOD"],
        "security_opt": ["no-new-privileges"],
        "init": True,
        "ipc_mode": "host",
        "extra_hosts": {"watchdog.test": "127.0.0.1"},
        "tmpfs": {"/scratch": "size=16m"},
        "read_only": True,
        "mem_limit": "512m",
        "pids_limit": 256,
        "oom_score_adj": 100,
        "log_config": LogConfig(type="json-file", config={"max-size": "1m"}),
    }


def answer(port: int) -> dict[str, Any]:
    """What the small server (or vLLM's /health) says."""
    return dict(httpx.get(f"http://127.0.0.1:{port}/", timeout=10).json())


def same_but_cmd(before: dict[str, Any], after: dict[str, Any]) -> None:
    """Every setting of two containers is the same apart from Cmd (compared key by key, for a readable failure)."""
    for section in ("Config", "HostConfig"):
        keys = set(before[section]) | set(after[section])
        differ = {
            k: (before[section].get(k), after[section].get(k))
            for k in keys
            if k != "Cmd" and before[section].get(k) != after[section].get(k)
        }
        assert differ == {}, f"{section} differs: {differ}"
    for key in ("Image", "Name", "Path", "Driver"):
        assert before[key] == after[key], key

    def mounts(attrs: dict[str, Any]) -> list[tuple[Any, ...]]:
        return sorted((m["Type"], m.get("Source"), m["Destination"], m["RW"]) for m in attrs["Mounts"])

    assert mounts(before) == mounts(after)


# -- pure functions ------------------------------------------------------------------------------


def test_launch_from_a_compose_style_inspect_recreates_networks_and_volumes() -> None:
    cid = "0123456789ab" + "c" * 52
    attrs = {
        "Id": cid,
        "Name": "/vllm",
        "Image": "sha256:" + "e" * 64,
        "Config": {
            "Hostname": cid[:12],
            "Image": "vllm/vllm-openai:v0.8.5",
            "Cmd": ["--model", "m", "--speculative-config", SPEC_CONFIG],
            "Env": ["A=1"],
            "Volumes": {"/root/.cache": {}},
        },
        "HostConfig": {"NetworkMode": "proj_default", "Binds": ["/models:/models:ro"], "Mounts": None},
        "Mounts": [
            {"Type": "bind", "Source": "/models", "Destination": "/models", "RW": False},
            {"Type": "volume", "Name": "f" * 64, "Destination": "/root/.cache", "RW": True},
        ],
        "NetworkSettings": {
            "Networks": {
                "proj_default": {"Aliases": ["vllm", cid[:12]], "IPAMConfig": None, "Links": None},
                "monitoring": {"Aliases": ["vllm-metrics"], "IPAMConfig": {"IPv4Address": ""}},
            }
        },
    }
    launch = launch_from_inspect(attrs)
    assert launch.args == ("--model", "m", "--speculative-config", SPEC_CONFIG)
    assert Launch.from_json(launch.to_json()) == launch
    body, extra = create_request(launch.with_args(["--model", "m"]), "sha256:" + "e" * 64)
    assert body["Cmd"] == ["--model", "m"]
    assert "Hostname" not in body  # Docker's default hostname is the old id: the new one gets its own
    assert body["Env"] == ["A=1"]
    assert body["HostConfig"]["Binds"] == ["/models:/models:ro"]
    assert body["HostConfig"]["Mounts"] == [
        {"Type": "volume", "Source": "f" * 64, "Target": "/root/.cache", "ReadOnly": False}
    ]
    endpoint = body["NetworkingConfig"]["EndpointsConfig"]["proj_default"]
    assert endpoint["Aliases"] == ["vllm"]
    assert list(extra) == ["monitoring"]
    assert extra["monitoring"]["Aliases"] == ["vllm-metrics"]
    # Sharing another container's network namespace: Docker refuses a hostname of our own.
    shared = {
        **attrs,
        "HostConfig": {"NetworkMode": "container:gateway"},
        "Config": {"Hostname": "gw", "Cmd": []},
    }
    body, extra = create_request(launch_from_inspect(shared), "img")
    assert "Hostname" not in body and "NetworkingConfig" not in body and extra == {}


# -- cheap server containers -------------------------------------------------------------------------


async def test_launch_captures_the_container(
    server_containers: ServerContainers, docker_client: Any, tmp_path: Path
) -> None:
    name, port = server_containers.run(**rich(tmp_path))
    runtime = DockerRuntime("t", name, docker_client)
    launch = await runtime.launch()
    attrs = server_containers.inspect(name)
    assert launch.kind == "docker"
    assert launch.args == ("--port", str(port), "--flavour", "a")
    assert launch.data["container"] == name
    assert launch.data["image_id"] == attrs["Image"]
    assert launch.data["host_config"] == attrs["HostConfig"]
    assert Launch.from_json(launch.to_json()) == launch
    assert await runtime.is_running()
    assert not await runtime.has_previous()


async def test_stop_and_start(server_containers: ServerContainers, docker_client: Any) -> None:
    name, port = server_containers.run()
    runtime = DockerRuntime("t", name, docker_client)
    assert await runtime.started_at() is not None
    await runtime.stop(5)
    assert not await runtime.is_running()
    assert await runtime.started_at() is None
    await runtime.stop(5)  # stopped already: no-op
    before = time.time()
    await runtime.start()
    await runtime.start()  # running already: no-op
    assert await runtime.is_running()
    started = await runtime.started_at()
    assert started is not None and started >= before - 1  # the engine and this process share a clock
    wait_http(docker_client, name, f"http://127.0.0.1:{port}/", timeout=60)


async def test_replace_keeps_every_setting_and_commit_drops_the_old(
    server_containers: ServerContainers, docker_client: Any, tmp_path: Path
) -> None:
    name, port = server_containers.run(**rich(tmp_path))
    original = server_containers.inspect(name)
    runtime = DockerRuntime("t", name, docker_client)
    launch = await runtime.launch()
    new_args = ["--port", str(port), "--flavour", "b"]
    await runtime.replace(launch.with_args(new_args), stop_timeout=5)
    wait_http(docker_client, name, f"http://127.0.0.1:{port}/", timeout=60)
    assert answer(port) == {"args": new_args, "mode": "rich"}
    replaced = server_containers.inspect(name)
    assert replaced["Id"] != original["Id"]
    assert replaced["Config"]["Cmd"] == new_args
    same_but_cmd(original, replaced)
    assert await runtime.has_previous()
    kept = server_containers.inspect(name + BACKUP_SUFFIX)
    assert kept["Id"] == original["Id"]
    assert not kept["State"]["Running"]
    assert kept["HostConfig"] == original["HostConfig"]  # only its name changed
    await runtime.commit()
    assert not await runtime.has_previous()
    with pytest.raises(docker.errors.NotFound):
        docker_client.containers.get(original["Id"])
    await runtime.commit()  # nothing kept: no-op
    assert answer(port)["args"] == new_args


async def test_failed_replacement_rolls_back_to_the_very_same_container(
    server_containers: ServerContainers, docker_client: Any, tmp_path: Path
) -> None:
    name, port = server_containers.run(**rich(tmp_path))
    original = server_containers.inspect(name)
    runtime = DockerRuntime("t", name, docker_client)
    launch = await runtime.launch()
    await runtime.replace(launch.with_args(["--port", "not-a-port"]), stop_timeout=5)
    state = wait_exited(docker_client, name, timeout=60)
    assert state["ExitCode"] != 0
    await runtime.rollback(stop_timeout=5)
    back = server_containers.inspect(name)
    assert back["Id"] == original["Id"]
    assert back["Config"] == original["Config"]
    assert back["HostConfig"] == original["HostConfig"]
    assert back["State"]["Running"]
    assert not await runtime.has_previous()
    wait_http(docker_client, name, f"http://127.0.0.1:{port}/", timeout=60)
    assert answer(port) == {"args": ["--port", str(port), "--flavour", "a"], "mode": "rich"}
    await runtime.rollback(stop_timeout=5)  # nothing kept: no-op
    assert server_containers.inspect(name)["Id"] == original["Id"]


async def test_crash_after_the_rename_can_be_rolled_back_or_finished(
    server_containers: ServerContainers, docker_client: Any
) -> None:
    name, port = server_containers.run()
    original = server_containers.inspect(name)
    runtime = DockerRuntime("t", name, docker_client)
    launch = await runtime.launch()
    # The watchdog died right after renaming the old container: it still runs under the backup name.
    docker_client.containers.get(name).rename(name + BACKUP_SUFFIX)
    assert await runtime.has_previous()
    assert not await runtime.is_running()
    with pytest.raises(ActionError, match="pending"):
        await runtime.start()
    await runtime.rollback(stop_timeout=5)
    assert server_containers.inspect(name)["Id"] == original["Id"]
    assert answer(port)["args"][-1] == "a"
    # Same crash, but this time the replace is simply asked again: it finishes the job.
    docker_client.containers.get(name).rename(name + BACKUP_SUFFIX)
    await runtime.replace(launch.with_args(["--port", str(port), "--flavour", "b"]), stop_timeout=5)
    wait_http(docker_client, name, f"http://127.0.0.1:{port}/", timeout=60)
    assert answer(port)["args"][-1] == "b"
    assert not server_containers.inspect(name + BACKUP_SUFFIX)["State"]["Running"]
    await runtime.rollback(stop_timeout=5)
    assert server_containers.inspect(name)["Id"] == original["Id"]
    wait_http(docker_client, name, f"http://127.0.0.1:{port}/", timeout=60)
    assert answer(port)["args"][-1] == "a"


async def test_second_replace_keeps_the_first_backup_and_rollback_survives_a_lost_replacement(
    server_containers: ServerContainers, docker_client: Any, tmp_path: Path
) -> None:
    name, port = server_containers.run(**rich(tmp_path))
    original = server_containers.inspect(name)
    runtime = DockerRuntime("t", name, docker_client)
    launch = await runtime.launch()
    await runtime.replace(launch.with_args(["--port", str(port), "--flavour", "b"]), stop_timeout=5)
    await runtime.replace(launch.with_args(["--port", str(port), "--flavour", "c"]), stop_timeout=5)
    wait_http(docker_client, name, f"http://127.0.0.1:{port}/", timeout=60)
    assert answer(port)["args"][-1] == "c"
    assert server_containers.inspect(name + BACKUP_SUFFIX)["Id"] == original["Id"]
    same_but_cmd(original, server_containers.inspect(name))
    # The watchdog died during rollback just after removing the replacement.
    docker_client.containers.get(name).remove(force=True)
    await runtime.rollback(stop_timeout=5)
    back = server_containers.inspect(name)
    assert back["Id"] == original["Id"]
    assert back["HostConfig"] == original["HostConfig"]
    wait_http(docker_client, name, f"http://127.0.0.1:{port}/", timeout=60)
    assert answer(port)["args"][-1] == "a"


async def test_refuses_containers_it_was_not_named(
    server_containers: ServerContainers, docker_client: Any, hostroot_image: str
) -> None:
    unnamed = docker_client.containers.run(
        hostroot_image,
        ["/usr/bin/sleep", "300"],
        volumes=host_binds(),
        network_mode="host",
        labels=session_labels(),
        detach=True,
    )
    try:
        for ref in (unnamed.short_id, unnamed.id, "/" + unnamed.name, "-bad"):
            runtime = DockerRuntime("t", ref, docker_client)
            with pytest.raises(RefusedError):
                await runtime.launch()
            with pytest.raises(RefusedError):
                await runtime.stop(1)
            with pytest.raises(RefusedError):
                await runtime.is_running()
        unnamed.reload()
        assert unnamed.attrs["State"]["Running"]
        # A launch spec taken from another container is not created under this one's name.
        other, _ = server_containers.run()
        name, port = server_containers.run()
        other_launch = await DockerRuntime("o", other, docker_client).launch()
        runtime = DockerRuntime("t", name, docker_client)
        with pytest.raises(RefusedError):
            await runtime.replace(other_launch, stop_timeout=5)
        assert not await runtime.has_previous()
        assert answer(port)["args"][1] == str(port)
    finally:
        unnamed.remove(force=True)


async def test_errors_are_action_errors_and_touch_nothing(
    server_containers: ServerContainers,
    docker_client: Any,
    hostroot_image: str,
) -> None:
    missing = DockerRuntime("t", unique_name("missing"), docker_client)
    assert not await missing.is_running()
    assert await missing.started_at() is None
    assert not await missing.has_previous()
    for call in (missing.launch(), missing.start(), missing.stop(1)):
        with pytest.raises(ActionError, match="no container named"):
            await call
    await missing.commit()
    await missing.rollback(1)

    name, port = server_containers.run(auto_remove=True)
    runtime = DockerRuntime("t", name, docker_client)
    with pytest.raises(ActionError, match="--rm"):
        await runtime.replace(await runtime.launch(), stop_timeout=5)
    assert await runtime.is_running() and not await runtime.has_previous()

    # The image is gone: creating fails, the old one keeps serving until the rollback puts it back.
    name, port = server_containers.run()
    runtime = DockerRuntime("t", name, docker_client)
    launch = await runtime.launch()
    gone = Launch(
        "docker",
        launch.args,
        {**launch.data, "image": "vllm-watchdog/none:0", "image_id": "sha256:" + "0" * 64},
    )
    with pytest.raises(ActionError, match="docker replace"):
        await runtime.replace(gone, stop_timeout=5)
    assert await runtime.has_previous()
    await runtime.rollback(stop_timeout=5)
    assert await runtime.is_running() and not await runtime.has_previous()
    assert answer(port)["args"][1] == str(port)

    unreachable = DockerRuntime(
        "t", name, docker.DockerClient(base_url="unix:///nonexistent/docker.sock", version="1.41")
    )
    with pytest.raises(ActionError, match="no answer from the Docker engine"):
        await unreachable.is_running()
    await unreachable.close()


# The first run writes vLLM's engine-death lines and exits 0 (vLLM #48966); the next exits 0 cleanly.
# It prints a second after it starts, as a vLLM's death line comes long after its start: Docker records a run's
# StartedAt only once the process runs, so a line printed at once can carry an earlier time than the StartedAt
# that `logs(since=)` reads from (CI saw the death line left out).
DIES_THEN_STOPS = """
import os, sys, time
time.sleep(1)
first = not os.path.exists("/w/ran")
open("/w/ran", "w").close()
print("EngineCore encountered a fatal error." if first else "Shutting down FastAPI HTTP server.", flush=True)
"""


async def test_an_exit_0_after_an_engine_death_is_a_crash_docker_leaves_down(
    docker_client: Any, hostroot_image: str, tmp_path: Path
) -> None:
    """Docker's on-failure policy leaves it down; the watchdog respawns it. Only that run's log counts."""
    name = unique_name("dies")
    docker_client.containers.run(
        hostroot_image,
        name=name,
        entrypoint=["/usr/bin/python3", "-c", DIES_THEN_STOPS],
        volumes=[*host_binds(), f"{tmp_path}:/w:rw"],
        network_mode="host",
        labels=session_labels(),
        restart_policy={"Name": "on-failure", "MaximumRetryCount": 3},
        detach=True,
    )
    runtime = DockerRuntime("t", name, docker_client)
    try:
        assert wait_exited(docker_client, name, 60)["ExitCode"] == 0
        status = await runtime.exit_status()
        assert status == ExitStatus(0, "EngineCore encountered a fatal error", respawn=True), status
        docker_client.containers.get(name).start()
        wait_exited(docker_client, name, 60)
        runtime = DockerRuntime("t", name, docker_client)  # a fresh reading, not the last one
        assert await runtime.exit_status() == ExitStatus(0, respawn=False)  # a clean stop, left alone
    finally:
        remove_container(docker_client, name)
