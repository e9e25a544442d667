"""Rule evaluation for the daemon: the embedded engine or a remote Prometheus, feeding one RuleManager."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from ..config.model import Config
from ..notifiers.alert import OutgoingAlert
from ..promql.engine import Engine, vector_query
from ..promql.values import QueryError, QueryFunc, Vector
from ..store import SampleStore
from .alerting import ALERT_METRIC, FOR_STATE_METRIC
from .files import RuleGroup
from .groups import RuleManager, RuleManagerOptions, key_name

if TYPE_CHECKING:
    from ..promql.remote import PrometheusBackend

log = logging.getLogger(__name__)
STATE_FILE = "alerts.json"


@dataclass
class EvaluationStats:
    """Counters for the own /metrics: evaluations per group, failures, and the last duration."""

    evaluations: dict[str, int] = field(default_factory=dict)
    last_duration: dict[str, float] = field(default_factory=dict)
    remote_failures: int = 0


def _always() -> bool:
    return True


def _discard(alerts: list[OutgoingAlert], now: float) -> None:
    """No one to hand alerts to: the outbox is still drained, as a notifier would."""


@dataclass(frozen=True)
class RuleEvaluationOptions:
    """What the daemon hands a RuleEvaluation, every field set at construction: its monotonic clock, whether
    the first scrapes have landed (`ready`), and who takes the alerts to send (`on_alerts`: notifiers and
    routes; firing, re-sent and resolved alerts with the evaluation time)."""

    monotonic: Callable[[], float] = time.perf_counter
    ready: Callable[[], bool] = _always
    on_alerts: Callable[[list[OutgoingAlert], float], None] = _discard


class RuleEvaluation:
    """Owns the query backend and the alert state of the current rule groups."""

    def __init__(
        self,
        config: Config,
        groups: tuple[RuleGroup, ...],
        store: SampleStore,
        options: RuleEvaluationOptions = RuleEvaluationOptions(),
    ) -> None:
        self.store = store
        self.options = options
        self.monotonic = options.monotonic
        self.started = False
        self.stats = EvaluationStats()
        self.last_eval: dict[tuple[str, str], float] = {}
        self.last_trigger: dict[tuple[str, str], float] = {}  # scraped_at of the scrape that last set it off
        self.config = config
        self.groups = groups
        self._written = _outputs(groups)
        self.engine = _engine(store, config)
        self.remote = _remote(config)
        state = Path(config.state_dir) / STATE_FILE if config.state_dir else None
        if state is None:
            log.warning("no state_dir: pending and firing alerts will not survive a restart")
        self.manager = RuleManager(groups, _manager_options(config, self.engine, store, state))

    def apply(self, config: Config, groups: tuple[RuleGroup, ...]) -> None:
        """Take a reloaded config; alert state carries over to rules that stay the same."""
        self.engine = _engine(self.store, config)
        if config.rule_backend != self.config.rule_backend:
            if self.remote is not None:
                self.remote.close()
            self.remote = _remote(config)
        self.config, self.groups = config, groups
        self._written = _outputs(groups)
        self.manager.update(groups, _manager_options(config, self.engine, self.store, None))

    def state_write_errors(self) -> dict[str, int]:
        """Failed writes of the alert state file, by its name in state_dir."""
        return {STATE_FILE: self.manager.persistence_errors}

    def group_keys(self) -> list[tuple[str, str]]:
        """(file, name) of every group, in file order."""
        return list(self.manager.group_keys())

    def interval(self, key: tuple[str, str]) -> float:
        """How often a group is evaluated."""
        return float(self.manager.interval(key))

    def after_scrape(self, now: float, scraped_at: float | None = None) -> None:
        """Embedded backend: evaluate, right after a scrape, every group that is due.

        This is what makes detection sub-second: a group waits for fresh samples instead of running on a
        phase of its own, which would add up to one more interval between a scrape and the evaluation that
        sees it. A group is due when the scrape that just landed started (`scraped_at`, on the schedule) at
        least its interval after the scrape that last set it off, less a tenth of a scrape interval for the
        loop's jitter: with one target every scrape sets off a group whose interval is the scrape interval,
        and with many targets spread over the interval a group still runs once per interval, as in
        Prometheus (a slack of half an interval ran it up to twice as often).
        """
        if self.remote is not None:
            return
        started = now if scraped_at is None else scraped_at
        slack = self.config.global_.scrape_interval / 10
        for key in self.manager.group_keys():
            last = self.last_trigger.get(key)
            if last is None or started - last >= self.interval(key) - slack:
                before = self.last_eval.get(key)
                self._evaluate_embedded(key, now)
                if self.last_eval.get(key) != before:  # it ran (not held back before the first scrape)
                    self.last_trigger[key] = started

    async def evaluate(self, key: tuple[str, str], now: float) -> None:
        """The periodic job of one group: remote queries run in threads, state changes stay on the loop.

        With the embedded backend, scrapes drive evaluation (after_scrape); this job only stands in when
        they have not for longer than an interval plus a scrape interval (targets down or hung).
        """
        if self.remote is None:
            last = self.last_eval.get(key)
            if last is not None and now - last < self.interval(key) + self.config.global_.scrape_interval:
                return
            self._evaluate_embedded(key, now)
            return
        self.started = True
        start = self.monotonic()
        answers = await self._prefetch(key, now)
        self.manager.evaluate_group(key, now, query=_answering(answers))
        self._done(key, now, start)

    def _evaluate_embedded(self, key: tuple[str, str], now: float) -> None:
        if not self.started:
            # Right after start-up the store is empty: evaluating now would resolve every restored alert.
            if not self.options.ready():
                return
            self.started = True
        start = self.monotonic()
        with self.engine.shared(self._written):  # the rules write only their own outputs meanwhile
            self.manager.evaluate_group(key, now)
        self._done(key, now, start)

    def _done(self, key: tuple[str, str], now: float, start: float) -> None:
        self.last_eval[key] = now
        self.options.on_alerts(self.manager.alerts_to_send(now), now)
        name = key_name(key)
        self.stats.evaluations[name] = self.stats.evaluations.get(name, 0) + 1
        self.stats.last_duration[name] = self.monotonic() - start

    async def _prefetch(self, key: tuple[str, str], now: float) -> dict[str, Vector | QueryError]:
        """Ask the remote backend every expression of a group concurrently."""
        assert self.remote is not None
        remote = self.remote
        group = next(g for g in self.groups if (g.file, g.name) == key)
        exprs = sorted({r.expr for r in group.rules})

        async def one(expr: str) -> Vector | QueryError:
            try:
                return await asyncio.to_thread(remote.query, expr, now)
            except QueryError as exc:
                self.stats.remote_failures += 1
                return exc

        results = await asyncio.gather(*(one(e) for e in exprs))
        return dict(zip(exprs, results, strict=True))


def _engine(store: SampleStore, config: Config) -> Engine:
    g = config.global_
    return Engine(store, lookback=g.lookback_delta, default_step=g.evaluation_interval)


def _manager_options(
    config: Config, engine: Engine, store: SampleStore, state: Path | None
) -> RuleManagerOptions:
    """The RuleManager's options from a config (on reload, the state file's fields are not read)."""
    g = config.global_
    return RuleManagerOptions(
        vector_query(engine),
        store,
        g.evaluation_interval,
        external_labels=g.external_labels,
        external_url=config.web_external_url,
        runbook_base=config.web_runbook_base_url,
        state_path=state,
    )


def _outputs(groups: tuple[RuleGroup, ...]) -> frozenset[str]:
    """The metric names rules write: every recording rule's, ALERTS and ALERTS_FOR_STATE."""
    recorded = (rule.name for group in groups for rule in group.rules if rule.kind != "alert")
    return frozenset((*recorded, ALERT_METRIC, FOR_STATE_METRIC))


def _answering(answers: dict[str, Vector | QueryError]) -> QueryFunc:
    def query(expr: str, at: float) -> Vector:
        got = answers.get(expr)
        if got is None:
            raise QueryError(f"expression {expr!r} was not prefetched")
        if isinstance(got, QueryError):
            raise got
        return got

    return query


def _remote(config: Config) -> PrometheusBackend | None:
    if config.rule_backend is None:
        return None
    # requests and prometheus-api-client (~0.1 s to import) only where rules go to a remote Prometheus
    from ..promql.remote import backend_for  # noqa: PLC0415

    return backend_for(config.rule_backend)
