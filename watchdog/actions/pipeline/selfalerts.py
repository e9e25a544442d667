"""The watchdog's own alerts about its actions: budget exhausted, crash loop, rolled back, failed.

Each names its target as every per-target series does: `target` its name, `instance` its host:port, `job` its
job, so an alert joins with the target's series and a router matching on `instance` finds the same server."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from ...config.targets import TargetConfig
from ...notifiers.alert import OutgoingAlert
from ...ruler.alerting import own_runbook
from ..config import ActionConfig
from .rails import Rails, Verdict

RESEND = 60.0  # as Prometheus' default resend delay
VALID = 4 * RESEND  # a copy in Alertmanager outlives two missed resends
ONE_SHOT = 3600.0  # rollback/failure notices: Alertmanager resolves them after an hour

BUDGET = "VLLMWatchdogRestartBudgetExhausted"
CRASH_LOOP = "VLLMWatchdogCrashLoop"
ROLLED_BACK = "VLLMWatchdogActionRolledBack"
FAILED = "VLLMWatchdogActionFailed"
SUMMARY = {
    BUDGET: "{action} on {target} used up its budget; no more automatic restarts until the window frees one",
    CRASH_LOOP: "{target} needed {action} again right after it succeeded, repeatedly; actions stopped",
    ROLLED_BACK: "{action} on {target} was rolled back: {reason}",
    FAILED: "{action} on {target} failed: {reason}",
}


class WatchdogAlerts:
    """Firing own alerts keyed by (alertname, action, target); resent while they hold, resolved after."""

    def __init__(self, rails: Rails, runbook_base: Callable[[], str] = str) -> None:
        self.rails = rails
        self.runbook_base = runbook_base  # the config's runbook_base_url now (str: "", links stay relative)
        self.firing: dict[tuple[str, str, str], OutgoingAlert] = {}
        self.last_sent: dict[tuple[str, str, str], float] = {}

    def _fire(
        self,
        name: str,
        action: str,
        target: TargetConfig,
        now: float,
        reason: str = "",
        valid_for: float = VALID,
    ) -> list[OutgoingAlert]:
        key = (name, action, target.name)
        old = self.firing.get(key)
        labels = {
            "alertname": name,
            "action": action,
            "job": target.job,
            "instance": target.instance,
            "target": target.name,
            "severity": "critical",
        }
        summary = SUMMARY[name].format(action=action, target=target.name, reason=reason)
        alert = OutgoingAlert(
            labels=labels,
            annotations={"summary": summary, "runbook_url": own_runbook(self.runbook_base(), name)},
            state="firing",
            starts_at=old.starts_at if old else now,
            ends_at=now + valid_for,
            value=1.0,
        )
        self.firing[key] = alert
        self.last_sent[key] = now
        return [alert]

    def _resolve(self, key: tuple[str, str, str], now: float) -> list[OutgoingAlert]:
        old = self.firing.pop(key, None)
        self.last_sent.pop(key, None)
        if old is None:
            return []
        return [
            OutgoingAlert(old.labels, old.annotations, "resolved", old.starts_at, now, 0.0, old.generator_url)
        ]

    def after_skip(
        self, action: ActionConfig, target: TargetConfig, verdict: Verdict, now: float
    ) -> list[OutgoingAlert]:
        """A rail blocked an action: the budget and crash-loop rails raise an alert."""
        name = {"budget": BUDGET, "crash_loop": CRASH_LOOP}.get(verdict.rail)
        if name is None or (name, action.name, target.name) in self.firing:
            return []
        return self._fire(name, action.name, target, now, verdict.reason)

    def after_outcome(
        self, action: ActionConfig, target: TargetConfig, outcome: str, reason: str, now: float
    ) -> list[OutgoingAlert]:
        """An action ended: a rollback or failure is announced once (crash loops resolve in tick)."""
        if outcome == "rolled_back":
            return self._fire(ROLLED_BACK, action.name, target, now, reason, ONE_SHOT)
        if outcome == "failed":
            return self._fire(FAILED, action.name, target, now, reason, ONE_SHOT)
        return []

    def tick(self, actions: Mapping[str, ActionConfig], now: float) -> list[OutgoingAlert]:
        """Resend what still holds every RESEND seconds; resolve a budget alert once the window frees one."""
        out: list[OutgoingAlert] = []
        for key in list(self.firing):
            name, action_name, target = key
            action = actions.get(action_name)
            alert = self.firing[key]
            if self._over(name, action, target, now):
                out += self._resolve(key, now)
            elif name in (ROLLED_BACK, FAILED):
                if now >= alert.ends_at:
                    self.firing.pop(key, None)
            elif not 0 <= now - self.last_sent.get(key, now) < RESEND:  # (< 0: the wall clock went back)
                renewed = OutgoingAlert(
                    alert.labels, alert.annotations, "firing", alert.starts_at, now + VALID, 1.0
                )
                self.firing[key], self.last_sent[key] = renewed, now
                out.append(renewed)
        return out

    def _over(self, name: str, action: ActionConfig | None, target: str, now: float) -> bool:
        """Whether the condition behind a budget or crash-loop alert has gone."""
        if action is None:
            return name in (BUDGET, CRASH_LOOP)
        if name == BUDGET:
            return (self.rails.budget_left(action, target, now) or 0) > 0
        if name == CRASH_LOOP:
            return self.rails.check(action, target, {}, now, server_started_at=None).rail != "crash_loop"
        return False

    def json(self) -> list[dict[str, Any]]:
        """The firing own alerts, for /api/v1/actions."""
        return [
            {
                "labels": dict(a.labels),
                "annotations": dict(a.annotations),
                "startsAt": a.starts_at,
                "endsAt": a.ends_at,
            }
            for a in self.firing.values()
        ]
