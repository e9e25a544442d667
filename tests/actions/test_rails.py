"""The safety rails, with injected times: hours of action history replayed in milliseconds."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.support.clock import T0
from vllm_watchdog.actions.config import ActionConfig, Budget
from vllm_watchdog.actions.pipeline.rails import RAILS, Rails, Verdict
from vllm_watchdog.actions.store.actionstore import ActionStore

MIN = 60.0
HOUR = 3600.0
TARGET = "gpu0"
ALERT = {"alertname": "VLLMHung", "target": TARGET, "severity": "critical"}
# every rail off unless a test turns it on
QUIET: dict[str, Any] = {
    "cooldown": 0.0,
    "startup_grace": 0.0,
    "backoff_initial": 0.0,
    "crash_loop_max": 10_000,
}


def action(name: str = "restart", kind: str = "restart", **settings: Any) -> ActionConfig:
    return ActionConfig(name=name, type=kind, **(QUIET | settings))


@pytest.fixture
def store() -> Iterator[ActionStore]:
    s = ActionStore(None)
    yield s
    s.close()


def run(
    store: ActionStore,
    act: ActionConfig,
    start: float,
    end: float,
    outcome: str = "succeeded",
    *,
    target: str = TARGET,
    dry_run: bool = False,
) -> int:
    """An action that ran from `start` to `end` (seconds after T0)."""
    aid = store.begin(act.name, act.type, target, "alert:VLLMHung", ALERT, dry_run, T0 + start)
    store.step(aid, "stop", T0 + start)
    store.finish(aid, outcome, T0 + end)
    return aid


def skipped(store: ActionStore, act: ActionConfig, at: float, *, dry_run: bool = False) -> int:
    return store.record(
        act.name, act.type, TARGET, "alert:VLLMHung", ALERT, "skipped", "a rail", dry_run, T0 + at
    )


def check(
    rails: Rails,
    act: ActionConfig,
    at: float,
    *,
    started: float | None = None,
    engine: str = "",
    **labels: str,
) -> Verdict:
    server = None if started is None else T0 + started
    labels = {**ALERT, **labels}
    return rails.check(act, TARGET, labels, T0 + at, server_started_at=server, engine_state=engine)


def test_nothing_blocks_a_first_action(store: ActionStore) -> None:
    verdict = check(Rails(store), action(**{**QUIET, "cooldown": 900.0}), 0.0)
    assert verdict.allowed and verdict.rail == "" and verdict.retry_at is None


def test_paused_and_resumed(store: ActionStore) -> None:
    rails = Rails(store)
    store.set_paused(True, "GPU firmware upgrade", T0)
    verdict = check(rails, action(), 5 * MIN)
    assert (verdict.allowed, verdict.rail) == (False, "paused")
    assert "GPU firmware upgrade" in verdict.reason and "5m" in verdict.reason
    store.set_paused(False, "", T0 + 6 * MIN)
    assert check(rails, action(), 6 * MIN).allowed


def test_silence_matches_alert_labels_action_and_target(store: ActionStore) -> None:
    rails = Rails(store)
    sid = store.add_silence(
        [{"name": "severity", "op": "=", "value": "critical"}], T0, T0 + HOUR, "", "ops", T0
    )
    verdict = check(rails, action(), 10 * MIN)
    assert (verdict.allowed, verdict.rail, verdict.retry_at) == (False, "silenced", T0 + HOUR)
    assert sid in verdict.reason
    assert check(rails, action(), 10 * MIN, severity="warning").allowed
    store.expire_silence(sid, T0 + 20 * MIN)
    assert check(rails, action(), 20 * MIN).allowed
    store.add_silence([{"name": "action", "op": "=~", "value": "rest.*"}], T0, T0 + HOUR, "", "ops", T0)
    store.add_silence([{"name": "target", "op": "!=", "value": TARGET}], T0, T0 + 2 * HOUR, "", "ops", T0)
    assert check(rails, action(), 30 * MIN).rail == "silenced"  # by action name
    assert check(rails, action("shrink", "reconfigure"), 30 * MIN).allowed  # other action, this target
    other = rails.check(action("shrink", "reconfigure"), "gpu1", {}, T0 + 30 * MIN, server_started_at=None)
    assert (other.rail, other.retry_at) == ("silenced", T0 + 2 * HOUR)  # by target


def test_silence_starts_and_expires_by_itself(store: ActionStore) -> None:
    rails = Rails(store)
    store.add_silence([{"name": "alertname", "value": "VLLMHung"}], T0 + HOUR, T0 + 2 * HOUR, "", "ops", T0)
    assert check(rails, action(), HOUR - 0.001).allowed  # still pending
    assert check(rails, action(), HOUR).rail == "silenced"
    assert check(rails, action(), 2 * HOUR - 0.001).rail == "silenced"
    assert check(rails, action(), 2 * HOUR).allowed


def test_overlapping_silences_retry_when_the_last_ends(store: ActionStore) -> None:
    store.add_silence([{"name": "target", "value": TARGET}], T0, T0 + HOUR, "", "a", T0)
    store.add_silence([{"name": "alertname", "value": "VLLMHung"}], T0, T0 + 3 * HOUR, "", "b", T0)
    assert check(Rails(store), action(), MIN).retry_at == T0 + 3 * HOUR


def test_startup_grace(store: ActionStore) -> None:
    rails = Rails(store)
    act = action(startup_grace=120.0)
    verdict = check(rails, act, 10 * MIN + 30, started=10 * MIN)
    assert (verdict.allowed, verdict.rail, verdict.retry_at) == (False, "startup_grace", T0 + 12 * MIN)
    assert check(rails, act, 12 * MIN, started=10 * MIN).allowed
    assert check(rails, act, 10 * MIN, started=None).allowed  # unknown start: no grace
    assert "has not been ready since" in verdict.reason and "startup grace of 2m" in verdict.reason


def test_a_server_ready_since_its_start_has_no_grace_left(store: ActionStore) -> None:
    """The grace protects a server that is still loading; one that was ready (health and a canary token
    after its start) and then froze is hung, and is restarted at once."""
    rails = Rails(store)
    act = action(startup_grace=10 * MIN)
    started = T0 + MIN

    def ready(at: float, server_ready: bool) -> Verdict:
        return rails.check(act, TARGET, ALERT, T0 + at, server_started_at=started, server_ready=server_ready)

    assert ready(2 * MIN, False).rail == "startup_grace"  # still loading: protected
    assert ready(2 * MIN, True).allowed  # ready since its start, then hung: no grace
    assert ready(11 * MIN, False).allowed  # never ready: the fixed grace is the upper bound


def test_backoff_doubles_per_failure_and_caps(store: ActionStore) -> None:
    rails = Rails(store)
    act = action(backoff_initial=60.0, backoff_max=600.0)
    t = 0.0
    expected = [60.0, 120.0, 240.0, 480.0, 600.0, 600.0]
    for delay in expected:
        run(store, act, t, t + 30, "failed" if delay != 240.0 else "rolled_back")
        ended = t + 30
        blocked = check(rails, act, ended + delay - 0.001)
        assert (blocked.rail, blocked.retry_at) == ("backoff", T0 + ended + delay), delay
        assert check(rails, act, ended + delay).allowed
        t = ended + delay
    run(store, act, t, t + 30, "succeeded")  # a success resets the count
    run(store, act, t + 40, t + 50, "failed")
    assert check(rails, act, t + 50 + 59.9).rail == "backoff"
    assert check(rails, act, t + 50 + 60).allowed


def test_backoff_ignores_dry_runs_and_skips(store: ActionStore) -> None:
    rails = Rails(store)
    act = action(backoff_initial=60.0, backoff_max=3600.0)
    run(store, act, 0, 10, "failed")
    run(store, act, 100, 110, "failed", dry_run=True)
    skipped(store, act, 120)
    run(store, act, 200, 210, "failed")
    verdict = check(rails, act, 211)
    assert (verdict.rail, verdict.retry_at) == ("backoff", T0 + 210 + 120)  # two real failures
    assert "2 failed runs in a row" in verdict.reason and verdict.reason.startswith("backoff")


def test_cooldown_counts_from_the_start(store: ActionStore) -> None:
    rails = Rails(store)
    act = action(cooldown=15 * MIN)
    run(store, act, 0, 2 * MIN)
    verdict = check(rails, act, 15 * MIN - 0.001)
    assert (verdict.rail, verdict.retry_at) == ("cooldown", T0 + 15 * MIN)
    assert check(rails, act, 15 * MIN).allowed
    run(store, act, 20 * MIN, 21 * MIN, "failed")
    assert check(rails, act, 25 * MIN).rail == "cooldown"  # a failed run cools down too
    assert check(rails, action("other", cooldown=15 * MIN), 25 * MIN).allowed  # per action
    assert rails.check(act, "gpu1", ALERT, T0 + 25 * MIN, server_started_at=None).allowed  # per target


def test_dry_runs_and_skips_use_no_cooldown_or_budget(store: ActionStore) -> None:
    rails = Rails(store)
    act = action(cooldown=HOUR, max_per_window=Budget(2, 6 * HOUR), backoff_initial=60.0)
    for i in range(10):
        run(store, act, i * MIN, i * MIN + 1, "succeeded", dry_run=True)
        store.record(act.name, act.type, TARGET, "alert", ALERT, "would_do", "", True, T0 + i * MIN + 2)
        skipped(store, act, i * MIN + 3)
        store.record(
            act.name, act.type, TARGET, "alert", ALERT, "refused", "no such container", False, T0 + i * MIN
        )
    assert check(rails, act, 11 * MIN).allowed
    assert rails.budget_left(act, TARGET, T0 + 11 * MIN) == 2


def test_a_dry_run_still_reports_the_rail_that_would_block(store: ActionStore) -> None:
    act = action(cooldown=HOUR)
    run(store, act, 0, MIN)  # a real run, then the action was switched to dry-run
    assert check(Rails(store), act, 10 * MIN).rail == "cooldown"


def test_budget_window_slides(store: ActionStore) -> None:
    rails = Rails(store)
    act = action(max_per_window=Budget(3, 6 * HOUR))
    assert rails.budget_left(act, TARGET, T0) == 3
    assert rails.budget_left(action(), TARGET, T0) is None
    for start in (0.0, HOUR, 2 * HOUR):
        assert check(rails, act, start).allowed
        run(store, act, start, start + MIN)
    assert rails.budget_left(act, TARGET, T0 + 3 * HOUR) == 0
    verdict = check(rails, act, 3 * HOUR)
    assert (verdict.rail, verdict.retry_at) == ("budget", T0 + 6 * HOUR)
    assert check(rails, act, 6 * HOUR - 0.001).rail == "budget"
    assert check(rails, act, 6 * HOUR).allowed  # the run at 0h left the window
    assert rails.budget_left(act, TARGET, T0 + 6 * HOUR) == 1
    run(store, act, 6 * HOUR, 6 * HOUR + MIN, "failed")  # failures use budget too
    assert check(rails, act, 6 * HOUR + 2 * MIN).retry_at == T0 + 7 * HOUR


def test_budget_counts_a_running_action(store: ActionStore) -> None:
    act = action("power", "gpu_power_limit", max_per_window=Budget(1, HOUR))
    store.begin(act.name, act.type, TARGET, "alert", ALERT, False, T0)
    assert Rails(store).budget_left(act, TARGET, T0 + MIN) == 0


@settings(max_examples=60, deadline=None)
@given(
    starts=st.lists(st.integers(min_value=0, max_value=24 * 3600), max_size=12),
    count=st.integers(min_value=1, max_value=5),
    window=st.integers(min_value=60, max_value=12 * 3600),
    now=st.integers(min_value=0, max_value=30 * 3600),
)
def test_budget_matches_a_direct_count(starts: list[int], count: int, window: int, now: int) -> None:
    store = ActionStore(None)
    act = action(max_per_window=Budget(count, float(window)))
    for s in sorted(starts):
        run(store, act, float(s), float(s) + 1)
    inside = sorted((s for s in starts if now - window < s), reverse=True)
    verdict = check(Rails(store), act, float(now))
    assert Rails(store).budget_left(act, TARGET, T0 + now) == max(0, count - len(inside))
    if len(inside) >= count:
        assert verdict.rail == "budget" and verdict.retry_at == T0 + inside[count - 1] + window
    else:
        assert verdict.allowed
    store.close()


def loop_action(**settings: Any) -> ActionConfig:
    return action(**({"crash_loop_window": 10 * MIN, "crash_loop_max": 3} | settings))


def test_crash_loop_is_refused(store: ActionStore) -> None:
    rails = Rails(store)
    act = loop_action()
    t = 0.0
    for _ in range(3):  # each restart works, and the server breaks again 5 minutes later
        assert check(rails, act, t).allowed
        run(store, act, t, t + MIN)
        t += 6 * MIN
    verdict = check(rails, act, t)
    assert (verdict.allowed, verdict.rail, verdict.retry_at) == (False, "crash_loop", None)
    assert "3 successful runs" in verdict.reason
    skipped(store, act, t)  # the executor records the refusal: it marks when the action was needed
    assert check(rails, act, t + 9 * MIN).rail == "crash_loop"
    assert check(rails, act, t + 5 * HOUR).rail == "crash_loop"  # stays refused...
    store.set_paused(False, "fixed the driver", T0 + t + 5 * HOUR)  # ...until an operator resumes
    assert check(rails, act, t + 5 * HOUR).allowed


def test_needs_spaced_beyond_the_window_are_no_loop(store: ActionStore) -> None:
    rails = Rails(store)
    act = loop_action()
    t = 0.0
    for gap in (6 * MIN, 6 * MIN, 11 * MIN):  # the third success held for longer than the window
        run(store, act, t, t + MIN)
        t += MIN + gap
    assert check(rails, act, t).allowed
    run(store, act, t, t + MIN)
    assert check(rails, act, t + 2 * MIN).allowed  # one loop: the run before held 11 minutes


def test_needs_while_the_action_ran_are_no_loop(store: ActionStore) -> None:
    act = loop_action(crash_loop_max=1)
    aid = store.begin(act.name, act.type, TARGET, "alert", ALERT, False, T0)
    skipped(store, act, 5 * MIN)  # the alert still fired while the restart was under way ("busy")
    store.finish(aid, "succeeded", T0 + 10 * MIN)
    assert check(Rails(store), act, 25 * MIN).allowed
    assert check(Rails(store), act, 19 * MIN).rail == "crash_loop"


def test_an_alert_still_firing_from_before_is_no_new_need(store: ActionStore) -> None:
    """With `needed_at` (the alert's startsAt), an alert that outlives the fix is no crash loop."""
    rails = Rails(store)
    act = loop_action()

    def need(at: float, since: float) -> None:
        store.record(
            act.name, act.type, TARGET, "alert", ALERT, "skipped", "", False, T0 + at, needed_at=T0 + since
        )

    for t in (
        0.0,
        30 * MIN,
        60 * MIN,
    ):  # a fresh alert every 30 minutes, still firing 2 minutes after the fix
        aid = store.begin(act.name, act.type, TARGET, "alert", ALERT, False, T0 + t, needed_at=T0 + t)
        store.finish(aid, "succeeded", T0 + t + MIN)
        need(t + 2 * MIN, t)
    lingering = rails.check(
        act, TARGET, ALERT, T0 + 63 * MIN, server_started_at=None, needed_at=T0 + 60 * MIN
    )
    assert lingering.allowed
    assert check(rails, act, 63 * MIN).allowed  # one loop (now): the earlier lingering rows do not count
    for t in (0.0, 30 * MIN):  # but the alert came back 4 minutes after each fix
        need(t + 5 * MIN, t + 5 * MIN)
    again = rails.check(act, TARGET, ALERT, T0 + 66 * MIN, server_started_at=None, needed_at=T0 + 65 * MIN)
    assert again.rail == "crash_loop"


def test_a_failure_breaks_the_loop_chain(store: ActionStore) -> None:
    act = loop_action()
    run(store, act, 0, MIN)
    run(store, act, 5 * MIN, 6 * MIN, "failed")
    run(store, act, 10 * MIN, 11 * MIN)
    run(store, act, 15 * MIN, 16 * MIN)
    assert check(Rails(store), act, 20 * MIN).allowed  # two loops after the failure


def test_crash_loop_seen_through_a_long_cooldown(store: ActionStore) -> None:
    """With a cooldown longer than the loop window, the skipped rows mark when the action was needed."""
    rails = Rails(store)
    act = loop_action(cooldown=15 * MIN)
    t = 0.0
    for _ in range(3):
        run(store, act, t, t + MIN)
        assert check(rails, act, t + 5 * MIN).rail == "cooldown"
        skipped(store, act, t + 5 * MIN)  # what the executor records for the blocked attempt
        skipped(store, act, t + 10 * MIN)
        t += 15 * MIN
    assert check(rails, act, t).rail == "crash_loop"


def test_dry_runs_make_no_crash_loop(store: ActionStore) -> None:
    act = loop_action()
    for i in range(5):
        run(store, act, i * 5 * MIN, i * 5 * MIN + MIN, dry_run=True)
    assert check(Rails(store), act, 30 * MIN).allowed


PAUSED = "the engine is paused on purpose (GET /is_paused answered true since 12:00:00Z)"


def test_a_paused_or_sleeping_engine_is_not_stopped_whatever_asked(store: ActionStore) -> None:
    """An operator's rule without the bundled `unless paused` must not restart a paused engine."""
    rails = Rails(store)
    for kind in ("restart", "disable_draft", "enable_draft", "reconfigure"):
        verdict = check(rails, action(kind, kind), MIN, engine=PAUSED)
        assert (verdict.allowed, verdict.rail, verdict.reason) == (False, "engine_paused", PAUSED)
        manual = rails.check(
            action(kind, kind), TARGET, {}, T0, server_started_at=None, manual=True, engine_state=PAUSED
        )
        assert manual.rail == "engine_paused"
    # Actions that do not stop the server still run: a throttle at the gateway, a power limit.
    assert check(rails, action("throttle", "throttle"), MIN, engine=PAUSED).allowed
    assert check(rails, action("power", "gpu_power_limit"), MIN, engine=PAUSED).allowed
    assert check(rails, action(), MIN, engine="").allowed  # resumed (or never paused)


def test_busy(store: ActionStore) -> None:
    rails = Rails(store)
    restart = action()
    store.begin("restart", "restart", TARGET, "alert", ALERT, False, T0)
    verdict = check(rails, restart, MIN)
    assert (verdict.rail, verdict.retry_at) == ("busy", None) and "restart" in verdict.reason
    assert check(rails, action("nodraft", "disable_draft"), MIN).rail == "busy"  # disruptive: one at a time
    assert check(rails, action("power", "gpu_power_limit"), MIN).allowed  # does not stop the server
    assert rails.check(restart, "gpu1", ALERT, T0 + MIN, server_started_at=None).allowed
    power = store.begin("power", "gpu_power_limit", TARGET, "alert", ALERT, False, T0)
    assert check(rails, action("power", "gpu_power_limit"), MIN).rail == "busy"  # the same action
    store.finish(power, "succeeded", T0 + 2)
    store.begin("restart", "restart", "gpu1", "alert", ALERT, True, T0)  # a dry run holds nothing
    assert rails.check(restart, "gpu1", ALERT, T0 + MIN, server_started_at=None).allowed


def test_rails_are_checked_in_order(store: ActionStore) -> None:
    rails = Rails(store)
    act = loop_action(
        cooldown=30 * MIN, startup_grace=5 * MIN, backoff_initial=2 * MIN, max_per_window=Budget(1, HOUR)
    )
    run(store, act, 0, MIN)
    run(store, act, 2 * MIN, 3 * MIN)
    run(store, act, 4 * MIN, 5 * MIN)
    run(store, act, 6 * MIN, 7 * MIN, "failed")
    store.set_paused(True, "", T0)
    store.add_silence([{"name": "target", "value": TARGET}], T0, T0 + 10 * HOUR, "", "ops", T0)
    seen = [check(rails, act, 8 * MIN, started=7 * MIN).rail]  # everything but crash loop and busy blocks
    store.set_paused(False, "", T0 - 1)
    seen.append(check(rails, act, 8 * MIN, started=7 * MIN).rail)
    for silence in store.silences(T0):
        store.expire_silence(silence.id, T0 + 8 * MIN)
    seen.append(check(rails, act, 8 * MIN, started=7 * MIN, engine=PAUSED).rail)
    seen.append(check(rails, act, 8 * MIN, started=7 * MIN).rail)
    seen.append(check(rails, act, 8 * MIN).rail)  # failed at 7m: backing off until 9m
    seen.append(check(rails, act, 9 * MIN).rail)  # the last run started at 6m: cooling down until 36m
    seen.append(check(rails, act, 36 * MIN).rail)  # 4 starts in the hour
    run(store, act, 40 * MIN, 41 * MIN)
    seen.append(check(rails, loop_action(crash_loop_max=1), 45 * MIN).rail)  # needed again 4m after
    store.begin(act.name, act.type, TARGET, "alert", ALERT, False, T0 + 46 * MIN)
    seen.append(check(rails, loop_action(), 47 * MIN).rail)
    assert seen == list(RAILS)


def test_manual_triggers_obey_every_rail(store: ActionStore) -> None:
    act = action(cooldown=HOUR, startup_grace=120.0)
    run(store, act, 0, MIN)
    verdict = Rails(store).check(act, TARGET, {}, T0 + 10 * MIN, server_started_at=None, manual=True)
    assert verdict.rail == "cooldown"
    grace = Rails(store).check(
        act, TARGET, {}, T0 + 2 * HOUR, server_started_at=T0 + 2 * HOUR - 1, manual=True
    )
    assert grace.rail == "startup_grace"


def test_rails_read_a_reopened_database(tmp_path: Path) -> None:
    """A restarted watchdog (or a second store on the same file) sees the same history."""
    path = str(tmp_path / "actions.db")
    act = action(cooldown=HOUR, max_per_window=Budget(2, 6 * HOUR))
    first = ActionStore(path)
    run(first, act, 0, MIN)
    second = ActionStore(path)
    assert check(Rails(second), act, 10 * MIN).rail == "cooldown"
    run(first, act, HOUR, HOUR + MIN)
    assert check(Rails(second), act, 3 * HOUR).rail == "budget"
    first.close()
    second.close()
    third = ActionStore(path)
    assert Rails(third).budget_left(act, TARGET, T0 + 3 * HOUR) == 0
    third.close()
