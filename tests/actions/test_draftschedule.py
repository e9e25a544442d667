"""draft_schedule: a relaunch with the alert's draft schedule, through the remediator with injected time and a
scripted runtime (the real relaunch on a CPU vLLM: bench/speculation.py and test_draftschedule_vllm.py)."""

from __future__ import annotations

import asyncio

import pytest

from tests.support.clock import Clock
from tests.support.remediation import ARGS, Hub, Ready, ScriptedRuntime, alert, settle
from vllm_watchdog.actions.config import DRAFT_FLAGS
from vllm_watchdog.actions.pipeline.plans import DRAFT_KEY, guarded, plan_relaunch
from vllm_watchdog.actions.pipeline.remediator import Remediator, RemediatorOptions
from vllm_watchdog.actions.runtimes.speculative import FLAG, read_config
from vllm_watchdog.actions.store.actionstore import ActionStore
from vllm_watchdog.config.model import parse_config

pytestmark = pytest.mark.anyio

CONFIG = """
targets: [{name: vllm-0, url: "http://127.0.0.1:1", container: vllm-0}]
routes:
  - {match: {alertname: VLLMSpecDecodeScheduleMistuned}, actions: [draft-schedule]}
  - {match: {alertname: SpecBad}, actions: [draft_off]}
actions:
  draft-schedule: {type: draft_schedule, startup_grace: 0s}
  draft_off: {type: disable_draft, startup_grace: 0s}
  draft_on: {type: enable_draft, startup_grace: 0s}
"""
SCHEDULE = "1-7:4,8-65536:0"


def make(runtime: ScriptedRuntime | None = None) -> tuple[Remediator, ScriptedRuntime, Ready, Clock]:
    runtime = runtime or ScriptedRuntime()
    ready, clock = Ready(runtime), Clock()

    async def no_sleep(_: float) -> None:
        await asyncio.sleep(0)

    r = Remediator(
        parse_config(CONFIG, "c.yml", env={}),
        {"vllm-0": runtime},
        RemediatorOptions(
            ActionStore(None),
            ready,
            hub=Hub(),
            clock=clock,
            monotonic=clock,
            sleep=no_sleep,  # type: ignore[arg-type]
        ),
    )
    r.reconciled.set()
    return r, runtime, ready, clock


def mistuned(schedule: str = SCHEDULE) -> object:
    return alert("VLLMSpecDecodeScheduleMistuned", schedule=schedule)


async def test_the_alerts_schedule_is_relaunched_into_the_speculative_config() -> None:
    r, rt, _, _ = make()
    r.handle([mistuned()], 0.0)  # type: ignore[list-item]
    await settle(r)
    assert rt.calls == ["replace", "commit"]
    config = read_config(rt.current.args)
    assert config == {
        "method": "ngram",
        "num_speculative_tokens": 4,
        "prompt_lookup_max": 4,
        "num_speculative_tokens_per_batch_size": [[1, 7, 4], [8, 65536, 0]],
    }
    assert rt.current.args[:4] == ARGS[:4] and rt.current.args[-2:] == ARGS[-2:]  # the rest as it was
    (rec,) = r.store.history()
    assert (rec.action, rec.outcome) == ("draft-schedule", "succeeded")


async def test_the_same_schedule_again_is_a_skip_and_a_new_one_waits_for_the_cooldown() -> None:
    r, rt, _, clock = make()
    r.handle([mistuned()], clock.now)  # type: ignore[list-item]
    await settle(r)
    clock.now += 600  # within the hour's cooldown: another schedule waits
    r.handle([mistuned("1-3:4,4-65536:1")], clock.now)  # type: ignore[list-item]
    await settle(r)
    clock.now += 4000  # past it: the schedule that runs already is not relaunched again
    r.handle([mistuned()], clock.now)  # type: ignore[list-item]
    await settle(r)
    assert rt.calls == ["replace", "commit"]  # one relaunch: no flap
    reasons = [rec.reason for rec in r.store.history()]
    assert any("already runs the draft schedule" in x for x in reasons), reasons
    assert any("cooldown" in x for x in reasons), reasons


async def test_a_schedule_that_is_not_ready_rolls_back() -> None:
    r, rt, ready, _ = make()
    original = rt.current.args

    async def refuse(target: object, timeout: float, alive: object = None) -> tuple[bool, str]:
        if rt.current.args != original:  # as vLLM exits on a schedule it refuses
            return False, "the process exited (ValueError: Batch-size ranges must be non-overlapping)"
        return True, ""

    ready.wait = refuse  # type: ignore[method-assign]
    r.handle([mistuned()], 0.0)  # type: ignore[list-item]
    await settle(r)
    assert rt.calls == ["replace", "rollback"]
    assert rt.current.args == original
    (rec,) = r.store.history()
    assert rec.outcome == "rolled_back" and "non-overlapping" in rec.reason


@pytest.mark.parametrize(
    ("labels", "args", "why"),
    [
        ({}, ARGS, "no `schedule` label"),
        ({"schedule": "2-7:4"}, ARGS, "starts at batch size 1"),
        ({"schedule": SCHEDULE}, ("-m", "vllm", "--model", "/m"), "runs without speculative decoding"),
    ],
)
async def test_nothing_to_relaunch_is_a_skip_with_the_reason(
    labels: dict[str, str], args: tuple[str, ...], why: str
) -> None:
    r, rt, _, _ = make(ScriptedRuntime(args))
    r.handle([alert("VLLMSpecDecodeScheduleMistuned", **labels)], 0.0)
    await settle(r)
    assert rt.calls == []
    (rec,) = r.store.history()
    assert rec.outcome == "skipped" and why in rec.reason, rec.reason


OLD = '{"method":"ngram","num_speculative_tokens":4,"disable_by_batch_size":8}'


async def test_a_removed_key_is_dropped_by_the_schedule() -> None:
    r, rt, _, _ = make(ScriptedRuntime(("-m", "vllm", "--model", "/m", FLAG, OLD)))
    r.handle([mistuned()], 0.0)  # type: ignore[list-item]
    await settle(r)
    assert read_config(rt.current.args) == {
        "method": "ngram",
        "num_speculative_tokens": 4,
        "num_speculative_tokens_per_batch_size": [[1, 7, 4], [8, 65536, 0]],
    }
    (rec,) = r.store.history()
    assert rec.outcome == "succeeded", rec.reason


async def test_any_other_relaunch_carrying_a_removed_key_is_refused_with_the_reason() -> None:
    """enable_draft would put back a launch of an older vLLM: 0.32 would not start, so it is not tried."""
    cfg = parse_config(CONFIG, "c.yml", env={})
    rt = ScriptedRuntime(("-m", "vllm", "--model", "/m"))
    store = ActionStore(None)
    saved = rt.current.with_args(
        ("-m", "vllm", "--model", "/m", "--speculative-config.disable_by_batch_size", "8")
    )
    store.save_spec("vllm-0", DRAFT_KEY, saved.to_json(), 0.0)
    made = plan_relaunch(
        cfg.actions["draft_on"], cfg.targets[0], rt, store, restore=True, key=DRAFT_KEY, touched=DRAFT_FLAGS
    )
    plan = await guarded(cfg.actions["draft_on"], made)
    assert plan.skip.startswith("cannot plan draft_on: --speculative-config carries a key vLLM no longer has")
    assert (
        "disable_by_batch_size: vLLM removed it" in plan.skip
        and "num_speculative_tokens_per_batch_size" in plan.skip
    )
