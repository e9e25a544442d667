"""The safety rails: whether an action may run now, decided from the action state database, the action's
config and `now` alone (no clock is read here, so tests replay hours of events in milliseconds).

Rails are checked in this order and the first that blocks gives the verdict:

- paused: an operator paused every action;
- silenced: an active silence matches the alert's labels plus `action` and `target`;
- engine_paused: for an action whose kind is not allowed_while_paused_or_asleep (one that stops the server),
  the target's engine is paused or asleep on purpose (vLLM's /is_paused, /is_sleeping or
  vllm:engine_sleep_state say so; see sources/enginestate): a rule that took the quiet engine for a hung one
  must not restart it, whether or not the rule knows about pauses;
- startup_grace: the target's server started less than `startup_grace` ago and has not been ready since
  (the caller says so: a /health 200 and a canary token sent after the start, the monitor's probes); once
  it was ready, a hang is a hang, and `startup_grace` bounds only a server that never gets ready;
- backoff: after n consecutive failed or rolled-back runs, the next waits `backoff_initial * 2**(n-1)`
  (at most `backoff_max`) after the last failure ended;
- cooldown: the last finished run started less than `cooldown` ago;
- budget: `max_per_window.count` runs started within the sliding `max_per_window.window`;
- crash_loop: the action succeeded and was needed again within `crash_loop_window` of finishing,
  `crash_loop_max` times in a row; it stays refused until an operator resumes (`set_paused(False, ...)`);
- busy: this action, or for one that runs one_at_a_time_per_target any other such action, is running on
  the target.

The rails are one gate of the decision pipeline (gates.py); a later one, state_unwritable (gates.STATE_RAIL),
refuses an action that needs_writable_state, not a dry run, while the state_dir cannot be written (see
statehealth). It is not in RAILS: it needs a write probe, not the store.

Clock jumps: rows carry wall-clock times (they must outlive the process). With no `monotonic` clock the
backoff, cooldown and budget rails compare them with `now` as they are (what tests and replays want). Given
one, a row's age is read off the wall clock once, when the rails first see the row (`observe()`, each tick,
sees new rows within a second), and from then on advances with the monotonic clock: setting the wall clock
back or forward by hours neither blocks an action for hours nor frees a cooldown or budget early. Silences,
the start-up grace and crash loops compare wall-clock times from outside (a silence's end, the server's
start, the alert's start) and follow the wall clock.

A "run" is a real (not dry-run) row that started: running, succeeded, failed or rolled_back. Dry-run rows and
rows that never ran (skipped, would_do, refused) count towards no rail, so a dry run never uses up budget or
cooldown. Rows that did not run still mark when the action was needed: "needed again" after a success is the
earliest need among the later non-dry-run rows of that action and target (a row's need is its `needed_at`,
the trigger's start, if the caller gave one, else when it was written), or this request's own need, counting
only needs at or after the success finished. So an alert that kept firing from before the fix is no new need
when callers pass `needed_at` (the alert's startsAt); without it every later request is one. Manual triggers
obey every rail.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from ...config.durations import format_duration
from ..config import ActionConfig, traits_of
from ..store.actionstore import ActionRecord, ActionStore

RAILS = (
    "paused",
    "silenced",
    "engine_paused",
    "startup_grace",
    "backoff",
    "cooldown",
    "budget",
    "crash_loop",
    "busy",
)
RAN = ("running", "succeeded", "failed", "rolled_back")  # outcomes of rows that started for real
ENDED = ("succeeded", "failed", "rolled_back")
FAILED = ("failed", "rolled_back")
MAX_BACKOFF_STEPS = 64  # more consecutive failures than this cannot lengthen a capped backoff
OBSERVE = 64  # rows observe() looks at: more than any rail reads of one action and target
MAX_AGES = 8192  # row times whose first sight is remembered


@dataclass(frozen=True)
class Verdict:
    """Whether an action may run now; if not, which rail blocks it, why, and when it may (None: unknown)."""

    allowed: bool
    reason: str
    rail: str = ""  # "" or one of RAILS, or gates.STATE_RAIL
    retry_at: float | None = None


ALLOWED = Verdict(True, "no rail blocks the action")


def _ago(now: float, then: float) -> str:
    return format_duration(max(0.0, now - then))


@dataclass(frozen=True)
class _Ask:
    action: ActionConfig
    target: str
    labels: Mapping[str, str]
    now: float
    started: float | None  # when the target's server started
    ready: bool  # the server has been ready since it started
    needed_at: float | None  # when the trigger began
    engine_state: str  # why the engine is paused or asleep on purpose; "" if it is not known to be


class Rails:
    """Decides whether an action may run, from what the store remembers."""

    def __init__(self, store: ActionStore, *, monotonic: Callable[[], float] | None = None) -> None:
        self.store = store
        self.monotonic = monotonic
        self._seen: dict[tuple[int, bool], tuple[float, float]] = {}  # (id, finished) -> (monotonic, age)

    def observe(self, now: float) -> None:
        """Note the newest runs' ages now, so that a wall-clock jump right after cannot change them."""
        if self.monotonic is not None:
            for run in self.store.history(OBSERVE, dry_run=False, outcomes=RAN, steps=False):
                self._since(run, False, now)
                if run.finished_at is not None:
                    self._since(run, True, now)

    def _since(self, run: ActionRecord, finished: bool, now: float) -> tuple[float, float]:
        """(age, anchor) of a run's start (or end): how long ago it was, and the wall time it happened as
        far as durations go (a rail that waits `d` after it allows the action at `anchor + d`)."""
        stamp = run.finished_at if finished and run.finished_at is not None else run.started_at
        if self.monotonic is None:
            return now - stamp, stamp
        mono, key = self.monotonic(), (run.id, finished)
        seen = self._seen.get(key)
        if seen is None:
            if len(self._seen) >= MAX_AGES:  # forget the oldest half (dicts keep insertion order)
                for old in list(self._seen)[: MAX_AGES // 2]:
                    del self._seen[old]
            seen = self._seen[key] = (mono, max(0.0, now - stamp))  # from the future: the clock went back
        age = seen[1] + (mono - seen[0])
        return age, now - age

    def check(
        self,
        action: ActionConfig,
        target: str,
        labels: Mapping[str, str],
        now: float,
        *,
        server_started_at: float | None,
        manual: bool = False,  # only labels the trigger: manual actions obey every rail
        needed_at: float | None = None,
        engine_state: str = "",
        server_ready: bool = False,
    ) -> Verdict:
        """The verdict of the first rail that blocks `action` on `target` now, or ALLOWED. `needed_at` is
        when the trigger began (the alert's startsAt; None: now), as given to the store's begin/record;
        `engine_state` says why the target's engine is paused or asleep on purpose ("" if it is not);
        `server_ready` that the server has been ready since `server_started_at` (no start-up grace then)."""
        ask = _Ask(action, target, labels, now, server_started_at, server_ready, needed_at, engine_state)
        for rail in (
            self._paused,
            self._silenced,
            self._engine_paused,
            self._startup_grace,
            self._backoff,
            self._cooldown,
            self._budget,
            self._crash_loop,
            self._busy,
        ):
            verdict = rail(ask)
            if verdict is not None:
                return verdict
        return ALLOWED

    def budget_left(self, action: ActionConfig, target: str, now: float) -> int | None:
        """How many more runs the budget allows now; None if the action has no budget."""
        if action.max_per_window is None:
            return None
        used = len(self._runs_in_window(action, target, now))
        return max(0, action.max_per_window.count - used)

    def _runs(self, ask: _Ask, limit: int | None, outcomes: Sequence[str]) -> list[ActionRecord]:
        name = ask.action.name
        return self.store.history(limit, ask.target, name, dry_run=False, outcomes=outcomes, steps=False)

    def _runs_in_window(self, action: ActionConfig, target: str, now: float) -> list[ActionRecord]:
        budget = action.max_per_window
        window = budget.window if budget else 0.0
        if self.monotonic is None:
            return self.store.history(
                None,
                target,
                action.name,
                dry_run=False,
                outcomes=RAN,
                started_after=now - window,
                steps=False,
            )
        # Ages, not wall times, decide what is inside the window; only the newest `count` runs can matter.
        newest = self.store.history(
            budget.count if budget else 0, target, action.name, dry_run=False, outcomes=RAN, steps=False
        )
        return [run for run in newest if self._since(run, False, now)[0] < window]

    def _paused(self, ask: _Ask) -> Verdict | None:
        paused, reason, since = self.store.paused()
        if not paused:
            return None
        ago = f" {_ago(ask.now, since)} ago" if since is not None else ""
        return Verdict(False, f"actions were paused{ago}: {reason or 'no reason given'}", "paused")

    def _silenced(self, ask: _Ask) -> Verdict | None:
        subject = {**ask.labels, "action": ask.action.name, "target": ask.target}
        hits = [s for s in self.store.silences(ask.now) if s.matches(subject)]
        if not hits:
            return None
        until = max(s.ends_at for s in hits)
        ids = ", ".join(s.id for s in hits)
        return Verdict(False, f"silenced by {ids} for another {_ago(until, ask.now)}", "silenced", until)

    def _engine_paused(self, ask: _Ask) -> Verdict | None:
        if not ask.engine_state or ask.action.traits.allowed_while_paused_or_asleep:
            return None
        return Verdict(False, ask.engine_state, "engine_paused")

    def _startup_grace(self, ask: _Ask) -> Verdict | None:
        grace = ask.action.startup_grace
        if ask.started is None or ask.ready or ask.now - ask.started >= grace:
            return None
        why = (
            f"the server started {_ago(ask.now, ask.started)} ago and has not been ready since (/health 200 "
            "and a canary token), within its startup grace of "
        )
        return Verdict(False, why + format_duration(grace), "startup_grace", ask.started + grace)

    def _backoff(self, ask: _Ask) -> Verdict | None:
        failures = 0
        last: ActionRecord | None = None
        for run in self._runs(ask, MAX_BACKOFF_STEPS, ENDED):
            if run.outcome not in FAILED:
                break
            failures += 1
            last = last or run
        if last is None or ask.action.backoff_initial <= 0:
            return None
        delay = min(ask.action.backoff_initial * 2.0 ** (failures - 1), ask.action.backoff_max)
        age, ended = self._since(last, True, ask.now)
        if age >= delay:
            return None
        runs = f"{failures} failed run{'s' if failures > 1 else ''} in a row"
        ago = format_duration(max(0.0, age))
        why = f"backoff: {runs}, the last ended {ago} ago; waiting {format_duration(delay)}"
        return Verdict(False, why, "backoff", ended + delay)

    def _cooldown(self, ask: _Ask) -> Verdict | None:
        last = self._runs(ask, 1, ENDED) if ask.action.cooldown > 0 else []
        if not last:
            return None
        age, started = self._since(last[0], False, ask.now)
        if age >= ask.action.cooldown:
            return None
        why = (
            f"in cooldown: the last run ({last[0].outcome}) started {format_duration(max(0.0, age))} ago; "
            f"cooldown {format_duration(ask.action.cooldown)}"
        )
        return Verdict(False, why, "cooldown", started + ask.action.cooldown)

    def _budget(self, ask: _Ask) -> Verdict | None:
        budget = ask.action.max_per_window
        if budget is None:
            return None
        runs = self._runs_in_window(ask.action, ask.target, ask.now)
        if len(runs) < budget.count:
            return None
        # a run is free again when the count-th newest start leaves the window
        until = self._since(runs[budget.count - 1], False, ask.now)[1] + budget.window
        window = format_duration(budget.window)
        why = f"budget used up: {len(runs)} runs in the last {window} (at most {budget.count})"
        return Verdict(False, why, "budget", until)

    def _crash_loop(self, ask: _Ask) -> Verdict | None:
        action = ask.action
        runs = self._runs(ask, action.crash_loop_max, RAN)
        if not runs or runs[0].outcome != "succeeded":
            return None
        paused, _, since = self.store.paused()
        resumed = since if since is not None and not paused else None
        rows = self.store.history(
            None, ask.target, action.name, dry_run=False, after_id=runs[-1].id, steps=False
        )
        current = ask.now if ask.needed_at is None else ask.needed_at
        loops = 0
        for run in runs:  # newest first
            if run.outcome != "succeeded" or run.finished_at is None:
                break
            if resumed is not None and run.started_at < resumed:
                break  # an operator resumed since: the loop was dealt with
            done = run.finished_at
            needs = [r.need_time for r in rows if r.id > run.id and r.need_time >= done]
            need = min(needs) if needs else (current if current >= done else None)
            if need is None or need - done >= action.crash_loop_window:
                break
            loops += 1
        if loops < action.crash_loop_max:
            return None
        why = (
            f"crash loop: needed again within {format_duration(action.crash_loop_window)} of each of its "
            f"last {loops} successful runs; resume actions once the cause is fixed"
        )
        return Verdict(False, why, "crash_loop")

    def _busy(self, ask: _Ask) -> Verdict | None:
        for run in self.store.unfinished():
            if run.target != ask.target or run.dry_run:
                continue
            one_at_a_time = ask.action.traits.one_at_a_time_per_target
            if run.action == ask.action.name or (
                one_at_a_time and traits_of(run.type).one_at_a_time_per_target
            ):
                ago = _ago(ask.now, run.started_at)
                why = f"{run.action} (id {run.id}) is running on {ask.target}, started {ago} ago"
                return Verdict(False, why, "busy")
        return None
