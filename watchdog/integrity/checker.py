"""KnownAnswers: the periodic known-answer check of every target, and verify() for the actions.

Per target: learning (no baseline yet: `learn_probes` passes, serial then concurrent, must agree within the
tolerance floor while /health and the canary pass) → learnt (saved under state_dir/integrity) or pinned (the
operator's baseline_file, never relearned). A check runs only while /health passes and the engine is neither
paused nor asleep (a request would wake it), within the target's token budget; a divergence is probed again
at once (`confirm`) before it is reported. A new model identity on a target is a model change: an event, and
a new baseline.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import dataclass
from typing import Any

import httpx

from ..config.targets import TargetConfig
from .baseline import Baseline, BaselineError, check_pinned, load_learnt, save
from .config import IntegrityConfig, KnownPrompt
from .probe import ProbeError, fetch_identity, probe_all
from .prompts import cost_estimate, prompt_digest, prompt_set
from .scoring import PromptScore, compare, noise
from .targetstate import LEARNT, PINNED, TargetIntegrity
from .verdict import Verdict, unknown

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Readiness:
    """What the monitor knows of a target now: whether it may be probed, and learnt from."""

    paused: str = ""  # why the engine is paused or asleep on purpose; "" if nothing says so
    healthy: bool | None = None  # the last /health probe
    canary: bool | None = None  # the last canary


def _no_event(target: str, event: str, details: Mapping[str, str]) -> None:
    return None


def _no_verdict(target: str, verdict: Verdict, now: float) -> None:
    return None


@dataclass(frozen=True)
class IntegrityOptions:
    """How KnownAnswers reaches targets and reports: built once in service/."""

    client: Callable[[TargetConfig], httpx.AsyncClient]  # the target's client (TLS and credentials)
    readiness: Callable[[str, float], Readiness]  # by target name, at `now`
    state_dir: str | None = None  # None: baselines live in memory only
    on_event: Callable[[str, str, Mapping[str, str]], None] = _no_event  # model change, baseline learnt
    on_verdict: Callable[[str, Verdict, float], None] = _no_verdict  # each periodic check's verdict


class KnownAnswers:
    """The known-answer checks of every target: one per daemon, its state kept across reloads."""

    def __init__(self, config: IntegrityConfig, options: IntegrityOptions) -> None:
        self.options = options
        self.targets: dict[str, TargetIntegrity] = {}
        self.config = config
        self.prompts: tuple[KnownPrompt, ...] = ()
        self.pinned: Baseline | None = None
        self.pinned_error = ""
        self.apply(config, ())

    def apply(self, config: IntegrityConfig, names: tuple[str, ...] | list[str]) -> None:
        """Adopt a config and the targets it checks; kept targets keep their baselines (unless the prompts
        they were learnt from changed)."""
        self.config, self.prompts = config, prompt_set(config)
        self.pinned, self.pinned_error = None, ""
        if config.baseline_file is not None:
            try:
                self.pinned = check_pinned(config.baseline_file, self.prompts)
            except BaselineError as exc:
                self.pinned_error = f"pinned baseline unusable: {exc}"
                log.error("known answers: pinned baseline unusable", extra={"error": str(exc)})
        self.targets = {name: self.targets.get(name) or TargetIntegrity() for name in names}
        for st in self.targets.values():
            if st.baseline is not None and (st.state == PINNED or st.baseline.stale_prompts(self.prompts)):
                st.forget_baseline()

    def status(self, target_name: str) -> TargetIntegrity:
        """A target's known-answer state (a fresh one for a target never checked)."""
        return self.targets.get(target_name) or TargetIntegrity()

    def tolerance(self, baseline: Baseline | None) -> float:
        """The tolerance in nats: the configured number, else the baseline's (auto), else the floor."""
        if self.config.tolerance is not None:
            return self.config.tolerance
        return baseline.tolerance if baseline is not None else self.config.tolerance_floor

    def _state(self, name: str) -> TargetIntegrity:
        return self.targets.setdefault(name, TargetIntegrity())

    # -- the periodic check -------------------------------------------------------------------
    async def check(self, target: TargetConfig, now: float) -> Verdict:
        """The periodic check: skipped while paused, asleep, unhealthy or over budget; learns while there is
        no baseline; never raises for target faults."""
        st = self._state(target.name)
        async with st.lock:
            outcome, verdict = await self._bounded(self._check(target, st, now))
        st.last = verdict
        if verdict.ok is not None:
            st.known = verdict
        if outcome != "skipped":
            st.last_check = now
        if outcome:  # a learning step is no check
            st.count(outcome)
            self.options.on_verdict(target.name, verdict, now)
        return verdict

    async def _bounded(self, work: Coroutine[Any, Any, tuple[str, Verdict]]) -> tuple[str, Verdict]:
        """A check within the configured timeout: an error verdict after it."""
        timeout = self.config.timeout
        try:
            return await asyncio.wait_for(work, timeout)
        except asyncio.TimeoutError:
            return "error", unknown(f"check timed out after {timeout:g}s")
        except ProbeError as exc:
            return "error", unknown(str(exc))

    async def _check(self, target: TargetConfig, st: TargetIntegrity, now: float) -> tuple[str, Verdict]:
        """(outcome, verdict): outcome "" for a learning step, which is no check."""
        ready = self.options.readiness(target.name, now)
        why = _not_ready(ready)
        if why:
            st.passes = []  # learning starts again once the engine is back
            return "skipped", unknown(why, self.tolerance(st.baseline))
        client = self.options.client(target)
        baseline = await self._baseline_for(target, st, client)
        if isinstance(baseline, Verdict):
            return "error", baseline
        if baseline is None:
            return "", await self._learn(target, st, client, ready, now)
        cost = sum(s.tokens for s in baseline.scores) or self._estimate()
        if st.spent_in_window(now) + cost > self.config.max_tokens_per_minute:
            return "skipped", unknown("skipped: over max_tokens_per_minute", self.tolerance(baseline))
        verdict = await self._probe(target, st, client, baseline, now, budgeted=True)
        return ("error" if verdict.ok is None else "ok" if verdict.ok else "diverged"), verdict

    def _estimate(self) -> int:
        return sum(cost_estimate(p) for p in self.prompts)

    async def _baseline_for(
        self, target: TargetConfig, st: TargetIntegrity, client: httpx.AsyncClient
    ) -> Baseline | Verdict | None:
        """The baseline to compare with (None: learn one); a Verdict where the check cannot tell."""
        identity = await fetch_identity(client, target, self.config.timeout)
        if st.identity is not None and st.identity.key != identity.key:
            details = {"old": st.identity.key, "new": identity.key, "model": identity.served_name}
            log.warning("known answers: the model changed", extra={"target": target.name, **details})
            self.options.on_event(target.name, "model_changed", details)
            st.forget_baseline()
        st.identity = identity
        if self.pinned_error:
            return unknown(self.pinned_error)
        if self.pinned is not None:
            st.state, st.baseline = PINNED, self.pinned
            if self.pinned.identity.key != identity.key:
                return unknown(
                    f"the pinned baseline is for model {self.pinned.identity.key}, not {identity.key}"
                )
            return self.pinned
        if st.baseline is None:
            learnt = load_learnt(self.options.state_dir, identity.key)
            if learnt is not None and not learnt.stale_prompts(self.prompts):
                st.baseline, st.state = learnt, LEARNT
        return st.baseline

    async def _pass(
        self,
        target: TargetConfig,
        st: TargetIntegrity,
        client: httpx.AsyncClient,
        now: float,
        concurrent: bool,
    ) -> tuple[PromptScore, ...]:
        assert st.identity is not None
        model = st.identity.served_name
        scores = await probe_all(client, target, model, self.prompts, self.config.timeout, concurrent)
        st.spend(now, scores)
        return scores

    async def _probe(
        self,
        target: TargetConfig,
        st: TargetIntegrity,
        client: httpx.AsyncClient,
        baseline: Baseline,
        now: float,
        budgeted: bool,
    ) -> Verdict:
        """Probe and compare; a divergence is probed again (confirm) before it is reported."""
        tolerance = self.tolerance(baseline)
        verdict = compare(baseline.scores, await self._pass(target, st, client, now, False), tolerance)
        if verdict.ok is not False or not self.config.confirm:
            return verdict
        cost = sum(s.tokens for s in baseline.scores)
        if budgeted and st.spent_in_window(now) + cost > self.config.max_tokens_per_minute:
            return unknown(f"unconfirmed ({verdict.reason}): the confirming probe is over budget", tolerance)
        again = compare(baseline.scores, await self._pass(target, st, client, now, False), tolerance)
        if again.ok:
            log.info("known answers: a divergence was not confirmed", extra={"target": target.name})
            return again
        return Verdict(
            False,
            max(verdict.divergence, again.divergence),
            tolerance,
            again.greedy_mismatches,
            f"confirmed: {again.reason}",
        )

    async def _learn(
        self,
        target: TargetConfig,
        st: TargetIntegrity,
        client: httpx.AsyncClient,
        ready: Readiness,
        now: float,
    ) -> Verdict:
        """One learning step: as many passes as the budget allows, serial and concurrent in turn; once
        `learn_probes` agree within the tolerance floor, the baseline."""
        cfg = self.config
        if ready.canary is not True:
            st.passes = []
            return unknown("learning: waiting for the canary to pass")
        cost = self._estimate() if not st.passes else sum(s.tokens for s in st.passes[0])
        while len(st.passes) < cfg.learn_probes:
            if st.spent_in_window(now) + cost > cfg.max_tokens_per_minute:
                break
            st.passes.append(await self._pass(target, st, client, now, concurrent=len(st.passes) % 2 == 1))
        n = len(st.passes)
        if n < cfg.learn_probes:
            return unknown(f"learning: {n} of {cfg.learn_probes} probes")
        measured = noise(st.passes)
        if measured > cfg.tolerance_floor:
            st.passes = []
            details = {"noise": f"{measured:.4g}", "floor": f"{cfg.tolerance_floor:g}"}
            log.warning("known answers: learning probes disagree", extra={"target": target.name, **details})
            self.options.on_event(target.name, "learning_disagreed", details)
            return unknown(f"learning: probes disagree by {measured:.4g} nats; learning again")
        return self._learnt(target, st, measured, now)

    def _learnt(self, target: TargetConfig, st: TargetIntegrity, measured: float, now: float) -> Verdict:
        assert st.identity is not None
        baseline = Baseline(
            identity=st.identity,
            scores=st.passes[0],
            digests={p.name: prompt_digest(p) for p in self.prompts},
            noise=measured,
            tolerance=max(self.config.tolerance_floor, 4 * measured),
            learnt_at=now,
        )
        st.baseline, st.state, st.passes = baseline, LEARNT, []
        if self.options.state_dir is not None:
            try:
                save(self.options.state_dir, baseline)
            except OSError as exc:
                log.error(
                    "known answers: cannot save the baseline",
                    extra={"target": target.name, "error": str(exc)},
                )
        details = {
            "identity": st.identity.key,
            "noise": f"{measured:.4g}",
            "tolerance": f"{baseline.tolerance:.4g}",
        }
        log.info("known answers: baseline learnt", extra={"target": target.name, **details})
        self.options.on_event(target.name, "baseline_learnt", details)
        return unknown(f"baseline learnt (noise {measured:.4g} nats)", baseline.tolerance)

    # -- on demand ----------------------------------------------------------------------------
    async def verify(self, target: TargetConfig, now: float) -> Verdict:
        """Probe now, confirmed, without a budget (after a restart, relaunch or wake-up); never learns: ok is
        None where there is no baseline to compare with."""
        st = self._state(target.name)
        async with st.lock:
            _, verdict = await self._bounded(self._verify(target, st, now))
        return verdict

    async def _verify(self, target: TargetConfig, st: TargetIntegrity, now: float) -> tuple[str, Verdict]:
        client = self.options.client(target)
        baseline = await self._baseline_for(target, st, client)
        if isinstance(baseline, Verdict):
            return "error", baseline
        if baseline is None:
            return "error", unknown("no known-answer baseline to compare with yet")
        return "", await self._probe(target, st, client, baseline, now, budgeted=False)


def _not_ready(ready: Readiness) -> str:
    """Why a target must not be probed now; "" if it may."""
    if ready.paused:
        return f"skipped: engine {ready.paused}"
    if ready.healthy is not True:
        return "skipped: /health is not passing"
    return ""
