"""The Notifier protocol: one kind of receiver (a notifier's `type:`), implemented by one module each.

As Alertmanager's integrations (notify/webhook, notify/slack) each implement one Notifier interface, every
kind here says what it takes, what its queue keeps and what it sends where (URL, headers, JSON body); the hub
keeps the queue and the retries and never asks which kind it holds. `registry.py` lists the kinds. A kind's
config side, as Alertmanager's config/notifiers.go holds it, is its `NotifierKind` in `config.py` (the config
stage reads the file before any stage runs): its own keys and which of its fields hold secrets.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from .alert import OutgoingAlert


@dataclass(frozen=True)
class Receiver:
    """Where one notifier sends: its name, URL and headers as configured, the watchdog's external URL and
    the options its kind's own keys set."""

    name: str
    url: str
    headers: Mapping[str, str] = field(default_factory=dict)
    external_url: str = ""
    options: Any = None


class Notifier(Protocol):
    """One kind of receiver: its config, what its queue keeps, and the request for a batch."""

    type: str  # the `type:` that selects it
    takes_events: bool  # whether action events go to it as well as alerts

    def identity(self, alert: OutgoingAlert) -> str | None:
        """The queue key of an alert: a newer one with the same key replaces it (None: every one is kept)."""
        ...

    def url(self, receiver: Receiver) -> str:
        """The URL each request is posted to."""
        ...

    def headers(self, receiver: Receiver) -> Mapping[str, str]:
        """The headers of each request (the client settings add Authorization)."""
        ...

    def alerts_body(self, alerts: Sequence[OutgoingAlert], receiver: Receiver) -> Any:
        """The JSON body for one batch of alerts."""
        ...

    def event_body(self, event: Mapping[str, Any], receiver: Receiver) -> Any:
        """The JSON body for one action event (as ActionEvent.to_json makes it); only if it takes events."""
        ...
