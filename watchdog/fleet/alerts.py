"""The fleet's own alerts: etcd cannot be relied on (no disruptive action starts here), and a correlated fault
holds the group. Resent while they hold, resolved after, as the actions' own alerts are."""

from __future__ import annotations

from ..notifiers.alert import OutgoingAlert
from ..ruler.alerting import own_runbook
from .config import FleetConfig
from .correlated import Hold

RESEND = 60.0  # as Prometheus' default resend delay
VALID = 4 * RESEND  # a copy in Alertmanager outlives two missed resends
UNREACHABLE = "VLLMWatchdogFleetUnreachable"
CORRELATED = "VLLMWatchdogFleetCorrelatedFault"


class FleetAlerts:
    """Firing fleet alerts by key; each resent every RESEND seconds and resolved once its cause is gone."""

    def __init__(self, config: FleetConfig, member: str, runbook_base: str = "") -> None:
        self.config = config
        self.member = member
        self.runbook_base = runbook_base  # the config's runbook_base_url ("": links stay relative)
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
        annotations = {"summary": summary, "runbook_url": own_runbook(self.runbook_base, UNREACHABLE)}
        return self.hold((UNREACHABLE,), down, labels, annotations, now)

    def correlated(self, holds: tuple[Hold, ...], now: float) -> list[OutgoingAlert]:
        """One alert per held alertname, resolved once it no longer holds. Every member sends the same labels
        (no `member`), so that Alertmanager shows one alert for the group."""
        out: list[OutgoingAlert] = []
        held = {(CORRELATED, h.alertname): h for h in holds}
        for key in [k for k in self.firing if k[0] == CORRELATED and k not in held]:
            out += self.hold(key, False, {}, {}, now)
        for key, h in held.items():
            labels = {
                "alertname": CORRELATED,
                "group": self.config.group,
                "fault": h.alertname,
                "severity": "critical",
            }
            summary = (
                f"a correlated fault holds group {self.config.group}: {len(h.members)} of {h.live} live "
                f"members fire {h.alertname}, more than correlated_share {h.share * 100:g}%; no disruptive "
                "action starts in the group until fewer do"
            )
            annotations = {
                "summary": summary,
                "members": h.named(),
                "runbook_url": own_runbook(self.runbook_base, CORRELATED),
            }
            out += self.hold(key, True, labels, annotations, now)
        return out

    def hold(
        self,
        key: tuple[str, ...],
        active: bool,
        labels: dict[str, str],
        annotations: dict[str, str],
        now: float,
    ) -> list[OutgoingAlert]:
        """One alert that fires while `active`: sent when it starts or its annotations change, resent every
        RESEND, resolved after."""
        old = self.firing.get(key)
        if not active:
            self.last_sent.pop(key, None)
            if self.firing.pop(key, None) is None or old is None:
                return []
            return [OutgoingAlert(old.labels, old.annotations, "resolved", old.starts_at, now, 0.0)]
        fresh = 0 <= now - self.last_sent.get(key, now) < RESEND
        if old is not None and fresh and dict(old.annotations) == annotations:
            return []
        alert = OutgoingAlert(
            labels=labels,
            annotations=annotations,
            state="firing",
            starts_at=old.starts_at if old else now,
            ends_at=now + VALID,
            value=1.0,
        )
        self.firing[key], self.last_sent[key] = alert, now
        return [alert]
