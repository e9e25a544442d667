"""The daemon's handle on the running gateway: actions, drains, adaptive signals and persisted state.

The gateway is a process of its own (or, in tests, a thread); everything here runs on the daemon's loop and
reaches it only through a link's commands. A gateway that stops answering is reported once, and started again
if it died; its series go stale meanwhile, so rules see the gap.
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from ...background import Background
from ...promql.mathfuncs import histogram_quantile
from ..config import GatewayConfig, ThrottleSpec
from ..protocol.channel import ChannelError
from ..protocol.codec import decode, encode
from ..protocol.link import GatewayLink
from ..protocol.progress import UpstreamProgress, read_drain_answer
from ..protocol.snapshot import GatewaySnapshot, HistogramSnapshot
from .controlstore import ControlStore
from .traffic import Traffic

log = logging.getLogger("vllm_watchdog.gateway.handle")  # the name its logs had before the sub-packages
HOLD_TTL = 900.0  # a hold whose alert was not seen for this long is dropped (a lost "resolved")
SIGNAL_WINDOW = 10.0  # seconds of gateway latency the adaptive throttle looks at
SIGNAL_QUANTILE = 0.9
SIGNAL_MIN_COUNT = 5  # fewer observations in the window: no signal


def window_quantile(q: float, old: HistogramSnapshot, new: HistogramSnapshot) -> float | None:
    """The q-quantile of the observations between two snapshots, as PromQL's histogram_quantile computes it
    over the increase; None with too few observations to mean anything."""
    if new.count - old.count < SIGNAL_MIN_COUNT or len(old.cumulative) != len(new.cumulative):
        return None
    bounds = (*new.bounds, math.inf)
    increase = zip(bounds, new.cumulative, old.cumulative, strict=True)
    return histogram_quantile(q, [(le, float(n - o)) for le, n, o in increase])


def queue_time_query(target: str) -> str:
    """The PromQL of the adaptive throttle's signal: vLLM's p90 request queue time over 30 s for `target`."""
    return (
        "histogram_quantile(0.9, sum by (le) "
        f'(rate(vllm:request_queue_time_seconds_bucket{{target="{target}"}}[30s])))'
    )


def _no_queue_time() -> float | None:
    return None


@dataclass(frozen=True)
class GatewayControlOptions:
    """What a GatewayControl is wired to: the link to the gateway process, the store its state is kept in,
    the clocks, and vLLM's own recent queue time (p90) for the adaptive throttle."""

    link: GatewayLink
    store: ControlStore
    clock: Callable[[], float] = time.time
    monotonic: Callable[[], float] = time.monotonic
    queue_time: Callable[[], float | None] = _no_queue_time


