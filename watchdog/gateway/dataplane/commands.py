"""What a controller may tell a running gateway, in JSON terms: one table, run on the gateway's own loop.

The daemon reaches these through a link (`link.py`): in the same process (tests) or over the control channel
to the gateway process. Times cross as durations, never as clock readings: the two sides keep their own
clocks. A lease lifts every drain and throttle hold when the controller has been silent too long, so a dead
control plane never leaves traffic held.
"""

from __future__ import annotations

import logging
import math
import os
import time
from collections.abc import Callable, Mapping
from typing import Any

from ..config import GatewayConfig, ThrottleSpec
from ..protocol.codec import decode, encode
from ..protocol.progress import drain_answer
from .offences import Escalation, Offences
from .server import GatewayServer

log = logging.getLogger("vllm_watchdog.gateway.commands")  # the name its logs had before the sub-packages


class CommandError(ValueError):
    """A command that names no operation or carries bad arguments (answered, never raised to the loop)."""


def _str(args: Mapping[str, Any], key: str) -> str:
    value = args.get(key)
    if not isinstance(value, str) or not value or len(value) > 4096:
        raise CommandError(f"{key}: expected a non-empty string")
    return value


def _seconds(args: Mapping[str, Any], key: str) -> float:
    value = args.get(key)
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not math.isfinite(value)
        or value < 0
    ):
        raise CommandError(f"{key}: expected a non-negative number of seconds")
    return float(value)


