"""Where the daemon's handle on the gateway keeps what it set, as the handle sees it."""

from __future__ import annotations

from typing import Any, Protocol


class ControlStore(Protocol):
    """What GatewayControl needs of the daemon's state store (the action store,
    actions/store/actionstore.py): which targets are drained, and one JSON document that outlives a restart
    (throttle, breakers, offences)."""

    def drains(self) -> dict[str, float]: ...

    def get(self, key: str) -> Any: ...

    def put(self, key: str, value: Any) -> None: ...
