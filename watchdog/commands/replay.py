"""Replay: rebuild the sample store from a scrape log and run the rules on a simulated clock.

Recorded scrapes go through the scraper's own commit path (`ScrapeTarget.complete`: aliases, job and
instance labels, synthetic `up`, staleness), probes and NVML readings through the same series the monitor
writes. Each rule group is evaluated every `interval` seconds at a fixed per-group phase; an evaluation at
time T sees every record logged before the first record later than T. State changes are printed as a
timeline, then a summary. Alerts that would be sent are handed to `dispatch` (the seam where routing and
actions will run in dry-run); by default they are dropped.
"""

from __future__ import annotations

import math
import sys
import zlib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import asdict, dataclass, field
from typing import TextIO

from ..config.model import Config
from ..errors import ScrapeError
from ..formats.rfc3339 import format_rfc3339, micros
from ..notifiers.alert import OutgoingAlert
from ..promql.engine import Engine, vector_query
from ..ruler.alerting import AlertState
from ..ruler.files import RuleGroup, store_needs
from ..ruler.groups import GroupKey, RuleManager, RuleManagerOptions, key_name
from ..scrapelog import (
    ForgetRecord,
    GpuRecord,
    ProbeRecord,
    Record,
    ScrapeLogError,
    ScrapeRecord,
    iter_records,
)
from ..sources.gpu import GpuCollector
from ..sources.monitor import GC_SLACK
from ..sources.nvml import NvmlSource
from ..sources.probes import PROBE_SERIES
from ..sources.scrape import ScrapeTarget
from ..store import SampleStore, make_labels

GC_INTERVAL = 15.0
Dispatch = Callable[[float, list[OutgoingAlert]], None]
TARGET_INFO = "vllm_watchdog_target_info"


def _own_labels(job: str, instance: str, labels: Mapping[str, str]) -> dict[str, str]:
    """A target's recorded labels, with `target` added to a recording older than that label."""
    # Such a recording has job "vllm" and the target's name as instance; rules join gateway series on target.
    if job == "vllm" and "target" not in labels:
        return {**labels, "target": instance}
    return dict(labels)


@dataclass(frozen=True)
class Transition:
    """An alert changing state: pending, firing, resolved (was firing), inactive (pending cleared), error."""

    t: float
    group: str
    alertname: str
    labels: tuple[tuple[str, str], ...]
    state: str
    value: float
    detail: str = ""  # how long the state lasted, or the rule's error


@dataclass
class ReplayStats:
    """What a replay read and did."""

    records: dict[str, int] = field(default_factory=dict)
    first: float | None = None
    last: float | None = None
    evaluations: int = 0
    failed_rules: int = 0