class GatewayCommands:
    """The operations on one GatewayServer; every method runs on the gateway's loop."""

    def __init__(
        self,
        server: GatewayServer,
        *,
        monotonic: Callable[[], float] = time.monotonic,
        lease: float | None = None,
    ) -> None:
        self.server = server
        self.monotonic = monotonic
        self.lease = lease  # None: holds never lapse (the daemon's own thread owns the gateway)
        self._last_contact: float | None = None  # monotonic; None until a controller first spoke
        self._lapsed = False
        self.lapses = (
            0  # times the lease ran out with something held (the controller re-syncs when it sees it)
        )
        self.fresh = True  # no controller has restored state into this gateway yet
        self.offences = Offences(server.config.sessions.max_sessions)  # see offences.py for why here
        self._ops: dict[str, Callable[[Mapping[str, Any]], Any]] = {
            "hello": self._hello,
            "restore": self._restore,
            "hold": self._hold,
            "release": self._release,
            "open_breaker": self._open_breaker,
            "close_breaker": self._close_breaker,
            "set_drain": self._set_drain,
            "tick": self._tick,
            "status": self._status,
            "state": lambda _: self.state(),
            "apply": self._apply,
        }

    @property
    def names(self) -> frozenset[str]:
        """The operations a controller may name."""
        return frozenset(self._ops)

    def run(self, op: str, args: Mapping[str, Any]) -> Any:
        """Carry out one command (CommandError if unknown or malformed); the controller's contact."""
        handler = self._ops.get(op)
        if handler is None:
            raise CommandError(f"unknown operation {op[:64]!r}")
        self._last_contact = self.monotonic()
        self._lapsed = False
        return handler(args)

    def check_lease(self) -> bool:
        """Lift drains and throttle holds once the controller was silent past the lease; True if it did."""
        if self.lease is None or self._last_contact is None or self._lapsed:
            return False
        if self.monotonic() - self._last_contact <= self.lease:
            return False
        self._lapsed = True
        gate, throttle = self.server.gate, self.server.throttle
        held = throttle.state().get("holds")
        holds = list(held) if isinstance(held, dict) else []
        if not holds and not gate.draining:
            return False
        for key in holds:
            throttle.release(key)
        gate.set_drain(False)
        self.lapses += 1
        log.warning(
            "the watchdog has not spoken to the gateway within its lease: drain and throttle holds lifted",
            extra={"target": self.server.config.target, "holds": len(holds), "lease": self.lease},
        )
        return True

    # -- operations ----------------------------------------------------------------------------------------
    def _hello(self, args: Mapping[str, Any]) -> dict[str, Any]:
        config = self.server.config
        return {
            "target": config.target,
            "listen": f"{config.listen_host}:{config.listen_port}",
            "upstream": config.upstream,
            "fresh": self.fresh,
            "in_flight": self.server.gate.in_flight,
            "pid": os.getpid(),
            "lapses": self.lapses,
        }

    def _restore(self, args: Mapping[str, Any]) -> None:
        """Throttle state and breakers (seconds left) a previous watchdog saved; only into a fresh gateway."""
        if not self.fresh:
            return
        self.fresh = False
        throttle = args.get("throttle")
        if isinstance(throttle, dict):
            self.server.throttle.restore(throttle)
        breakers = args.get("breakers")
        now = self.monotonic()
        for session, value in (breakers if isinstance(breakers, dict) else {}).items():
            ok = isinstance(value, list) and len(value) == 2 and isinstance(value[0], (int, float))
            if ok and value[0] > 0:
                self.server.gate.open_breaker(str(session), now + float(value[0]), str(value[1]))
        offences = args.get("offences")
        if isinstance(offences, dict):
            self.offences.restore(offences, now)

    def _hold(self, args: Mapping[str, Any]) -> list[int]:
        spec = ThrottleSpec.from_json(args.get("spec"))
        if spec is None:
            raise CommandError("spec: not a throttle")
        before = self.server.gate.limit
        return [before, self.server.throttle.hold(_str(args, "key"), spec)]

    def _release(self, args: Mapping[str, Any]) -> None:
        self.server.throttle.release(_str(args, "key"))

    def _open_breaker(self, args: Mapping[str, Any]) -> dict[str, Any]:
        """Refuse a session for `seconds`, doubled per repeat offence up to `max_seconds` (default: no
        doubling) while the session was not clean for `reset_after` seconds since its last breaker ended."""
        session, base = _str(args, "session"), _seconds(args, "seconds")
        cap = _seconds(args, "max_seconds") if "max_seconds" in args else base
        reset_after = _seconds(args, "reset_after") if "reset_after" in args else 0.0
        now, gate = self.monotonic(), self.server.gate
        until = gate.breakers().get(session, (now, ""))[0]
        escalation = Escalation(base, cap, reset_after)
        offence, seconds = self.offences.offend(session, escalation, now, ongoing=until > now)
        seconds = max(seconds, until - now)  # a second alert never shortens an open breaker
        gate.open_breaker(session, now + seconds, str(args.get("reason", ""))[:1024])
        self.server.signals.settle(session)
        return {"seconds": seconds, "offence": offence}

    def _close_breaker(self, args: Mapping[str, Any]) -> None:
        self.server.gate.close_breaker(_str(args, "session"))

    def _set_drain(self, args: Mapping[str, Any]) -> int | dict[str, Any]:
        """Hold new requests (or admit them again); the count in flight, and with `progress` how recently
        they heard from vLLM (protocol/progress.py: an older daemon asks no progress and gets the count)."""
        drained = args.get("drained")
        if not isinstance(drained, bool):
            raise CommandError("drained: expected true or false")
        self.server.gate.set_drain(drained)
        progress = self.server.proxy.progress.report() if args.get("progress") is True else None
        return drain_answer(int(self.server.gate.in_flight), progress)

    def _tick(self, args: Mapping[str, Any]) -> dict[str, Any]:
        """One throttle step with the controller's signals, then the snapshot and the state worth saving."""
        raw = args.get("signals")
        signals = {
            k: float(v)
            for k, v in (raw if isinstance(raw, dict) else {}).items()
            if isinstance(v, (int, float)) and not isinstance(v, bool)
        }
        self.server.throttle.tick(signals.get)
        return {"snapshot": encode(self.server.snapshot()), "state": self.state(), "lapses": self.lapses}

    def state(self) -> dict[str, Any]:
        """The throttle and the breakers (seconds left), as a controller saves them."""
        now = self.monotonic()
        breakers = {s: [until - now, reason] for s, (until, reason) in self.server.gate.breakers().items()}
        throttle = self.server.throttle.state()
        throttle.pop("seconds_since_change", None)  # changes every tick; not worth an fsync
        offences = {s: [n, left] for s, (n, left) in self.offences.records(now).items()}
        return {"throttle": throttle, "breakers": breakers, "offences": offences}

    def _status(self, args: Mapping[str, Any]) -> dict[str, Any]:
        gate, now = self.server.gate, self.monotonic()
        return {
            "pid": os.getpid(),
            "limit": gate.limit,
            "draining": gate.draining,
            "in_flight": gate.in_flight,
            "throttle": self.server.throttle.state(),
            "breakers": {
                s: {"seconds_left": round(until - now, 3), "reason": reason}
                for s, (until, reason) in gate.breakers().items()
            },
            "offences": {
                s: {"offences": n, "seconds_until_clean": round(left, 3)}
                for s, (n, left) in self.offences.records(now).items()
            },
        }

    def _apply(self, args: Mapping[str, Any]) -> None:
        try:
            config = decode(GatewayConfig, args.get("config"))
        except (TypeError, ValueError) as exc:
            raise CommandError(f"config: {exc}") from None
        self.server.apply(config)
        self.server.config = config
