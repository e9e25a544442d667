"""What the daemon builds beside its stages: the NVML module, the gateway link of an external gateway, the
scrape log of `run --record`, and the registry of its own metrics with the self feed that writes them."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

from prometheus_client import CollectorRegistry, ProcessCollector

from ..discovery.metrics import DiscoveryCollector
from ..discovery.providers import TargetDiscovery
from ..fdlimits import FdReserve
from ..gateway.config import GatewayConfig
from ..gateway.control.metrics import GatewayCollector
from ..gateway.control.process import process_link
from ..gateway.protocol.link import GatewayLink
from ..listener import Listener
from ..ruler.evaluation import RuleEvaluation
from ..scrapelog import ScrapeLog
from ..sources.monitor import Monitor
from ..sources.nvmlexport import NvmlExport
from ..sources.selffeed import SelfFeed
from .actionmetrics import ActionCollector
from .actionplane import ActionPlane
from .selfmetrics import DaemonCounters, FdCollector, ListenerCollector, own_collectors


def nvml_module(given: Any | None) -> Any | None:
    """The NVML module for gpu_power_limit: the injected one (tests), else pynvml if installed."""
    if given is not None:
        return given
    try:
        import pynvml  # noqa: PLC0415 - lazy: the package works without a GPU stack
    except ImportError:
        return None
    return pynvml


def attach_only(gateway: GatewayConfig, state_dir: str | None) -> GatewayLink:
    """A link to a gateway process that systemd or compose runs: attach to it, never start or stop it."""
    return process_link(replace(gateway, supervise=False), state_dir)


def scrape_log(path: str | None, max_bytes: int, keep: int, clock: Callable[[], float]) -> ScrapeLog | None:
    """The scrape log `run --record` writes (None without --record)."""
    return None if path is None else ScrapeLog(path, max_bytes=max_bytes, keep=keep, clock=clock)


def own_metrics(
    mon: Monitor,
    counters: DaemonCounters,
    evaluation: RuleEvaluation,
    actions: ActionPlane,
    api_listener: Callable[[], Listener],
    fd_guard: FdReserve,
    discovery: TargetDiscovery,
) -> tuple[CollectorRegistry, SelfFeed]:
    """The registry /metrics shows, and the self feed that writes the own metrics rules read to the store."""
    config = mon.config
    registry = CollectorRegistry(auto_describe=False)
    own = (
        *own_collectors(mon, counters, evaluation, actions.health),
        ActionCollector(actions),
    )
    for collector in own:
        registry.register(collector)
    host = f"[{config.listen_host}]" if ":" in config.listen_host else config.listen_host
    self_feed = SelfFeed(mon.store, own, f"{host}:{config.listen_port}", lambda: mon.keep_names)
    registry.register(GatewayCollector(lambda: g.snapshot if (g := actions.gateway) else None))
    registry.register(ListenerCollector("vllm_watchdog_api_", api_listener))
    registry.register(FdCollector(fd_guard))
    registry.register(NvmlExport(lambda: mon.gpu))
    registry.register(DiscoveryCollector(discovery))
    ProcessCollector(registry=registry)  # process_*: CPU, memory and descriptors, as Prometheus exports
    return registry, self_feed
