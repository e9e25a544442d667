"""The known-answer series: one set per target, exported on /metrics (a collector on the daemon's registry)
and written into the sample store under the target's labels, so rules read them as they read the probes'."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from ..store import SampleStore, make_labels
from .checker import KnownAnswers
from .targetstate import OUTCOMES, TargetIntegrity

OK = "vllm_watchdog_known_answer_ok"
DIVERGENCE = "vllm_watchdog_known_answer_divergence"
TOLERANCE = "vllm_watchdog_known_answer_tolerance"
GREEDY = "vllm_watchdog_known_answer_greedy_mismatches"
LAST_CHECK = "vllm_watchdog_known_answer_last_check_timestamp_seconds"
BASELINE = "vllm_watchdog_known_answer_baseline_info"
TOKENS = "vllm_watchdog_known_answer_tokens_total"
CHECKS = "vllm_watchdog_known_answer_checks_total"
_GAUGES = (
    (
        OK,
        "1 if the last known-answer check that could tell found the answers right, 0 if wrong (absent while "
        "learning or unknown).",
    ),
    (DIVERGENCE, "Max |Δ logprob| in nats over every teacher-forced token, last check that could tell."),
    (TOLERANCE, "The divergence in nats above which the answers are wrong."),
    (GREEDY, "Prompts whose greedy tokens differed where the baseline had no near tie, last check."),
    (LAST_CHECK, "Wall-clock time of the last known-answer check that probed the target."),
)
_TARGET_LABELS = ("job", "instance", "target")

Row = tuple[str, Mapping[str, str], float]  # sample name, its own labels (beyond the target's), value


def rows(st: TargetIntegrity, tolerance: float) -> list[Row]:
    """The samples of one target's known-answer state (what is unknown is left out)."""
    out: list[Row] = []
    known = st.known
    if known is not None:
        out.append((OK, {}, 1.0 if known.ok else 0.0))
        if not math.isnan(known.divergence):
            out.append((DIVERGENCE, {}, known.divergence))
        out.append((GREEDY, {}, float(known.greedy_mismatches)))
    out.append((TOLERANCE, {}, tolerance))
    if st.last_check is not None:
        out.append((LAST_CHECK, {}, st.last_check))
    identity = st.identity.key if st.identity is not None else ""
    out.append((BASELINE, {"state": st.state, "identity": identity}, 1.0))
    out.append((TOKENS, {}, float(st.tokens_total)))
    out.extend((CHECKS, {"outcome": o}, float(st.checks.get(o, 0))) for o in OUTCOMES)
    return out


def _tolerance(answers: KnownAnswers, st: TargetIntegrity) -> float:
    return answers.tolerance(st.baseline)


class IntegrityCollector(Collector):
    """The known-answer series of every checked target, for /metrics."""

    def __init__(self, answers: KnownAnswers, labels: Callable[[], Mapping[str, Mapping[str, str]]]) -> None:
        self.answers = answers
        self.labels = labels  # target name -> its series labels (job, instance, target, ...)

    def collect(self) -> Iterator[Metric]:
        """Build every family from the checker's state now."""
        labels = self.labels()
        families: dict[str, GaugeMetricFamily | CounterMetricFamily] = {
            name: GaugeMetricFamily(name, doc, labels=list(_TARGET_LABELS)) for name, doc in _GAUGES
        }
        families[BASELINE] = GaugeMetricFamily(
            BASELINE,
            "1 per target: its baseline's state and identity key.",
            labels=[*_TARGET_LABELS, "state", "identity"],
        )
        families[TOKENS] = CounterMetricFamily(
            TOKENS.removesuffix("_total"),
            "Tokens the known-answer probes cost (prompt and completion).",
            labels=list(_TARGET_LABELS),
        )
        families[CHECKS] = CounterMetricFamily(
            CHECKS.removesuffix("_total"),
            "Known-answer checks by outcome.",
            labels=[*_TARGET_LABELS, "outcome"],
        )
        for name, st in self.answers.targets.items():
            own = labels.get(name)
            if own is None:
                continue
            base = [own.get(k, "") for k in _TARGET_LABELS]
            for sample, extra, value in rows(st, _tolerance(self.answers, st)):
                families[sample].add_metric([*base, *extra.values()], value)
        yield from families.values()


class IntegrityFeed:
    """Writes a target's known-answer samples into the sample store after each check."""

    def __init__(self, store: SampleStore) -> None:
        self.store = store
        self._written: dict[str, set[tuple[str, tuple[tuple[str, str], ...]]]] = {}

    def commit(self, answers: KnownAnswers, name: str, labels: Mapping[str, str], t_ms: int) -> None:
        """Store the target's samples at t_ms; a series no longer known (learning again) goes stale."""
        st = answers.targets.get(name)
        now: set[tuple[str, tuple[tuple[str, str], ...]]] = set()
        for sample, extra, value in rows(st, _tolerance(answers, st)) if st is not None else []:
            key = (sample, tuple(extra.items()))
            now.add(key)
            self.store.append(make_labels(sample, {**labels, **extra}), t_ms, value)
        for sample, extra_items in self._written.get(name, set()) - now:
            self.store.get(make_labels(sample, {**labels, **dict(extra_items)})).mark_stale(t_ms)
        self._written[name] = now
