"""An operator who pauses the engine on purpose, for bench/soak.py: what RL trainers do around weight updates.

vLLM 0.32 in dev mode (VLLM_SERVER_DEV_MODE=1) serves `POST /pause?mode=keep|wait|abort` and `POST /resume`
(straight to vLLM: the gateway refuses admin paths). The operator waits `gap`, pauses in the next mode of the
cycle, holds the pause for `hold` seconds, resumes, and again until the deadline; it always resumes a pause it
made, even when cancelled. What each mode does to requests (vllm/v1/engine/core.py, pause_scheduler):

- keep: requests in flight freeze and new ones queue; all of them finish after /resume;
- wait: /pause returns once the requests in flight have finished; new ones queue until /resume;
- abort: requests in flight are aborted at once (their clients get an aborted response); new ones queue.

So only an abort pause may end requests early, and only those in flight when it was asked for: the soak counts
those apart from lost requests (`Pause.covers`).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import httpx

MODES = ("keep", "wait", "abort")
ABORT_GRACE = 5.0  # seconds after an abort pause returned within which a failure is still its doing


@dataclass
class Pause:
    """One pause the operator made (clock readings of the soak's clock; None: did not happen)."""

    mode: str
    asked_at: float
    paused_at: float | None = None  # POST /pause answered 200
    resumed_at: float | None = None  # POST /resume answered 200
    errors: list[str] = field(default_factory=list)

    def covers(self, start: float, end: float) -> bool:
        """Whether a request that ran from `start` to `end` and failed was ended by this (abort) pause."""
        if self.mode != "abort" or self.paused_at is None:
            return False
        return start <= self.paused_at and self.asked_at <= end <= self.paused_at + ABORT_GRACE

    def to_json(self, t0: float) -> dict[str, Any]:
        """Seconds since traffic start."""
        doc = asdict(self)
        for key in ("asked_at", "paused_at", "resumed_at"):
            if doc[key] is not None:
                doc[key] = round(doc[key] - t0, 1)
        return doc


class Operator:
    """Pause/resume cycles against one vLLM until a deadline."""

    def __init__(
        self,
        vllm_url: str,
        *,
        hold: float,
        gap: float,
        modes: tuple[str, ...] = MODES,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.url = vllm_url.rstrip("/")
        self.hold = hold
        self.gap = gap
        self.modes = modes
        self.clock = clock
        self.pauses: list[Pause] = []

    async def run(self, seconds: float) -> None:
        """Cycle through the modes until `seconds` have passed; a pause never outlasts the deadline."""
        deadline = self.clock() + seconds
        async with httpx.AsyncClient(timeout=httpx.Timeout(30.0, read=180.0), trust_env=False) as client:
            i = 0
            while self.clock() + self.gap + min(self.hold, 10.0) < deadline:
                await asyncio.sleep(self.gap)
                pause = Pause(self.modes[i % len(self.modes)], self.clock())
                self.pauses.append(pause)
                i += 1
                try:
                    await self._pause(client, pause)
                    if pause.paused_at is not None:
                        await asyncio.sleep(max(0.0, min(self.hold, deadline - self.clock())))
                finally:
                    await asyncio.shield(self._resume(client, pause))

    async def _pause(self, client: httpx.AsyncClient, pause: Pause) -> None:
        try:
            r = await client.post(self.url + "/pause", params={"mode": pause.mode})
        except httpx.HTTPError as exc:
            pause.errors.append(f"pause: {type(exc).__name__}")
            return
        if r.status_code == 200:
            pause.paused_at = self.clock()
        else:
            pause.errors.append(f"pause: HTTP {r.status_code} {r.text[:200]}")

    async def _resume(self, client: httpx.AsyncClient, pause: Pause) -> None:
        for _ in range(3):  # a restart may be under way: try a little, then leave it
            with contextlib.suppress(httpx.HTTPError):
                r = await client.post(self.url + "/resume", timeout=10.0)
                if r.status_code == 200:
                    pause.resumed_at = self.clock()
                    return
                pause.errors.append(f"resume: HTTP {r.status_code}")
            await asyncio.sleep(1.0)
        pause.errors.append("resume: failed")


# -- what the soak makes of it ---------------------------------------------------------------------
BREAKER_SLACK = 10.0  # seconds past its breaker a behaving looper may still be refused (route, request)
EXPECTED_ALERT = "GatewaySessionToolCallLoop"


def judge(
    rows: list[dict[str, Any]],
    failures: list[tuple[float, float, str, str]],
    pauses: list[Pause],
    loopers: list[Any],
    breaker: float,
    t0: float,
    end: float,
) -> tuple[dict[str, Any], list[str]]:
    """The operator part of the report, and the reasons it fails: actions other than the loopers' breakers,
    failures not caused by an abort pause, loopers held past their breaker, pauses that did not happen."""
    sessions = {looper.session for looper in loopers}
    expected = [
        r
        for r in rows
        if r["action"] == "session-breaker"
        and (r["labels"] or {}).get("alertname") == EXPECTED_ALERT
        and (r["labels"] or {}).get("session") in sessions
    ]
    wrong = [r for r in rows if r not in expected]
    aborted = [f for f in failures if any(p.covers(f[0], f[1]) for p in pauses)]
    lost = [f for f in failures if f not in aborted]
    reasons = []
    if wrong:
        taken = sum(r["outcome"] not in ("skipped", "refused") for r in wrong)
        what = sorted({f"{r['action']} {r['outcome']} for {_cause(r)}" for r in wrong})
        reasons.append(f"{len(wrong)} wrong action(s) (audit rows), {taken} taken: {'; '.join(what)}")
    if lost:
        kinds = sorted({f"{k} {w}" for _, _, k, w in lost})
        reasons.append(f"{len(lost)} request(s) lost: {', '.join(kinds)}")
    looped = []
    for looper in loopers:
        held = looper.held_for(end)
        applied = [r for r in expected if r["labels"].get("session") == looper.session]
        looped.append(
            {
                "session": looper.session,
                "quiet_s": looper.quiet,
                "loop_steps": looper.loop_steps,
                "broken_at_s": None if looper.broken_at is None else round(looper.broken_at - t0, 1),
                "retry_after_s": looper.retry_after,
                "held_for_s": None if held is None else round(held, 1),
                "refusals_while_behaving": looper.refusals,
                "steps_after": looper.steps_after,
                "breaker_rows": len(applied),
                "breakers_applied": sum(r["outcome"] not in ("skipped", "refused") for r in applied),
            }
        )
        if looper.broken_at is None:
            if end - t0 > looper.start_after + 60:
                reasons.append(f"{looper.session} looped {looper.loop_steps} steps and was never broken")
        elif looper.quiet:
            if looper.refusals:
                reasons.append(
                    f"{looper.session} came back after {looper.quiet:.0f} s of silence (breaker "
                    f"{breaker:.0f} s) and was refused {looper.refusals} time(s)"
                )
        elif held is not None and held > breaker + BREAKER_SLACK:
            still = "" if looper.admitted_at is not None else ", and still was at the end"
            reasons.append(
                f"{looper.session} behaved but was refused for {held:.0f} s (breaker {breaker:.0f} s){still}"
            )
    unpaused = [p for p in pauses if p.paused_at is None or p.resumed_at is None]
    if unpaused:
        reasons.append(
            "pauses that did not happen or did not end: "
            + "; ".join(f"{p.mode} at {p.asked_at - t0:.0f}s {p.errors}" for p in unpaused)
        )
    report = {
        "pauses": [p.to_json(t0) for p in pauses],
        "failures": [
            {
                "start_s": round(a - t0, 1),
                "end_s": round(b - t0, 1),
                "kind": k,
                "what": w,
                "aborted": f in aborted,
            }
            for f in failures
            for a, b, k, w in [f]
        ],
        "aborted_by_pause": len(aborted),
        "lost": len(lost),
        "loopers": looped,
        "expected_breaker_rows": len(expected),
        "wrong_actions": len(wrong),
    }
    return report, reasons


def _cause(row: dict[str, Any]) -> str:
    return str((row["labels"] or {}).get("alertname", row["trigger"]))
