"""Routes: which actions an alert triggers, and on which configured target."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from ...config.targets import TargetConfig
from ...matchers import matches_all
from ..config import RouteConfig

TARGET_LABELS = ("target", "instance")  # where an alert names its server, in this order
# Labels that name what an alert is about in other ways (cAdvisor and docker_sd write `container`/`name`,
# node_exporter's systemd collector `name`... and `unit`): present, they must name the target's own
# container or unit, or the alert is about something the watchdog does not manage.
IDENTITY_LABELS = ("container", "name", "unit")


def route(routes: Sequence[RouteConfig], labels: Mapping[str, str]) -> list[str]:
    """Walk the routes top to bottom, as Alertmanager does: the first match stops unless it says `continue`.

    Returns action names; one named by several matching routes is returned once, at its first route.
    """
    out: list[str] = []
    seen: set[str] = set()
    for r in routes:
        if not matches_all(r.matchers, labels):
            continue
        for name in r.actions:
            if name not in seen:
                seen.add(name)
                out.append(name)
        if not r.continue_:
            break
    return out


def target_of(labels: Mapping[str, str], targets: Sequence[TargetConfig]) -> TargetConfig | None:
    """The configured target an alert is about.

    `target` holds the target's name (the watchdog's series carry it), `instance` its host:port (Prometheus'
    own instance label, which the watchdog writes too) or, in alerts of older rules, its name. With one
    target and no such label, it is that one.
    A `container`, `name` or `unit` label must name that target's own container or unit, or it is none.
    """
    found = _named(labels, targets)
    if found is None or not all(_is_own(found, key, labels[key]) for key in IDENTITY_LABELS if key in labels):
        return None
    return found


def _named(labels: Mapping[str, str], targets: Sequence[TargetConfig]) -> TargetConfig | None:
    for key in TARGET_LABELS:
        value = labels.get(key)
        if not value:
            continue
        for t in targets:
            if value in (t.name, t.instance):
                return t
        return None  # names a server we do not manage: never guess
    return targets[0] if len(targets) == 1 else None


def _is_own(target: TargetConfig, key: str, value: str) -> bool:
    """Whether an identity label names the target's own container or unit (docker_sd's leading / allowed)."""
    own = target.unit if key == "unit" else target.container
    if key == "name" and target.unit is not None:
        own = target.unit
    return own is not None and value.lstrip("/") in (own, own.removesuffix(".service"))
