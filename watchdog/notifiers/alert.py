"""The alert the notifiers send: what the rule engine, the router and the actions hand over.

It lives with the notifiers, as Prometheus' notifier/alert.go does: the rule engine imports the notifiers,
never the reverse.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class OutgoingAlert:
    """An alert as notifiers receive it; `state` is "firing" or "resolved", times in unix seconds."""

    labels: Mapping[str, str]
    annotations: Mapping[str, str]
    state: str
    starts_at: float
    ends_at: float
    value: float
    generator_url: str = ""
