"""Background tasks that are held until they end, so none is garbage-collected mid-flight."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any


class Background:
    """Spawns coroutines on the running loop and keeps a reference to each until it finishes."""

    def __init__(self) -> None:
        self._tasks: set[asyncio.Task[Any]] = set()

    def spawn(self, coro: Coroutine[Any, Any, Any], name: str | None = None) -> None:
        """Run `coro` in the background."""
        task = asyncio.get_running_loop().create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def wait(self, timeout: float) -> None:
        """Let the running tasks finish, for at most `timeout` seconds."""
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=timeout)

    def cancel(self) -> None:
        """Cancel every running task."""
        for task in list(self._tasks):
            task.cancel()
