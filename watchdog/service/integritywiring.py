"""The known-answer checks in the daemon: KnownAnswers built from the config on the monitor's view of each
target, one job per checked target (`integrity:NAME`, at `integrity.interval`), its series into the sample
store after each check (rules read them) and on /metrics. A reload keeps every baseline."""

from __future__ import annotations

import functools
import logging
import math
from collections.abc import Callable, Mapping

import httpx

from ..actions.store.auditlog import AuditLog
from ..config.model import Config
from ..config.targets import TargetConfig
from ..integrity.checker import IntegrityOptions, KnownAnswers, Readiness
from ..integrity.metrics import IntegrityCollector, IntegrityFeed
from ..integrity.verdict import Verdict
from ..sources.monitor import Monitor
from .schedule import Job

log = logging.getLogger(__name__)
OnEvent = Callable[[str, str, Mapping[str, str]], None]
OnVerdict = Callable[[str, Verdict, float], None]


class IntegrityWiring:
    """The daemon's known-answer checks: the checker, its jobs, its store feed and its collector."""

    def __init__(self, config: Config, monitor: Monitor, on_verdict: OnVerdict, on_event: OnEvent) -> None:
        self.monitor = monitor
        self._spare: httpx.AsyncClient | None = None
        options = IntegrityOptions(
            client=self._client,
            readiness=self._readiness,
            state_dir=config.state_dir,
            on_event=on_event,
            on_verdict=on_verdict,
        )
        self.answers = KnownAnswers(config.integrity, options)
        self.feed = IntegrityFeed(monitor.store)
        self.config = config
        self.apply(config)

    def checked(self) -> list[str]:
        """The targets checked: every target whose canary is enabled, while `integrity.enabled`."""
        if not self.config.integrity.enabled:
            return []
        return [name for name, rt in self.monitor.targets.items() if rt.canary is not None]

    def apply(self, config: Config) -> None:
        """Adopt a config (after the monitor did): kept targets keep their baselines."""
        self.config = config
        self.answers.apply(config.integrity, self.checked())

    def jobs(self) -> list[Job]:
        """One job per checked target, at the section's interval."""
        every = self.config.integrity.interval
        return [(f"integrity:{name}", functools.partial(self.check, name), every) for name in self.checked()]

    async def check(self, name: str, now: float) -> None:
        """Check one target and store its series."""
        rt = self.monitor.targets.get(name)
        if rt is None:
            return
        await self.answers.check(rt.config, now)
        self.feed.commit(self.answers, name, rt.labels, math.floor(now * 1000))

    def collector(self) -> IntegrityCollector:
        """The collector of the known-answer series, for the daemon's registry."""
        return IntegrityCollector(
            self.answers, lambda: {n: rt.labels for n, rt in self.monitor.targets.items()}
        )

    def _readiness(self, name: str, now: float) -> Readiness:
        rt = self.monitor.targets.get(name)
        if rt is None:
            return Readiness()
        canary = rt.canary.status.ok if rt.canary is not None else None
        return Readiness(self.monitor.engine_state(name, now), rt.health.status.ok, canary)

    def _client(self, target: TargetConfig) -> httpx.AsyncClient:
        """The target's own client (its TLS and credentials), which the canary uses too."""
        rt = self.monitor.targets.get(target.name)
        if rt is not None:
            return rt.client
        if self._spare is None:  # a verify of a target that is gone meanwhile
            self._spare = self.monitor.client_factory()
        return self._spare

    async def aclose(self) -> None:
        """Close the spare client, if one was made."""
        if self._spare is not None:
            await self._spare.aclose()


def audit_event(store: AuditLog, clock: Callable[[], float]) -> OnEvent:
    """A known-answer event (a model change, a baseline learnt) as an audit row: action `known-answers`."""

    def record(target: str, event: str, details: Mapping[str, str]) -> None:
        reason = ", ".join(f"{k}={v}" for k, v in details.items())
        try:
            store.record(
                "known-answers", "integrity", target, event, details, "succeeded", reason, False, clock()
            )
        except Exception:  # the audit log is best effort here: the check goes on, and the line says why
            log.exception(
                "known answers: cannot record an audit row", extra={"target": target, "event": event}
            )

    return record
