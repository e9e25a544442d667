"""The effective target list: the config's own targets, then what each discovery found, in config order.

A name is one target. A discovered target whose name a target of the config already has is dropped (the
config wins; it is logged and counted), and so is one whose name an earlier discovery found.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ..config.targets import TargetConfig


@dataclass(frozen=True)
class Dropped:
    """A discovered target left out of the effective list, and why."""

    discovery: str
    name: str
    reason: str


def effective_targets(
    static: Sequence[TargetConfig], found: Sequence[tuple[str, Sequence[TargetConfig]]]
) -> tuple[tuple[TargetConfig, ...], tuple[Dropped, ...]]:
    """The config's targets, then each discovery's (`(name, targets)` in config order) whose name is free."""
    owner = {t.name: "the config's targets" for t in static}
    out = list(static)
    dropped = []
    for discovery, targets in found:
        for target in targets:
            taken = owner.get(target.name)
            if taken is not None:
                dropped.append(Dropped(discovery, target.name, f"the name is taken by {taken}"))
                continue
            owner[target.name] = discovery
            out.append(target)
    return tuple(out), tuple(dropped)
