"""Acting on wrong answers: a restart or relaunch checks the known answers before it undrains; answers still
wrong keep the target drained and quarantine it (the `quarantined` rail then refuses restarts) until the
periodic check passes `lift_after` times in a row or an operator lifts it through the API. The quarantine
lives in the state database and outlives the watchdog.

The runtime is the scripted double of the remediator's tests and the known-answer verify a scripted callable
(the real check runs against a real vLLM in the integrity and end-to-end tests); time is injected."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import pytest
from starlette.applications import Starlette
from starlette.middleware import Middleware

from tests.support.clock import Clock
from tests.support.configs import target, write_config
from tests.support.remediation import ARGS, Hub, Ready, ScriptedRuntime, alert, settle
from tests.support.vllm_server import free_port
from vllm_watchdog.actions.config import traits_of
from vllm_watchdog.actions.pipeline.remediator import Remediator, RemediatorOptions
from vllm_watchdog.actions.store.actionstore import ActionStore
from vllm_watchdog.api.control import ControlGuard, control_routes
from vllm_watchdog.config.model import parse_config
from vllm_watchdog.config.targets import TargetConfig
from vllm_watchdog.integrity.verdict import Verdict, unknown

pytestmark = pytest.mark.anyio
CONFIG = """
targets: [{name: vllm-0, url: "http://127.0.0.1:1", container: vllm-0}]
routes:
  - {match: {alertname: VLLMAnswersDiverged}, actions: [answers-restart]}
  - {match: {alertname: Hot}, actions: [smaller]}
  - {match: {alertname: Hung}, actions: [restart]}
  - {match: {alertname: Bad}, actions: [hold]}
actions:
  answers-restart: {type: restart, startup_grace: 0s, cooldown: 1h, max_per_window: {count: 1, window: 6h}}
  restart: {type: restart, startup_grace: 0s, cooldown: 0s}
  smaller: {type: reconfigure, set: {--max-num-seqs: "1"}, startup_grace: 0s, cooldown: 0s}
  hold: {type: quarantine}
