"""The fleet's own alerts: etcd cannot be relied on (no disruptive action starts here), and a correlated fault
holds the group. Resent while they hold, resolved after, as the actions' own alerts are."""

from __future__ import annotations

from ..notifiers.alert import OutgoingAlert
from .config import FleetConfig

RESEND = 60.0  # as Prometheus' default resend delay
VALID = 4 * RESEND  # a copy in Alertmanager outlives two missed resends
UNREACHABLE = "VLLMWatchdogFleetUnreachable"
CORRELATED = "VLLMWatchdogFleetCorrelatedFault"


class FleetAlerts:
    """Firing fleet alerts by key; each resent every RESEND seconds and resolved once its cause is gone."""

    def __init__(self, config: FleetConfig, member: str) -> None:
        self.config = config
        self.member = member
        self.firing: dict[tuple[str, ...], OutgoingAlert] = {}
        self.last_sent: dict[tuple[str, ...], float] = {}

    def unreachable(self, down: bool, reason: str, now: float) -> list[OutgoingAlert]:
        """Fire while `down`, resolve when it is not."""
        labels = {
            "alertname": UNREACHABLE,
            "group": self.config.group,
            "member": self.member,
            "severity": "critical",
        }
        summary = f"{self.member} cannot rely on etcd: no disruptive action starts here: {reason}"
        return self.hold((UNREACHABLE,), down, labels, summary, now)

    def hold(
        self, key: tuple[str, ...], active: bool, labels: dict[str, str], summary: str, now: float
    ) -> list[OutgoingAlert]:
        """One alert that fires while `active`: sent when it starts, resent every RESEND, resolved after."""
        old = self.firing.get(key)
        if not active:
            self.last_sent.pop(key, None)
            if self.firing.pop(key, None) is None or old is None:
                return []
            return [OutgoingAlert(old.labels, old.annotations, "resolved", old.starts_at, now, 0.0)]
        if old is not None and 0 <= now - self.last_sent.get(key, now) < RESEND:
            return []
        alert = OutgoingAlert(
            labels=labels,
            annotations={"summary": summary},
            state="firing",
            starts_at=old.starts_at if old else now,
            ends_at=now + VALID,
            value=1.0,
        )
        self.firing[key], self.last_sent[key] = alert, now
        return [alert]
