"""The event loop the long-running processes use: uvloop where it is installed, else asyncio's own.

uvloop runs the loop, its timers and its sockets in C (libuv). The daemon wakes about 20 times a second at 8
targets (a timer and a response per scrape, and its upkeep), and on a VM each wake-up of a Python process on
asyncio's loop costs 0.1-0.25 ms of CPU: on uvloop the daemon measured about 9% less CPU (bench/scrape.py).
The gateway's loop is uvloop for its throughput (bench/gateway.py).
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")

try:
    import uvloop
except ImportError:  # uvloop is optional (not built for every platform); asyncio's loop is slower
    uvloop = None  # type: ignore[assignment]


def new_event_loop() -> asyncio.AbstractEventLoop:
    """A new loop: uvloop's where installed."""
    return asyncio.new_event_loop() if uvloop is None else uvloop.new_event_loop()


def run(main: Coroutine[Any, Any, T]) -> T:
    """asyncio.run(main) on a loop from new_event_loop()."""
    if uvloop is None:
        return asyncio.run(main)
    return uvloop.run(main)
