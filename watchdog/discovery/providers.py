"""Every discovery of one config, what each found last, and the effective config they make together.

The daemon looks through each discovery on its own `refresh_interval` (`refresh`), and when the effective
target list changes it applies it as a reload of targets would. A look that fails, or finds more than the
discovery's `max_targets`, keeps the targets of its last good look. Problems are logged when they change,
not at every look.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from ..config.model import Config
from ..config.targets import TargetConfig
from .config import DockerSdConfig, FileSdConfig
from .files import FileDiscovery, Refresh
from .targetset import Dropped, effective_targets

log = logging.getLogger(__name__)


def _docker_from_env() -> Any:
    from ..actions.runtimes.targetruntimes import docker_from_env  # noqa: PLC0415  # what the docker runtimes use

    return docker_from_env()


@dataclass(frozen=True)
class DiscoveryOptions:
    """What the discoveries are wired to: a Docker client factory (the one the docker runtimes use) and the
    wall clock (file_sd's racy-file rule)."""

    docker_client: Callable[[], Any] = _docker_from_env
    clock: Callable[[], float] = time.time


class _Looker(Protocol):
    def refresh(self) -> Refresh | None: ...


@dataclass
class Discovery:
    """One discovery: its config, what looks through it, and its last good targets."""

    sd: FileSdConfig | DockerSdConfig
    looker: _Looker
    targets: tuple[TargetConfig, ...] = ()
    problems: tuple[str, ...] = ()
    failures: int = 0  # looks that failed or were refused (over max_targets)
    busy: asyncio.Lock = field(default_factory=asyncio.Lock)

    @property
    def mechanism(self) -> str:
        """`file_sd` or `docker_sd`."""
        return "file_sd" if isinstance(self.sd, FileSdConfig) else "docker_sd"

    def accept(self, found: Refresh | None) -> bool:
        """Take a look's result; whether the targets changed. Over max_targets the last good ones stay."""
        if found is None:
            self.failures += 1
            return False
        problems = found.problems
        targets = found.targets
        if len(targets) > self.sd.max_targets:
            self.failures += 1
            problems += (
                f"{len(targets)} targets found, more than max_targets ({self.sd.max_targets}): "
                "the last good ones stay",
            )
            targets = self.targets
        if problems != self.problems:
            for problem in problems:
                log.error("discovery problem", extra={"discovery": self.sd.name, "problem": problem})
            if not problems:
                log.info("discovery problems cleared", extra={"discovery": self.sd.name})
        self.problems = problems
        if _fingerprint(targets) == _fingerprint(self.targets):
            return False
        log.info(
            "discovered targets changed",
            extra={"discovery": self.sd.name, "targets": [t.name for t in targets]},
        )
        self.targets = targets
        return True


def _safely(discovery: Discovery) -> Refresh | None:
    """One look; a bug or an answer nobody foresaw (an engine's odd JSON) is a failed look, not a failed
    reload or start-up."""
    try:
        return discovery.looker.refresh()
    except Exception:
        log.exception("discovery look failed", extra={"discovery": discovery.sd.name})
        return None


def _fingerprint(targets: tuple[TargetConfig, ...]) -> list[tuple[TargetConfig, object]]:
    """The targets with what was discovered about each (which the targets' own equality leaves out)."""
    return [(t, t.discovered) for t in sorted(targets, key=lambda t: t.name)]


class TargetDiscovery:
    """The discoveries of the current config and the static config they add to."""

    def __init__(self, config: Config, options: DiscoveryOptions) -> None:
        self.options = options
        self.static = config
        self.discoveries: dict[str, Discovery] = {}
        self.dropped: tuple[Dropped, ...] = ()
        self._build(config)

    def _build(self, config: Config) -> list[Discovery]:
        """Discoveries for the config's entries; an unchanged entry keeps its own (and what it found)."""
        old, self.discoveries, new = self.discoveries, {}, []
        entries: list[FileSdConfig | DockerSdConfig] = [*config.file_sd_configs, *config.docker_sd_configs]
        for sd in entries:
            kept = old.pop(sd.name, None)
            if kept is not None and kept.sd == sd:
                self.discoveries[sd.name] = kept
                continue
            made = Discovery(sd, self._looker(sd))
            self.discoveries[sd.name] = made
            new.append(made)
        for gone in old.values():
            _close(gone)
        return new

    def _looker(self, sd: FileSdConfig | DockerSdConfig) -> _Looker:
        if isinstance(sd, FileSdConfig):
            return FileDiscovery(sd, self.options.clock)
        from .docker import DockerDiscovery  # noqa: PLC0415  # the Docker SDK only where containers are looked for

        return DockerDiscovery(sd, self.options.docker_client)

    def first_look(self) -> None:
        """Look through every discovery once, blocking (at start-up, before the daemon builds its stages,
        so that actions left in flight on a discovered target are reconciled, not dropped)."""
        for discovery in self.discoveries.values():
            discovery.accept(_safely(discovery))
        self._effective()

    async def apply(self, config: Config) -> None:
        """A reloaded config: new or changed discoveries look at once, the others keep what they found."""
        self.static = config
        for discovery in self._build(config):
            await self._look(discovery)

    async def refresh(self, name: str) -> bool:
        """Look through one discovery again (in a thread); whether the effective target list changed."""
        discovery = self.discoveries.get(name)
        if discovery is None:
            return False
        before = self._effective()
        if not await self._look(discovery):
            return False
        return _fingerprint(self._effective()) != _fingerprint(before)

    async def _look(self, discovery: Discovery) -> bool:
        async with discovery.busy:  # a reload's look and the job's never run side by side
            found = await asyncio.to_thread(_safely, discovery)
        if self.discoveries.get(discovery.sd.name) is not discovery:
            return False  # a reload replaced it meanwhile
        return discovery.accept(found)

    def effective(self) -> Config:
        """The static config with every discovered target whose name is free added to its targets."""
        return replace(self.static, targets=self._effective())

    def _effective(self) -> tuple[TargetConfig, ...]:
        found = [(d.sd.name, d.targets) for d in self.discoveries.values()]
        targets, dropped = effective_targets(self.static.targets, found)
        if dropped != self.dropped:
            for d in dropped:
                log.warning(
                    "discovered target dropped",
                    extra={"discovery": d.discovery, "target": d.name, "reason": d.reason},
                )
        self.dropped = dropped
        return targets

    def jobs(self) -> list[tuple[str, float]]:
        """(discovery name, refresh interval) of each discovery, for the daemon's schedule."""
        return [(d.sd.name, d.sd.refresh_interval) for d in self.discoveries.values()]

    def close(self) -> None:
        """Release the Docker clients."""
        for discovery in self.discoveries.values():
            _close(discovery)


def _close(discovery: Discovery) -> None:
    close = getattr(discovery.looker, "close", None)
    if close is not None:
        close()


def with_discovered(config: Config, options: DiscoveryOptions | None = None) -> Config:
    """The config with what its discoveries find in one look each (the commands that scrape once)."""
    if not config.file_sd_configs and not config.docker_sd_configs:
        return config
    discovery = TargetDiscovery(config, options or DiscoveryOptions())
    try:
        discovery.first_look()
        return discovery.effective()
    finally:
        discovery.close()
