"""The gateway's reflex to vLLM's own 503s: lower the in-flight cap at once, climb back once they stop.

vLLM 0.32 refuses requests with 503 when its own admission limits are reached (`--max-num-queued-reqs`,
`--max-num-queued-tokens`; counted in `vllm:admission_rejections_total`). The gateway sees that 503 on the
response itself, milliseconds after it happened, where a rule sees it a scrape, a rate window and a `for:`
later and the daemon's throttle a control round trip after that. So the gateway acts on its own, and keeps
acting when the daemon is gone (the data plane does not wait for the control plane):

- a 503 from the upstream to an admitted request multiplies the cap by `factor` (never below `floor`) through
  the throttle, as a hold of its own (HOLD_KEY) beside the daemon's alert holds;
- only a request admitted after the last decrease counts: the 503s of requests sent under the old cap say
  nothing about the new one (TCP's "once per window"), so a burst of 503s is one decrease;
- once `quiet` seconds pass without one, the hold is released and the throttle adds `step` slots per
  `step_interval` back up to the ceiling (or until vLLM answers 503 again).
"""

from __future__ import annotations

import time
from collections.abc import Callable

from ..config import ThrottleSpec, UpstreamBackoffConfig
from .throttle import Throttle

HOLD_KEY = "gateway:upstream-503"  # never an alert's key (those are label fingerprints)
UPSTREAM_BUSY = 503


class UpstreamBackoff:
    """Turns vLLM's 503s into throttle holds; tick() about once a second releases them once it is quiet."""

    def __init__(
        self,
        config: UpstreamBackoffConfig,
        throttle: Throttle,
        *,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._throttle = throttle
        self._monotonic = monotonic
        self._last_decrease: float | None = None  # monotonic
        self._last_busy: float | None = None  # the last 503 that counted
        self.decreases = 0  # times the cap was lowered (exported as upstream_backoffs_total)
        self.apply(config)

    def apply(self, config: UpstreamBackoffConfig) -> None:
        """Take a reloaded config (a hold already open keeps the spec it was opened with)."""
        self.config = config
        self._spec = ThrottleSpec(
            factor=config.factor, floor=config.floor, step=config.step, step_interval=config.step_interval
        )

    def observe(self, status: int, admitted_at: float) -> None:
        """An admitted request (admitted at monotonic `admitted_at`) got `status` from the upstream."""
        if status != UPSTREAM_BUSY or not self.config.enabled:
            return
        last = self._last_decrease
        if last is not None and admitted_at < last:
            return  # sent under the cap before the last decrease
        now = self._monotonic()
        self._last_busy = now
        self._last_decrease = now
        self.decreases += 1
        self._throttle.hold(HOLD_KEY, self._spec)

    def tick(self) -> None:
        """Release the hold once the upstream has been quiet long enough, and pace the climb back."""
        if HOLD_KEY in self._held():
            last = self._last_busy
            if last is None or self._monotonic() - last >= self.config.quiet:
                self._throttle.release(HOLD_KEY)
        self._throttle.tick(_no_signal)

    def _held(self) -> dict[str, object]:
        holds = self._throttle.state().get("holds")
        return holds if isinstance(holds, dict) else {}


def _no_signal(name: str) -> float | None:
    """The gateway has no latency signal of its own: adaptive holds wait for the daemon's tick."""
    return None
