"""A request's interrupt: the client went away, or its body did not arrive in time."""

from __future__ import annotations

import asyncio
import sys
from typing import Any

from starlette.types import Receive


class Interrupt:
    """Cancels the request's task when the client disconnects or a deadline passes, and says which."""

    __slots__ = ("_active", "_task", "_timer", "_watcher", "reason")

    def __init__(self) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._task = task
        self._active = True
        self._timer: asyncio.TimerHandle | None = None
        self._watcher: asyncio.Task[Any] | None = None
        self.reason = ""

    def deadline(self, delay: float) -> None:
        """Interrupt with reason "timeout" after `delay` seconds unless clear_deadline() comes first."""
        self._timer = self._task.get_loop().call_later(delay, self._fire, "timeout")

    def clear_deadline(self) -> None:
        """Drop the deadline."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def watch(self, receive: Receive) -> None:
        """After the request body is read, any further ASGI message means the client went away."""
        self._watcher = asyncio.ensure_future(receive())
        self._watcher.add_done_callback(self._on_message)

    def _on_message(self, fut: asyncio.Future[Any]) -> None:
        if not fut.cancelled() and fut.exception() is None:
            self._fire("disconnect")

    def _fire(self, reason: str) -> None:
        if self._active and not self.reason:
            self.reason = reason
            self._task.cancel()

    def absorb(self) -> bool:
        """In an `except CancelledError`: True if we caused it (then the task is no longer cancelling)."""
        if not self.reason:
            return False
        if sys.version_info >= (3, 11):
            self._task.uncancel()
        return True

    def close(self) -> None:
        """Stop watching; the response is done."""
        self._active = False
        self.clear_deadline()
        if self._watcher is not None:
            self._watcher.cancel()
