"""One Runtime per configured target, chosen by how the config says actions reach it."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ...config.targets import TargetConfig
from ...errors import ActionError
from .process import ProcessRuntime
from .runtime import Launch, Runtime
from .systemd import SystemdRuntime

log = logging.getLogger("vllm_watchdog.actions.targetruntimes")  # the name logs have always carried


class UnavailableRuntime:
    """Stands in for a runtime whose backend could not be reached at start-up; every action fails clearly."""

    def __init__(self, kind: str, target: str, reason: str) -> None:
        self.kind = kind
        self.target = target
        self.reason = reason

    def _fail(self) -> ActionError:
        return ActionError(f"{self.kind} runtime for {self.target} is unavailable: {self.reason}")

    async def launch(self) -> Launch:
        """Always fails."""
        raise self._fail()

    async def is_running(self) -> bool:
        """Unknown, so not running."""
        return False

    async def started_at(self) -> float | None:
        """Unknown."""
        return None

    async def stop(self, timeout: float) -> None:
        """Always fails."""
        raise self._fail()

    async def start(self) -> None:
        """Always fails."""
        raise self._fail()

    async def replace(self, launch: Launch, stop_timeout: float) -> None:
        """Always fails."""
        raise self._fail()

    async def has_previous(self) -> bool:
        """Nothing kept."""
        return False

    async def commit(self) -> None:
        """Nothing to do."""

    async def rollback(self, stop_timeout: float) -> None:
        """Always fails."""
        raise self._fail()

    async def close(self) -> None:
        """Nothing to release."""


def docker_from_env() -> Any:
    """A Docker client from the environment (DOCKER_HOST, the local socket)."""
    import docker  # noqa: PLC0415  # only hosts with docker-mode targets need the engine

    return docker.from_env(timeout=120)


def _same(old: TargetConfig, new: TargetConfig) -> bool:
    return (old.container, old.command, dict(old.env), old.unit) == (
        new.container,
        new.command,
        dict(new.env),
        new.unit,
    )


def build_runtimes(
    targets: Sequence[TargetConfig],
    *,
    docker_client: Callable[[], Any],
    state_dir: str | None,
    systemctl: Sequence[str] = ("systemctl",),
    previous: Mapping[str, tuple[TargetConfig, Runtime]] | None = None,
) -> dict[str, tuple[TargetConfig, Runtime]]:
    """Runtimes for the targets that name a container, command or unit; unchanged ones are kept."""
    out: dict[str, tuple[TargetConfig, Runtime]] = {}
    for t in targets:
        old = (previous or {}).get(t.name)
        if old is not None and _same(old[0], t):
            out[t.name] = (t, old[1])
            continue
        runtime = _build(t, docker_client, state_dir, systemctl)
        if runtime is not None:
            out[t.name] = (t, runtime)
    return out


def _build(
    t: TargetConfig, docker_client: Callable[[], Any], state_dir: str | None, systemctl: Sequence[str]
) -> Runtime | None:
    if t.mode == "docker":
        assert t.container is not None
        try:
            client = docker_client()
        except Exception as exc:  # the docker SDK raises DockerException, requests and OS errors
            log.error("Docker engine not reachable", extra={"target": t.name, "error": str(exc)})
            return UnavailableRuntime("docker", t.name, f"Docker engine not reachable: {exc}")
        from .docker import DockerRuntime  # noqa: PLC0415  # the docker SDK (~0.1 s) only for a container target

        return DockerRuntime(t.name, t.container, client)
    if t.mode == "process":
        log_path = os.path.join(state_dir, f"vllm-{t.name}.log") if state_dir else None
        return ProcessRuntime(t.name, t.command, env=dict(t.env), state_dir=state_dir, log_path=log_path)
    if t.mode == "systemd":
        assert t.unit is not None
        return SystemdRuntime(t.name, t.unit, systemctl=systemctl)
    return None
