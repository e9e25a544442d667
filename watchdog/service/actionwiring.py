"""The parts of the action plane, each built from the config and the plane's options: the state health, the
action store, the notification hub, the GPU power limiter, the gateway's control and the fleet budget."""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import httpx

from ..actions.pipeline.quarantines import no_answer_check
from ..actions.runtimes.power import PowerLimiter
from ..actions.runtimes.targetruntimes import docker_from_env
from ..actions.store.actionstore import ACTIONS_DB, ActionStore
from ..config.model import Config
from ..config.targets import TargetConfig
from ..fleet.budget import FleetBudget, FleetOptions
from ..gateway.config import GatewayConfig
from ..gateway.control.handle import GatewayControl, GatewayControlOptions, queue_time_query
from ..gateway.control.process import process_link
from ..gateway.protocol.link import GatewayLink
from ..integrity.verdict import Verdict
from ..notifiers.hub import HubOptions, NotificationHub
from ..promql.engine import Engine
from ..statehealth import StateHealth

NOTIFY_DB = "notifications.sqlite"


def _not_paused(target: str, now: float) -> str:
    return ""


def _never_ready(target: str, started: float) -> bool:
    return False


def _no_alerts() -> Sequence[Mapping[str, Any]]:
    return ()


@dataclass(frozen=True)
class ActionPlaneOptions:
    """What an ActionPlane is wired to: the rule engine it queries, HTTP clients, NVML, Docker, systemctl, the
    clocks, how it reaches a gateway process, and the monitor's view of each engine."""

    engine: Callable[[], Engine]  # the current one: a reload replaces it
    client_factory: Callable[..., httpx.AsyncClient]  # (settings, tls) for endpoints with TLS settings
    nvml: Any | None = None
    docker_client: Callable[[], Any] = docker_from_env
    systemctl: tuple[str, ...] = ("systemctl",)
    clock: Callable[[], float] = time.time
    monotonic: Callable[[], float] = time.monotonic
    gateway_link: Callable[[GatewayConfig, str | None], GatewayLink] = process_link
    # Why a target's engine is paused or asleep on purpose ("" if it is not): the monitor's view.
    engine_state: Callable[[str, float], str] = _not_paused
    # Whether a target's server was ready (health and canary) since it started at a time: ends the grace.
    ready_since: Callable[[str, float], bool] = _never_ready
    firing: Callable[[], Sequence[Mapping[str, Any]]] = _no_alerts  # the alerts now, for incident bundles
    # The known answers, checked after a restart or relaunch before it undrains (KnownAnswers.verify).
    verify_answers: Callable[[TargetConfig, float], Awaitable[Verdict]] = no_answer_check


def fleet_member(config: Config) -> str:
    """This watchdog's name in its fleet group: `fleet.member`, else <hostname>:<API port>."""
    assert config.fleet is not None
    return config.fleet.member or f"{socket.gethostname()}:{config.listen_port}"


def state_health(config: Config, monotonic: Callable[[], float]) -> StateHealth | None:
    """The state_dir's health, checked once now; None without a state_dir. An unwritable state_dir must not
    stop monitoring: the stores fall back to memory, and disruptive actions are refused until it can be
    written (see statehealth)."""
    health = StateHealth(config.state_dir) if config.state_dir else None
    if health is not None:
        health.check(monotonic())
    return health


def action_store(
    config: Config, health: StateHealth | None, on_drain: Callable[[str, bool], None]
) -> ActionStore:
    """The action state database in state_dir (in memory without one)."""
    state = config.state_dir
    return ActionStore(os.path.join(state, ACTIONS_DB) if state else None, health=health, on_drain=on_drain)


def notification_hub(
    config: Config, client: httpx.AsyncClient, health: StateHealth | None, options: ActionPlaneOptions
) -> NotificationHub:
    """The notifiers with their queues in state_dir, and the config's external labels."""
    state = config.state_dir
    hub = NotificationHub(
        config.notifiers,
        HubOptions(
            client,
            os.path.join(state, NOTIFY_DB) if state else None,
            external_url=config.web_external_url,
            clock=options.clock,
            state_health=health,
            tls_client=lambda tls: options.client_factory(None, tls),
        ),
    )
    hub.external_labels = config.global_.external_labels
    return hub


def power_limiter(config: Config, nvml: Any | None) -> PowerLimiter | None:
    """The GPU power limiter when NVML is on and loaded."""
    return PowerLimiter(nvml) if config.gpus.nvml and nvml is not None else None


def gateway_control(
    config: Config,
    store: ActionStore,
    options: ActionPlaneOptions,
    query_value: Callable[[str], float | None],
) -> GatewayControl | None:
    """The daemon's handle on the gateway process, if the config has a gateway."""
    if config.gateway is None:
        return None
    query = queue_time_query(config.gateway.target)
    return GatewayControl(
        config.gateway,
        GatewayControlOptions(
            options.gateway_link(config.gateway, config.state_dir),
            store,
            clock=options.clock,
            monotonic=options.monotonic,
            queue_time=lambda: query_value(query),
        ),
    )


def fleet_budget(config: Config, options: ActionPlaneOptions) -> FleetBudget | None:
    """The disruption budget shared with the fleet group, if the config has a `fleet:` section."""
    if config.fleet is None:
        return None
    return FleetBudget(
        config.fleet,
        FleetOptions(
            fleet_member(config),
            clock=options.clock,
            monotonic=options.monotonic,
            runbook_base=config.web_runbook_base_url,
        ),
    )