class GatewayControl:
    """Steers one gateway: throttle holds and releases, session breakers, drains; persists what it set."""

    def __init__(self, config: GatewayConfig, options: GatewayControlOptions) -> None:
        self.link = options.link
        self.config = config
        self.queue_time = options.queue_time
        self.store = options.store
        self.clock, self.monotonic = options.clock, options.monotonic
        self.target = config.target
        self.breaker_default = config.sessions.breaker_duration
        self.snapshot: GatewaySnapshot | None = None
        self.reachable = False  # the gateway answered the last command
        self.restarts = 0  # gateway processes started again after one died
        self._in_flight = 0
        self.traffic = Traffic()  # whether requests go through the gateway at all (a throttle's premise)
        self._progress: UpstreamProgress | None = None  # from the last set_drain answer
        self._lapses = 0  # the gateway's count of lease lapses, as last seen
        self._holds_seen: dict[str, float] = {}  # hold key -> when its alert last asked (monotonic)
        self._history: deque[tuple[float, HistogramSnapshot]] = deque()  # (when, time-to-first-byte)
        self._persisted = ""
        self._following = False  # drain flags reach the gateway from start() until aclose()
        self._background = Background()

    @property
    def listen(self) -> str:
        """host:port the gateway serves on."""
        return f"{self.config.listen_host}:{self.config.listen_port}"

    @property
    def _key(self) -> str:
        return f"gateway/{self.target}"

    async def start(self) -> None:
        """Start (or adopt) the gateway; a new one gets the throttle, breakers and drain left before."""
        self._following = True
        try:
            hello = await self.link.attach()
        except OSError as exc:
            if self.link.supervise:
                raise
            log.error(
                "no gateway answers yet: monitoring goes on, and the watchdog attaches once one does",
                extra={"target": self.target, "error": str(exc)},
            )
            return
        try:
            await self._attached(hello)
        except ChannelError as exc:
            # It answered hello, then went (killed, restarted by its supervisor): not a reason to stop
            # monitoring. The next command revives or finds it, and a fresh one gets the saved state then.
            self.reachable = False
            log.error(
                "the gateway stopped answering while it was being attached: it is attached when it answers",
                extra={"target": self.target, "error": str(exc)},
            )

    async def _attached(self, hello: Mapping[str, Any]) -> None:
        """A gateway answered for the first time: a new one takes the saved state; an adopted one (it outlived
        the previous watchdog) keeps its own, which is newer. Either follows the drain flag of the store."""
        if hello.get("fresh"):
            await self.link.request("restore", self._saved())
        else:
            log.info("adopted a running gateway", extra={"target": self.target, "pid": hello.get("pid")})
        lapses = hello.get("lapses")
        self._lapses = lapses if isinstance(lapses, int) else 0
        await self._resync()
        self.reachable = True

    async def _resync(self) -> None:
        """Follow the store's drain flag, and forget holds the gateway no longer has (a lapsed lease released
        them; the next firing of their alert holds again)."""
        drained = self.target in self.store.drains()
        self._in_flight = int(await self.link.request("set_drain", {"drained": drained}))
        holds = (await self.link.request("state")).get("throttle", {}).get("holds", {})
        holds = holds if isinstance(holds, dict) else {}
        now = self.monotonic()
        for key in list(self._holds_seen):
            if key not in holds:
                del self._holds_seen[key]
        for key in holds:
            self._holds_seen.setdefault(str(key), now)

    def _saved(self) -> dict[str, Any]:
        """The persisted state as the restore command takes it (breaker ends and the time until a session's
        offences are forgotten as seconds left)."""
        saved = self.store.get(self._key)
        if not isinstance(saved, dict):
            return {}
        now_wall = self.clock()
        breakers = saved.get("breakers")
        left = {
            str(session): [float(value[0]) - now_wall, str(value[1])]
            for session, value in (breakers if isinstance(breakers, dict) else {}).items()
            if isinstance(value, list) and len(value) == 2 and isinstance(value[0], (int, float))
        }
        offences = saved.get("offences")
        records = {
            str(session): [value[0], float(value[1]) - now_wall]
            for session, value in (offences if isinstance(offences, dict) else {}).items()
            if isinstance(value, list) and len(value) == 2 and isinstance(value[1], (int, float))
        }
        return {"throttle": saved.get("throttle"), "breakers": left, "offences": records}

    async def _request(self, op: str, args: Mapping[str, Any] | None = None) -> Any:
        """One command; a gateway that died is started again first, and the command sent to the new one."""
        try:
            result = await self.link.request(op, args)
        except ChannelError as exc:
            if self.reachable:
                log.error("the gateway does not answer", extra={"target": self.target, "error": str(exc)})
            self.reachable = False
            hello = await self._revive()
            if hello is None:
                raise
            result = await self.link.request(op, args)
        if not self.reachable:
            log.warning("the gateway answers again", extra={"target": self.target})
        self.reachable = True
        return result

    async def _revive(self) -> dict[str, Any] | None:
        try:
            hello = await self.link.revive()
        except OSError as exc:
            log.error("starting the gateway again failed", extra={"target": self.target, "error": str(exc)})
            return None
        if hello is not None:
            self.restarts += 1
            await self._attached(hello)
        return hello

    # -- actions -------------------------------------------------------------------------------
    async def throttle(self, key: str, spec: ThrottleSpec) -> tuple[int, int]:
        """Tighten the cap for an alert (key: action and alert); returns the cap before and after."""
        self._holds_seen[key] = self.monotonic()
        before, after = await self._request("hold", {"key": key, "spec": spec.to_json()})
        await self.persist()
        return int(before), int(after)

    def keep(self, key: str) -> bool:
        """The alert behind hold `key` was resent, still firing: the hold stays, not tightened again; False
        if the gateway no longer has it (its lease lapsed, or it went quiet past HOLD_TTL): hold again."""
        if key not in self._holds_seen:
            return False
        self._holds_seen[key] = self.monotonic()
        return True

    def release(self, key: str) -> None:
        """The alert behind a hold resolved: recovery starts once no hold is left."""
        self._holds_seen.pop(key, None)
        self._background.spawn(self._release(key))

    async def _release(self, key: str) -> None:
        await self._request("release", {"key": key})
        await self.persist()

    async def open_breaker(
        self,
        session: str,
        duration: float,
        reason: str,
        *,
        max_duration: float | None = None,
        reset_after: float = 0.0,
    ) -> tuple[float, int]:
        """Refuse a session's requests for `duration` seconds, doubled per repeat offence up to `max_duration`
        (None: never doubled) until the session stays clean `reset_after` seconds after its last breaker;
        returns the seconds it got and which offence this is (1: the first)."""
        args: dict[str, Any] = {"session": session, "seconds": duration, "reason": reason}
        if max_duration is not None:
            args |= {"max_seconds": max_duration, "reset_after": reset_after}
        answer = await self._request("open_breaker", args)
        await self.persist()
        if isinstance(answer, dict):  # a gateway older than the offence record answers nothing
            return float(answer.get("seconds", duration)), int(answer.get("offence", 1))
        return duration, 1

    async def close_breaker(self, session: str) -> None:
        """Admit a session again."""
        await self._request("close_breaker", {"session": session})
        await self.persist()

    async def set_drain(self, drained: bool) -> None:
        """Hold or refuse new requests (drained), or admit them again; note what is in flight and how recently
        it heard from vLLM (progress(): None until the gateway answers, or from one too old to tell)."""
        self._progress = None
        answer = await self._request("set_drain", {"drained": drained, "progress": True})
        self._in_flight, self._progress = read_drain_answer(answer)

    def on_drain(self, target: str, drained: bool) -> None:
        """The action store's drain hook: follow the flag for our target while started."""
        if self._following and target == self.target:
            self._background.spawn(self.set_drain(drained))

    def in_flight(self) -> int:
        """Requests forwarded and not finished, as of the last word from the gateway (at most a tick old)."""
        return self._in_flight

    def progress(self) -> UpstreamProgress | None:
        """How recently the requests in flight heard from vLLM, as of the last set_drain answer."""
        return self._progress

    def cap(self) -> int | None:
        """The in-flight cap now (throttled or not), as of the last tick; None: the gateway did not answer."""
        return None if self.snapshot is None else self.snapshot.gate.limit

    # -- periodic ------------------------------------------------------------------------------
    async def tick(self) -> GatewaySnapshot | None:
        """Drop stale holds, move the throttle one step, persist changes and take a snapshot; None if the
        gateway did not answer (its series then go stale)."""
        now = self.monotonic()
        for key, seen in list(self._holds_seen.items()):
            if now - seen > HOLD_TTL:
                log.warning("dropping a throttle hold whose alert went quiet", extra={"hold": key})
                self.release(key)
        self._trim(now)
        # The gateway's own queue time rises whenever the cap falls, so it would feed on itself: the adaptive
        # throttle follows vLLM's queue time, or the time to first byte of what the gateway let through.
        signals = {"queue_time": self.queue_time(), "ttft": self._ttfb()}
        try:
            answer = await self._request(
                "tick", {"signals": {k: v for k, v in signals.items() if v is not None}}
            )
            snap = decode(GatewaySnapshot, answer["snapshot"])
        except (ChannelError, KeyError, TypeError, ValueError):
            self.snapshot = None
            return None
        self._in_flight = snap.gate.in_flight
        self.traffic.saw(snap.gate, self.clock())
        lapses = answer.get("lapses")
        if isinstance(lapses, int) and lapses != self._lapses:
            self._lapses = lapses
            log.warning(
                "the gateway lifted its holds while this watchdog was silent: re-syncing",
                extra={"target": self.target},
            )
            await self._resync()
        self._history.append((now, snap.proxy.ttfb))
        self.snapshot = snap
        self._save(answer["state"])
        return snap

    def _trim(self, now: float) -> None:
        while len(self._history) > 1 and now - self._history[1][0] >= SIGNAL_WINDOW:
            self._history.popleft()

    def _ttfb(self) -> float | None:
        if len(self._history) < 2:
            return None
        return window_quantile(SIGNAL_QUANTILE, self._history[0][1], self._history[-1][1])

    def _save(self, state: Mapping[str, Any]) -> None:
        """Persist the throttle, breakers and offences (their ends as wall-clock times) when they changed."""
        wall = self.clock()
        left = state.get("breakers")
        breakers = {
            s: [wall + float(v[0]), v[1]] for s, v in (left if isinstance(left, dict) else {}).items()
        }
        records = state.get("offences")
        offences = {
            s: [v[0], wall + float(v[1])] for s, v in (records if isinstance(records, dict) else {}).items()
        }
        doc = {"throttle": state.get("throttle"), "breakers": breakers, "offences": offences}
        # Seconds left shrink every tick: compare whole seconds, so an unchanged breaker is not rewritten.
        text = json.dumps(
            {
                **doc,
                "breakers": {s: [round(v[0]), v[1]] for s, v in breakers.items()},
                "offences": {s: [v[0], round(v[1])] for s, v in offences.items()},
            }
        )
        if text != self._persisted:
            self.store.put(self._key, doc)
            self._persisted = text

    async def persist(self) -> None:
        """Save the throttle and breaker state when it changed, so that a restart keeps it."""
        self._save(await self._request("state"))

    async def apply(self, config: GatewayConfig) -> None:
        """A reloaded config (same listen address, target, upstream): limits, priorities, sessions, bodies."""
        await self._request("apply", {"config": encode(config)})
        self.config = config
        self.breaker_default = config.sessions.breaker_duration

    async def status_json(self) -> dict[str, Any]:
        """GET /api/v1/gateway: read live from the gateway (the last tick's snapshot may be a second old)."""
        status = await self._request("status")
        return {
            "target": self.target,
            "listen": self.listen,
            "upstream": self.config.upstream,
            "pid": status.get("pid"),
            "reachable": self.reachable,
            "restarts": self.restarts,
            "limit": status["limit"],
            "ceiling": self.config.max_in_flight,
            "in_flight": status["in_flight"],
            "draining": status["draining"],
            "throttle": status["throttle"],
            "breakers": status["breakers"],
            "offences": status.get("offences", {}),
        }

    async def aclose(self, grace: float) -> None:
        """Stop the gateway: no new connections, in-flight requests get `grace` seconds."""
        self._following = False
        await self._background.wait(grace)
        await self.link.stop(grace)