class Replayer:
    """Feeds records into a store and evaluates rule groups when simulated time passes their due time."""

    def __init__(
        self, config: Config, groups: tuple[RuleGroup, ...], *, dispatch: Dispatch | None = None
    ) -> None:
        g = config.global_
        self.config = config
        self.store = SampleStore(
            store_needs(groups, g.lookback_delta).max_lookback
            + max(g.scrape_interval, g.evaluation_interval)
            + GC_SLACK
        )
        engine = Engine(self.store, lookback=g.lookback_delta, default_step=g.evaluation_interval)
        self.manager = RuleManager(
            groups,
            RuleManagerOptions(
                vector_query(engine),
                self.store,
                g.evaluation_interval,
                external_labels=g.external_labels,
                state_path=None,
            ),
        )
        self.dispatch = dispatch
        self.stats = ReplayStats()
        self.transitions: list[Transition] = []
        self._targets: dict[tuple[str, str], ScrapeTarget] = {}
        self._gpus: dict[str, GpuCollector] = {}
        self._due: dict[GroupKey, float] = {}
        self._states: dict[tuple[GroupKey, str, tuple[tuple[str, str], ...]], tuple[AlertState, float]] = {}
        self._errors: dict[tuple[GroupKey, str], str | None] = {}
        self._next_gc: float | None = None

    # -- ingest ---------------------------------------------------------------------------------
    def ingest(self, rec: Record) -> None:
        """Apply one record to the store, as the live monitor did."""
        kind = type(rec).__name__.removesuffix("Record").lower()
        self.stats.records[kind] = self.stats.records.get(kind, 0) + 1
        if isinstance(rec, ScrapeRecord):
            target = self._target(rec)
            error = ScrapeError(rec.error or "unknown error", rec.kind) if rec.body is None else None
            target.complete(rec.t, rec.body, error, lambda: rec.duration)
            name = target.extra_labels.get("target")
            if name is not None:  # what the self feed writes about each target, for the rules' joins
                info = {"job": rec.job, "instance": rec.instance, "target": name}
                self.store.append(make_labels(TARGET_INFO, info), math.floor(rec.t * 1000), 1.0)
        elif isinstance(rec, ForgetRecord):
            gone = self._targets.pop((rec.job, rec.instance), None)
            if gone is not None:
                gone.forget(rec.t)
        elif isinstance(rec, ProbeRecord):
            names = PROBE_SERIES.get(rec.probe)
            if names is not None:
                labels = {
                    **_own_labels(rec.job, rec.instance, rec.labels),
                    "job": rec.job,
                    "instance": rec.instance,
                }
                t_ms = math.floor(rec.t * 1000)
                self.store.append(make_labels(names[0], labels), t_ms, 1.0 if rec.ok else 0.0)
                self.store.append(make_labels(names[1], labels), t_ms, rec.latency)
        elif isinstance(rec, GpuRecord):
            gpu = self._gpus.get(rec.instance)
            if gpu is None:
                source = NvmlSource(hostname=rec.instance)  # never opened
                gpu = self._gpus[rec.instance] = GpuCollector(source, self.store, rec.instance)
            gpu.up = rec.up
            gpu.commit([(n, dict(lab), v) for n, lab, v in rec.samples], math.floor(rec.t * 1000), None)

    def _target(self, rec: ScrapeRecord) -> ScrapeTarget:
        key = (rec.job, rec.instance)
        target = self._targets.get(key)
        labels = _own_labels(rec.job, rec.instance, rec.labels)
        if target is not None and target.extra_labels == labels:
            return target
        if target is not None:  # relabelled without a recorded reload: the old series go stale
            target.forget(rec.t)
        g = self.config.global_
        target = self._targets[key] = ScrapeTarget(
            url=f"replay://{rec.job}/{rec.instance}",
            job=rec.job,
            instance=rec.instance,
            store=self.store,
            timeout=g.scrape_timeout,
            **asdict(g.limits),  # the label and series limits too: replay fails what the run failed
            extra_labels=labels,
        )
        return target

    # -- the simulated clock --------------------------------------------------------------------
    def start(self, t: float) -> None:
        """Schedule every group's first evaluation at or after t, at the group's fixed phase."""
        for key in self.manager.group_keys():
            interval = self.manager.interval(key)
            phase = (zlib.crc32(key_name(key).encode()) % 1000) / 1000 * interval
            self._due[key] = math.ceil((t - phase) / interval) * interval + phase
        self._next_gc = t + GC_INTERVAL

    def advance(self, until: float, *, inclusive: bool = False) -> None:
        """Run every evaluation due before `until` (or at it, when inclusive), in time order."""
        while self._due:
            key, t = min(self._due.items(), key=lambda kv: (kv[1], kv[0]))
            if t > until or (t == until and not inclusive):
                return
            if self._next_gc is not None and self._next_gc <= t:
                self.store.gc(t)
                self._next_gc = t + GC_INTERVAL
            self._evaluate(key, t)
            self._due[key] = t + self.manager.interval(key)

    def _evaluate(self, key: GroupKey, t: float) -> None:
        self.manager.evaluate_group(key, t)
        self.stats.evaluations += 1
        group = key_name(key)
        seen: set[tuple[GroupKey, str, tuple[tuple[str, str], ...]]] = set()
        for rule in self.manager.groups[key].alerting_rules():
            error = rule.status.last_error
            if error != self._errors.get((key, rule.name)) and error is not None:
                self.stats.failed_rules += 1
                self.transitions.append(Transition(t, group, rule.name, (), "error", math.nan, error))
            self._errors[(key, rule.name)] = error
            for alert in rule.active_alerts():
                ident = (key, rule.name, alert.labels)
                seen.add(ident)
                old = self._states.get(ident)
                if old is None or old[0] != alert.state:
                    self._states[ident] = (alert.state, t)
                    self._note(t, group, rule.name, alert.labels, str(alert.state), alert.value)
        for ident in [i for i in self._states if i[0] == key and i not in seen]:
            state, since = self._states.pop(ident)
            done = "resolved" if state == AlertState.FIRING else "inactive"
            self._note(t, group, ident[1], ident[2], done, math.nan, f"after {t - since:g}s")
        outgoing = self.manager.alerts_to_send(t)
        if self.dispatch is not None and outgoing:
            self.dispatch(t, outgoing)

    def _note(
        self,
        t: float,
        group: str,
        name: str,
        labels: tuple[tuple[str, str], ...],
        state: str,
        v: float,
        detail: str = "",
    ) -> None:
        self.transitions.append(Transition(t, group, name, labels, state, v, detail))

    def close(self) -> None:
        """Drop the targets (a replayed target never opened a connection)."""
        self._targets.clear()


