"""The `gateway.replay:` section: how the gateway holds a request whose upstream failed during a restart
(gateway/dataplane/replay.py); gateway/config.py embeds it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from .durations import parse_duration, parse_size

if TYPE_CHECKING:  # the gateway process reads its config as JSON, not YAML
    from .yamlnodes import Node

MiB = 1024 * 1024


@dataclass(frozen=True)
class ReplayConfig:
    """Replay of requests whose client got no byte when the watchdog stopped (or found dead) the engine."""

    enabled: bool = True
    max_held: int = 64  # requests held for a replay at once; beyond, today's error
    max_bytes: int = 64 * MiB  # their request bodies together; beyond, today's error
    drain_window: float = 1.0  # a failure while not drained waits this long for a drain to begin
    # A failure that says the server or its engine is gone (vLLM's EngineDeadError answer, a refused, reset or
    # closed connection, a response cut off) waits this long for the watchdog's restart to drain instead.
    dead_window: float = 30.0


def parse_replay(node: Node) -> ReplayConfig:
    """The `replay:` mapping (defaults for what it leaves out)."""
    d = ReplayConfig()
    m = node.mapping({"enabled", "max_held", "max_bytes", "drain_window", "dead_window"})
    if m is None:
        return d
    enabled = m["enabled"].boolean() if "enabled" in m else None
    held = m["max_held"].integer(minimum=1) if "max_held" in m else None
    size = m["max_bytes"].parsed(parse_size) if "max_bytes" in m else None
    if size is not None and size < 1:
        m["max_bytes"].error("must be greater than 0")
        size = None
    window = m["drain_window"].parsed(parse_duration) if "drain_window" in m else None
    dead = m["dead_window"].parsed(parse_duration) if "dead_window" in m else None
    return ReplayConfig(
        enabled=d.enabled if enabled is None else enabled,
        max_held=held or d.max_held,
        max_bytes=size or d.max_bytes,
        drain_window=d.drain_window if window is None else window,
        dead_window=d.dead_window if dead is None else dead,
    )
