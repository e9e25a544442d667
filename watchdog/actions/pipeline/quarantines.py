"""The quarantine book: a target whose known answers stayed wrong after a restart (or a relaunch and its
rollback) is kept drained, and the `quarantined` rail refuses every action that stops its server, until its
answers pass the periodic known-answer check `lift_after` times in a row or an operator lifts it.

The quarantine lives in the action state database beside the drain flags (a restarted watchdog keeps it);
the drain flag stays set while it lasts, so the gateway keeps holding new requests (up to its
`drain_max_wait`, then 503) however the flag is asked to change meanwhile. Lifting writes an audit row of its
own (action `quarantine_lifted`) and undrains the target.
"""

from __future__ import annotations

import logging
from typing import Protocol

from ...config.targets import TargetConfig
from ...integrity.verdict import Verdict, unknown
from ..store.actionstore import ActionStore, Quarantine

log = logging.getLogger("vllm_watchdog.actions.quarantines")
LIFT_AFTER = 3  # passing periodic checks in a row that end a quarantine (integrity's learn_probes)
LIFTED = "quarantine_lifted"  # the audit row's action and type, and its step


class AnswerVerdict(Protocol):
    """What the book reads of a known-answer verdict (integrity.verdict.Verdict)."""

    @property
    def ok(self) -> bool | None:
        """Right, wrong, or cannot tell (None)."""
        ...

    @property
    def reason(self) -> str:
        """One line on why."""
        ...


async def no_answer_check(target: TargetConfig, now: float) -> Verdict:
    """The verify of a watchdog with no known-answer check: it cannot tell, so the flow goes on."""
    return unknown("no known-answer check")


def quarantined_reason(q: Quarantine) -> str:
    """Why the `quarantined` rail refuses an action on the target, in words a person understands."""
    return (
        f"the target is quarantined: {q.reason}; no restart until its known answers pass again or an "
        f"operator lifts the quarantine (POST /api/v1/quarantines/{q.target}/lift)"
    )


class QuarantineBook:
    """Counts a quarantined target's passing known-answer checks and lifts its quarantine."""

    def __init__(self, store: ActionStore, lift_after: int = LIFT_AFTER) -> None:
        self.store = store
        self.lift_after = max(1, lift_after)

    def answers_checked(self, target: str, verdict: AnswerVerdict, now: float) -> bool:
        """Note a periodic check's verdict; True when it lifted the target's quarantine. A verdict that
        cannot tell (ok None) neither counts nor breaks the run; a wrong one starts the count again."""
        if verdict.ok is None or target not in self.store.quarantines():
            return False
        passes = self.store.count_pass(target, verdict.ok)
        if passes < self.lift_after:
            return False
        why = f"the known answers passed {passes} checks in a row"
        return self.lift(target, now, "answers", why)

    def lift(self, target: str, now: float, trigger: str, why: str) -> bool:
        """End the target's quarantine and undrain it, with an audit row; False if it was not quarantined."""
        q = self.store.quarantines().get(target)
        if q is None:
            return False
        labels = {"target": target, "quarantined_by": str(q.action_id or "")}
        row = self.store.begin(LIFTED, LIFTED, target, trigger, labels, False, now)
        self.store.step(row, LIFTED, now, {"reason": why, "since": q.since, "quarantined_for": q.reason})
        lifted = self.store.lift_quarantine(target, now)
        self.store.step(row, "undrain", now)
        self.store.finish(row, "succeeded", now, why)
        log.warning("quarantine lifted", extra={"target": target, "trigger": trigger, "reason": why})
        return lifted