def _records(path: str, start: float | None, end: float | None, warmup: float) -> Iterator[Record]:
    for rec in iter_records(path):
        if start is not None and rec.t < start - warmup:
            continue
        if end is not None and rec.t > end:
            return
        yield rec


def feed(
    rp: Replayer,
    input_path: str,
    *,
    start: float | None = None,
    end: float | None = None,
    on_record: Callable[[float], None] | None = None,
) -> None:
    """Feed a recording through `rp` in time order and run every evaluation up to its end (or `end`).

    `on_record(t)` is called before each record at time t is ingested, once every evaluation before t has
    run: whatever it reads from the store then is the state at any time before t. ScrapeLogError if the
    recording is unreadable."""
    for rec in _records(input_path, start, end, rp.store.retention):
        st = rp.stats
        if st.first is None:
            st.first = rec.t
            rp.start(rec.t if start is None else max(start, rec.t))
        st.last = rec.t if st.last is None else max(st.last, rec.t)
        rp.advance(rec.t)
        if on_record is not None:
            on_record(rec.t)
        rp.ingest(rec)
    if rp.stats.last is not None:
        rp.advance(rp.stats.last if end is None else end, inclusive=True)


def run_replay(
    config: Config,
    groups: tuple[RuleGroup, ...],
    input_path: str,
    out: TextIO,
    *,
    start: float | None = None,
    end: float | None = None,
    dispatch: Dispatch | None = None,
    err: TextIO | None = None,
) -> int:
    """Replay a recording through the rules and print the alert timeline; 0 on success, 1 if unreadable."""
    rp = Replayer(config, groups, dispatch=dispatch)
    printed = 0

    def print_new(t: float) -> None:
        nonlocal printed
        printed = print_transitions(rp.transitions, printed, out)

    try:
        feed(rp, input_path, start=start, end=end, on_record=print_new)
    except ScrapeLogError as exc:
        print(f"vllm-watchdog: {exc}", file=err or sys.stderr)
        return 1
    print_transitions(rp.transitions, printed, out)
    summary(rp, out)
    rp.close()
    return 0


def print_transitions(transitions: list[Transition], done: int, out: TextIO) -> int:
    """Print the transitions from index `done` on, one line each; returns how many are printed in all."""
    for tr in transitions[done:]:
        labels = ",".join(f'{k}="{v}"' for k, v in tr.labels if k != "alertname")
        if tr.state == "error":
            print(f"{_when(tr.t)}  error     {tr.alertname}: {tr.detail}  [{tr.group}]", file=out)
            continue
        value = "" if math.isnan(tr.value) else f" value={tr.value:g}"
        detail = f" {tr.detail}" if tr.detail else ""
        print(
            f"{_when(tr.t)}  {tr.state:<9} {tr.alertname}{{{labels}}}{value}{detail}  [{tr.group}]", file=out
        )
    return len(transitions)


def _when(t: float) -> str:
    return format_rfc3339(micros(t) // 1000, fixed=True)  # truncated to the millisecond


def summary(rp: Replayer, out: TextIO) -> None:
    """What was replayed, transitions per alert, and what is active at the end."""
    st = rp.stats
    counts = ", ".join(f"{n} {k}" for k, n in sorted(st.records.items())) or "no records"
    span = f"{_when(st.first)} .. {_when(st.last)}" if st.first is not None and st.last is not None else "-"
    print(f"\nreplayed {counts} over {span}; {st.evaluations} group evaluations", file=out)
    per_alert: dict[str, dict[str, int]] = {}
    for tr in rp.transitions:
        states = per_alert.setdefault(tr.alertname, {})
        states[tr.state] = states.get(tr.state, 0) + 1
    for name, states in sorted(per_alert.items()):
        parts = ", ".join(
            f"{states[s]} {s}" for s in ("pending", "firing", "resolved", "inactive", "error") if s in states
        )
        print(f"  {name}: {parts}", file=out)
    active = [f"{r.name} ({a.state})" for r, a in rp.manager.active_alerts()]
    print(f"active at the end: {', '.join(active) if active else 'none'}", file=out)
