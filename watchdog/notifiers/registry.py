"""The notifier kinds, by their `type:`: adding an integration is its module, a line here and its
`NotifierKind` (keys and secrets) in `config.py`."""

from __future__ import annotations

from .alertmanager import ALERTMANAGER
from .notifier import Notifier
from .webhook import WEBHOOK

_KINDS: dict[str, Notifier] = {}


def register(kind: Notifier) -> None:
    """Make a kind known to the config and the hub (a test's own kind too)."""
    _KINDS[kind.type] = kind


def unregister(name: str) -> None:
    """Forget a kind registered by a test."""
    _KINDS.pop(name, None)


def kind_of(name: str) -> Notifier | None:
    """The kind a notifier's `type:` names; None if unknown."""
    return _KINDS.get(name)


def known() -> tuple[str, ...]:
    """Every registered `type:`, in registration order."""
    return tuple(_KINDS)


register(ALERTMANAGER)
register(WEBHOOK)
