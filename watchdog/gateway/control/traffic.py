"""Whether requests go through the gateway at all, as the daemon sees it tick by tick.

A throttle lowers the gateway's cap; where clients bypass the gateway (or none send anything) that changes
nothing, so the throttle asks first (actions/kinds/gateway.py). Seen from each tick's snapshot: a request was
carried when the admitted count moved or one was in flight. Before its first snapshot, and for any time
before it, the daemon cannot tell.
"""

from __future__ import annotations

import math

from ..protocol.snapshot import GateSnapshot


class Traffic:
    """When the gateway was last seen carrying a request, and since when it has been watched (wall clock)."""

    def __init__(self) -> None:
        self.since: float | None = None  # the first snapshot
        self.last = -math.inf  # the last snapshot that showed a request admitted or in flight
        self._admitted = 0  # admitted_total (all classes) of the last snapshot

    def saw(self, gate: GateSnapshot, now: float) -> None:
        """One tick's snapshot of the gate, taken at `now`."""
        admitted = sum(gate.admitted_total.values())
        moved = self.since is not None and admitted != self._admitted  # a restarted gateway counts anew
        if self.since is None:
            self.since = now
        if gate.in_flight or moved:
            self.last = now
        self._admitted = admitted

    def carried_since(self, since: float) -> bool | None:
        """Whether the gateway carried any request from wall time `since` on; None: not watched that long."""
        if self.since is None or self.since > since:
            return None
        return self.last >= since
