"""Everything after rule evaluation, wired for the daemon: notifiers, runtimes, rails and the remediator."""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable, Coroutine, Sequence
from typing import Any

import httpx

from .actions.power import PowerLimiter
from .actions.readiness import ReadyCheck
from .actions.runtime import Runtime
from .actions.runtimes import build_runtimes
from .actions.state import ActionStore
from .alerting import OutgoingAlert
from .config import Config, TargetConfig
from .notifiers.hub import NotificationHub
from .promql.engine import Engine
from .promql.values import QueryError, Vector
from .remediation import Remediator

log = logging.getLogger(__name__)
ACTIONS_DB = "actions.sqlite"
NOTIFY_DB = "notifications.sqlite"


def _docker_from_env() -> Any:
    import docker  # noqa: PLC0415  # only hosts with docker-mode targets need the engine

    return docker.from_env(timeout=120)


class ActionPlane:
    """Owns the action state database, the notification hub, one runtime per target and the remediator."""

    def __init__(
        self,
        config: Config,
        engine: Callable[[], Engine],
        client_factory: Callable[[], httpx.AsyncClient],
        *,
        nvml: Any | None = None,
        docker_client: Callable[[], Any] = _docker_from_env,
        systemctl: Sequence[str] = ("systemctl",),
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.config = config
        self.engine = engine
        self.clock = clock
        self.docker_client = docker_client
        self.systemctl = tuple(systemctl)
        state = config.state_dir
        if state:
            os.makedirs(state, exist_ok=True)
        self.store = ActionStore(os.path.join(state, ACTIONS_DB) if state else None)
        self.client = client_factory()
        self.hub = NotificationHub(
            config.notifiers,
            os.path.join(state, NOTIFY_DB) if state else None,
            self.client,
            external_url=f"http://{config.listen_host}:{config.listen_port}",
            clock=clock,
        )
        self.power = PowerLimiter(nvml) if config.gpus.nvml and nvml is not None else None
        self.runtimes: dict[str, tuple[TargetConfig, Runtime]] = self._runtimes(config, None)
        self.remediator = Remediator(
            config,
            self.store,
            {k: v[1] for k, v in self.runtimes.items()},
            ReadyCheck(self.client),
            hub=self.hub,
            power=self.power,
            running_requests=self.running_requests,
            clock=clock,
        )
        self._background: set[asyncio.Task[None]] = set()

    def _runtimes(
        self, config: Config, previous: dict[str, tuple[TargetConfig, Runtime]] | None
    ) -> dict[str, tuple[TargetConfig, Runtime]]:
        return build_runtimes(
            config.targets,
            docker_client=self.docker_client,
            state_dir=config.state_dir,
            systemctl=self.systemctl,
            previous=previous,
        )

    def running_requests(self, target: str) -> float | None:
        """The latest vllm:num_requests_running of a target from the sample store; None if unknown."""
        expr = f'sum(vllm:num_requests_running{{instance="{target}"}})'
        try:
            result = self.engine().query(expr, self.clock())
        except QueryError:
            return None
        if not isinstance(result, Vector) or not result:
            return None
        return result[0].value

    def _spawn(self, coro: Coroutine[Any, Any, None], name: str) -> None:
        """Run a coroutine in the background, holding a reference until it ends (aclose cancels it)."""
        task = asyncio.get_running_loop().create_task(coro, name=name)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def start(self) -> None:
        """Reconcile actions a killed watchdog left in flight, then make sure process-mode children run."""
        self._spawn(self._start(), "actions:start")

    async def _start(self) -> None:
        try:
            await self.remediator.reconcile()
            for name, (_, runtime) in self.runtimes.items():
                ensure = getattr(runtime, "ensure_running", None)
                if ensure is not None and not self.store.paused()[0] and await ensure():
                    log.warning("started vLLM (process mode)", extra={"target": name})
        except Exception:
            log.exception("reconciling actions at start-up failed")
        finally:
            self.remediator.reconciled.set()

    def apply(self, config: Config) -> None:
        """A reloaded config: new notifiers, routes and actions; runtimes of unchanged targets are kept."""
        old = self.runtimes
        self.runtimes = self._runtimes(config, old)
        for name, (_, runtime) in old.items():
            if self.runtimes.get(name, (None, None))[1] is not runtime:
                self._spawn(runtime.close(), f"actions:close:{name}")
        self.config = config
        self.hub.update(config.notifiers)
        self.remediator.apply(config, {k: v[1] for k, v in self.runtimes.items()})

    def on_alerts(self, alerts: list[OutgoingAlert], now: float) -> None:
        """Alerts the rule manager decided to send: to the notifiers, and through the routes to actions."""
        if not alerts:
            return
        self.hub.alerts(alerts, now)
        self.remediator.handle(alerts, now)

    async def deliver(self, now: float) -> None:
        """One delivery pass of the notification queues."""
        await self.hub.deliver(now)

    async def tick(self, now: float) -> None:
        """Restores, process supervision and own alerts."""
        if self.remediator.reconciled.is_set():
            await self.remediator.tick(now)

    async def aclose(self) -> None:
        """Stop workers and close clients; never stops a vLLM server."""
        await self.remediator.aclose()
        for task in list(self._background):
            task.cancel()
        for _, runtime in self.runtimes.values():
            await runtime.close()
        await self.hub.aclose()
        await self.client.aclose()
        self.store.close()
