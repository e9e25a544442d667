"""What the kinds that steer the admission gateway (kinds/gateway.py) need of it, and their hold keys."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Protocol

from ...gateway.config import ThrottleSpec
from ...gateway.control.traffic import Traffic
from ...gateway.protocol.progress import UpstreamProgress
from ..config import ActionConfig


class Gateway(Protocol):
    """What these actions need from the gateway in front of a target."""

    target: str
    breaker_default: float
    traffic: Traffic  # whether requests go through it at all

    async def throttle(self, key: str, spec: ThrottleSpec) -> tuple[int, int]: ...

    def release(self, key: str) -> None: ...

    def keep(self, key: str) -> bool: ...

    async def open_breaker(
        self,
        session: str,
        duration: float,
        reason: str,
        *,
        max_duration: float | None = None,
        reset_after: float = 0.0,
    ) -> tuple[float, int]: ...

    def in_flight(self) -> int: ...

    def cap(self) -> int | None: ...

    def progress(self) -> UpstreamProgress | None: ...

    async def set_drain(self, drained: bool) -> None: ...


def hold_key(action: ActionConfig, labels: Mapping[str, str]) -> str:
    """One throttle hold per action and alert: a second alert resolving does not lift the first one's hold."""
    text = "\0".join(f"{k}={v}" for k, v in sorted(labels.items()) if k not in ("action", "trigger"))
    return f"{action.name}/{hashlib.sha256(text.encode()).hexdigest()[:16]}"