"""
TOKEN = "s3cret-token"
RIGHT = Verdict(True, 0.0, 0.01, 0, "answers match the baseline")
WRONG = Verdict(False, 0.32, 0.01, 2, "divergence 0.32 nats > tolerance 0.01; 2 greedy mismatches")


class Answers:
    """The known-answer verify: wrong while the server runs a launch in `wrong` (by its args), else right."""

    def __init__(self, runtime: ScriptedRuntime) -> None:
        self.runtime = runtime
        self.wrong: set[tuple[str, ...]] = set()
        self.calls = 0

    async def verify(self, target: TargetConfig, now: float) -> Verdict:
        self.calls += 1
        return WRONG if self.runtime.current.args in self.wrong else RIGHT


class FakeGateway:
    """The gateway in front of vllm-0, as the flows and the quarantine kind drive it."""

    target = "vllm-0"

    async def set_drain(self, drained: bool) -> None:
        pass

    def in_flight(self) -> int:
        return 0


def make(
    store: ActionStore | None = None, dry_run: bool = False
) -> tuple[Remediator, ScriptedRuntime, Answers, Clock]:
    cfg = parse_config(CONFIG + ("dry_run: true\n" if dry_run else ""), "c.yml", env={})
    runtime, clock = ScriptedRuntime(), Clock()
    answers = Answers(runtime)

    async def no_sleep(_: float) -> None:
        await asyncio.sleep(0)

    options = RemediatorOptions(
        store or ActionStore(None),
        Ready(runtime),  # type: ignore[arg-type]
        hub=Hub(),  # type: ignore[arg-type]
        gateway=FakeGateway(),  # type: ignore[arg-type]
        clock=clock,
        monotonic=clock,
        sleep=no_sleep,
        verify_answers=answers.verify,
    )
    r = Remediator(cfg, {"vllm-0": runtime}, options)
    r.reconciled.set()
    return r, runtime, answers, clock


def steps(r: Remediator, action_id: int) -> dict[str, dict[str, object]]:
    rec = r.store.by_id(action_id)
    assert rec is not None
    return {s.step: dict(s.details or {}) for s in rec.steps}


async def run(r: Remediator, name: str, clock: Clock) -> None:
    r.handle([alert(name)], clock.now)
    await settle(r)


async def test_a_restart_whose_answers_are_right_again_is_undrained() -> None:
    r, rt, answers, clock = make()
    await run(r, "VLLMAnswersDiverged", clock)
    (rec,) = r.store.history()
    assert (rec.outcome, rt.calls, answers.calls) == ("succeeded", ["stop", "start"], 1)
    assert steps(r, rec.id)["verify"] == {"ok": True, "divergence": 0.0, "reason": RIGHT.reason}
    assert [s.step for s in rec.steps][-2:] == ["verify", "undrain"]  # checked before traffic came back
    assert r.store.drains() == {} and r.store.quarantines() == {}


async def test_answers_still_wrong_after_the_restart_keep_it_drained_and_quarantined() -> None:
    r, _, answers, clock = make()
    answers.wrong.add(ARGS)
    await run(r, "VLLMAnswersDiverged", clock)
    (rec,) = r.store.history()
    assert rec.outcome == "failed" and rec.reason == "answers still wrong after the restart: quarantined"
    assert steps(r, rec.id)["verify"] == {"ok": False, "divergence": 0.32, "reason": WRONG.reason}
    assert "quarantine" in steps(r, rec.id) and "undrain" not in steps(r, rec.id)
    assert set(r.store.drains()) == {"vllm-0"}  # the gateway keeps holding its requests
    shown = r.status_json(clock.now)["data"]["quarantined"]  # GET /api/v1/actions
    assert shown["vllm-0"]["action_id"] == rec.id and shown["vllm-0"]["passes"] == 0
    q = r.store.quarantines()["vllm-0"]
    assert (q.action_id, q.since) == (rec.id, clock.now) and WRONG.reason in q.reason


async def test_the_quarantined_rail_refuses_every_further_restart_and_relaunch() -> None:
    r, rt, answers, clock = make()
    answers.wrong.add(ARGS)
    await run(r, "VLLMAnswersDiverged", clock)
    clock.advance(7 * 3600)  # cooldown and budget long over
    for name in ("Hung", "Hot"):  # a plain restart, a relaunch: both stop the server
        await run(r, name, clock)
    refused = r.store.history(2)
    assert [(h.outcome, h.action) for h in refused] == [("skipped", "smaller"), ("skipped", "restart")]
    assert all(h.reason.startswith("the target is quarantined: answers still wrong") for h in refused)
    assert "POST /api/v1/quarantines/vllm-0/lift" in refused[0].reason
    job = r.run_manual("restart", "vllm-0")  # by hand too: a person lifts the quarantine first
    assert job.done is not None
    result = await job.done
    assert (result["outcome"], result["rail"]) == ("skipped", "quarantined")
    assert rt.calls == ["stop", "start"]  # only the first restart ran


async def test_a_relaunch_with_wrong_answers_rolls_back_to_the_old_server() -> None:
    r, rt, answers, clock = make()
    answers.wrong.add((*ARGS[:-1], "1"))  # the new launch (--max-num-seqs 1) answers wrong
    await run(r, "Hot", clock)
    (rec,) = r.store.history()
    assert rec.outcome == "rolled_back" and rec.reason.startswith(
        "answers wrong after the relaunch: divergence"
    )
    assert rt.calls == ["replace", "rollback"] and rt.current.args == ARGS
    assert [s.step for s in rec.steps if s.step == "verify"] == ["verify", "verify"]  # new, then old
    assert r.store.drains() == {} and r.store.quarantines() == {}


async def test_a_relaunch_whose_old_server_answers_wrong_too_is_quarantined() -> None:
    r, rt, answers, clock = make()
    answers.wrong |= {ARGS, (*ARGS[:-1], "1")}
    await run(r, "Hot", clock)
    (rec,) = r.store.history()
    assert rec.outcome == "failed" and rec.reason.endswith(
        "the old server's answers are wrong too: quarantined"
    )
    assert rt.calls == ["replace", "rollback"]
    assert set(r.store.quarantines()) == {"vllm-0"} == set(r.store.drains())


async def test_three_passing_checks_in_a_row_lift_the_quarantine() -> None:
    r, _, answers, clock = make()
    answers.wrong.add(ARGS)
    await run(r, "VLLMAnswersDiverged", clock)
    for verdict in (RIGHT, RIGHT, WRONG, RIGHT, unknown("paused"), RIGHT):  # wrong starts again; None waits
        clock.advance(60)
        r.answers_checked("vllm-0", verdict, clock.now)
    assert r.store.quarantines()["vllm-0"].passes == 2 and set(r.store.drains()) == {"vllm-0"}
    clock.advance(60)
    r.answers_checked("vllm-0", RIGHT, clock.now)
    assert r.store.quarantines() == {} and r.store.drains() == {}
    lifted = r.store.history(1)[0]
    assert (lifted.action, lifted.outcome, lifted.trigger) == ("quarantine_lifted", "succeeded", "answers")
    assert lifted.reason == "the known answers passed 3 checks in a row"
    assert [s.step for s in lifted.steps] == ["quarantine_lifted", "undrain"]
    assert traits_of(lifted.type).stops_server is False  # a row no rail counts as a run of any action
    r.answers_checked("vllm-0", RIGHT, clock.now)  # a target that is not quarantined: nothing happens
    assert len(r.store.history()) == 2


async def test_an_operator_lifts_the_quarantine_through_the_api_with_the_token() -> None:
    r, _, answers, clock = make()
    answers.wrong.add(ARGS)
    await run(r, "VLLMAnswersDiverged", clock)
    routes = control_routes(r, None, clock)
    app = Starlette(routes=routes, middleware=[Middleware(ControlGuard, get_token=lambda: TOKEN)])
    auth = {"Authorization": f"Bearer {TOKEN}"}
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://w") as c:
        listed = (await c.get("/api/v1/quarantines")).json()["data"]
        assert [q["target"] for q in listed] == ["vllm-0"] and listed[0]["passes"] == 0
        assert (await c.post("/api/v1/quarantines/vllm-0/lift")).status_code == 401  # no token
        assert set(r.store.quarantines()) == {"vllm-0"}
        body = {"reason": "replaced the GPU"}
        answer = await c.post("/api/v1/quarantines/vllm-0/lift", json=body, headers=auth)
        assert answer.status_code == 200 and answer.json()["lifted"] is True
        again = await c.post("/api/v1/quarantines/vllm-0/lift", headers=auth)
        assert again.status_code == 404 and "not quarantined" in again.json()["error"]
    assert r.store.quarantines() == {} and r.store.drains() == {}
    lifted = r.store.history(1)[0]
    assert (lifted.action, lifted.trigger, lifted.reason) == (
        "quarantine_lifted",
        "manual",
        "replaced the GPU",
    )


async def test_the_quarantine_outlives_the_watchdog(tmp_path: Path) -> None:
    path = str(tmp_path / "actions.sqlite")
    r, _, answers, clock = make(ActionStore(path))
    answers.wrong.add(ARGS)
    await run(r, "VLLMAnswersDiverged", clock)
    r.store.close()
    again, rt2, _, clock2 = make(ActionStore(path))  # the next watchdog, on the same state database
    await again.reconcile()  # undrains what an action left drained, but not a quarantined target
    assert set(again.store.quarantines()) == {"vllm-0"} == set(again.store.drains())
    clock2.advance(7 * 3600)
    await run(again, "Hung", clock2)
    assert again.store.history(1)[0].outcome == "skipped" and rt2.calls == []


async def test_reconcile_checks_the_answers_and_quarantines_a_wrong_server() -> None:
    r, _, answers, _ = make()
    answers.wrong.add(ARGS)
    aid = r.store.begin("restart", "restart", "vllm-0", "alert", {}, False, 0.0)
    r.store.set_drain("vllm-0", True, 0.0, aid)
    await r.reconcile()
    rec = r.store.history()[0]
    assert rec.outcome == "failed" and rec.reason.endswith("but its answers are wrong: quarantined")
    assert set(r.store.quarantines()) == {"vllm-0"} == set(r.store.drains())


async def test_a_dry_run_writes_would_do_and_changes_nothing() -> None:
    r, rt, answers, clock = make(dry_run=True)
    answers.wrong.add(ARGS)
    for name in ("VLLMAnswersDiverged", "Bad"):
        await run(r, name, clock)
    assert [h.outcome for h in r.store.history()] == ["would_do", "would_do"]
    assert rt.calls == [] and answers.calls == 0
    assert r.store.drains() == {} and r.store.quarantines() == {}


async def test_the_quarantine_kind_drains_a_target_and_is_lifted_like_the_others() -> None:
    r, rt, _, clock = make()
    await run(r, "Bad", clock)
    (rec,) = r.store.history()
    assert (rec.outcome, rec.reason) == ("succeeded", "quarantined: alert Bad fired")
    assert rt.calls == [] and set(r.store.quarantines()) == {"vllm-0"} == set(r.store.drains())
    await run(r, "Hung", clock)
    assert r.store.history(1)[0].outcome == "skipped"  # no restart of a quarantined target
    for _ in range(3):
        r.answers_checked("vllm-0", RIGHT, clock.now)
    assert r.store.quarantines() == {} and r.store.drains() == {}


async def test_the_daemon_wires_the_checks_verdicts_the_verify_and_the_series(tmp_path: Path) -> None:
    from vllm_watchdog.service.actionmetrics import ActionCollector
    from vllm_watchdog.service.daemon import Daemon, DaemonOptions

    cfg = write_config(tmp_path, target("http://127.0.0.1:9"), port=free_port())
    d = Daemon.load(DaemonOptions(str(cfg), env={}))
    r = d.actions.remediator
    vllm = r.config.targets[0]
    verdict = await r.verify_answers(vllm, 0.0)  # its canary is off: the known answers are not checked
    assert (verdict.ok, verdict.reason) == (None, "no known-answer check on this target")
    r.store.quarantine("vllm-0", "answers still wrong after a restart", 0.0)

    def quarantined() -> list[tuple[dict[str, str], float]]:
        (family,) = [f for f in ActionCollector(d.actions).collect() if f.name.endswith("_quarantined")]
        return [(s.labels, s.value) for s in family.samples]

    assert quarantined() == [({"target": "vllm-0"}, 1.0)]
    for n in range(r.config.integrity.learn_probes):  # the periodic check's verdicts, as integrity hands them
        d._answers_checked("vllm-0", RIGHT, float(n))
    assert r.store.quarantines() == {} and quarantined() == [({"target": "vllm-0"}, 0.0)]
    r.store.close()
