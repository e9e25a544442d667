"""The daemon's side of the gateway process: starts it, adopts one that already runs, starts a new one if it
died, and stops it.

The gateway runs in a process of its own (`python -m vllm_watchdog.gateway`, `main.py`), so that nothing the
daemon does may slow or stop inference traffic. The daemon starts it (or, with `gateway.supervise: false`,
finds one that systemd or compose runs), adopts a running one after its own restart without dropping a
stream, and starts a new one if it dies. It speaks to it only over the control channel: nothing here imports
the gateway's server.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from typing import Any

from ..config import GatewayConfig
from ..protocol.channel import ChannelError, ControlClient
from ..protocol.codec import encode
from ..protocol.spec import EXIT_CANNOT_LISTEN, EXIT_CONTROL_SOCKET, STOP_GRACE, GatewaySpec, spec_for
from ..protocol.trust import Peer
from .pinned import PinnedProcess, pin

log = logging.getLogger("vllm_watchdog.gateway.process")  # the name its logs had before the sub-packages
START_TIMEOUT = 60.0  # a new gateway process must answer on its control socket within this


def process_link(gateway: GatewayConfig, state_dir: str | None) -> GatewayProcess:
    """The daemon's link to the gateway process a config describes."""
    return GatewayProcess(spec_for(gateway, state_dir), supervise=gateway.supervise)


class GatewayProcess:
    """Starts the gateway process, or adopts one that already answers; starts a new one when it died. Signals
    go only to a process it holds (`pinned.py`), never to a pid the gateway merely names."""

    def __init__(
        self,
        spec: GatewaySpec,
        *,
        supervise: bool = True,
        python: str = sys.executable,
        log_level: str | None = None,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.spec = spec
        self.supervise = supervise
        self.client = ControlClient(spec.control_socket)
        self._python = python
        self._log_level = log_level or logging.getLevelName(logging.getLogger().getEffectiveLevel()).lower()
        self._monotonic = monotonic
        self._process: PinnedProcess | None = None  # the gateway this side may signal
        self._unpinned = False  # adopted a gateway it could not verify: attached to, never signalled
        self.starts = 0  # processes this daemon started (the first one included)

    @property
    def pid(self) -> int | None:
        """The pid of the gateway process this side holds (started or verified), if any."""
        return None if self._process is None else self._process.pid

    async def attach(self) -> dict[str, Any]:
        """Reach the gateway: adopt a running one, else start one (supervised); returns its hello.
        OSError if it cannot be started or cannot listen."""
        hello: dict[str, Any] | None = None
        process: PinnedProcess | None = None
        try:
            hello, peer = await self._ask()
            process = await self._pin(peer, hello) if self.supervise else None
        except ChannelError:
            hello = None
        if hello is not None:
            stale = self._stale(hello)
            if stale is None:
                self._process, self._unpinned = process, self.supervise and process is None
                return hello
            if not self.supervise:
                raise OSError(stale)
            if process is None:
                raise OSError(f"{stale}; it is not the process it claims to be, so it is not stopped")
            # Ours (same state_dir, target and listen address), started before a config change: replace it.
            log.warning("stopping a gateway that serves an old config", extra={"why": stale})
            await self.client.aclose()
            await self._retire(process, 0.0)
            process.close()
        if not self.supervise:  # systemd or compose starts it, and may not have yet
            raise OSError(f"no gateway answers on {self.spec.control_socket}")
        return await self._start()

    async def _ask(self) -> tuple[dict[str, Any], Peer]:
        """The gateway's hello, and the verified process that answered it."""
        hello = await self.client.request("hello", timeout=2.0)
        peer = self.client.peer
        if not isinstance(hello, dict) or peer is None:
            raise ChannelError("bad hello")
        return hello, peer

    def _stale(self, hello: Mapping[str, Any]) -> str | None:
        """Why the gateway that said `hello` is not the one the config describes; None if it is."""
        config = self.spec.gateway
        ours = (config.target, f"{config.listen_host}:{config.listen_port}", config.upstream)
        theirs = (hello.get("target"), hello.get("listen"), hello.get("upstream"))
        if theirs == ours:
            return None
        return (
            f"the gateway on {self.spec.control_socket} serves {theirs[0]!r} on {theirs[1]} for "
            f"{theirs[2]}, not {ours[0]!r} on {ours[1]} for {ours[2]}"
        )

    async def _pin(self, peer: Peer, hello: Mapping[str, Any]) -> PinnedProcess | None:
        """A pidfd on the gateway that answered, if it is the process it claims to be (`pinned.py`)."""
        process = pin(peer, hello.get("pid"), self.client.euid, self.spec.control_socket)
        if process is None:
            return None
        # Its pid could have been taken over between the connection and the pidfd: an answer on the same
        # connection after it shows the listener still ran, so the pidfd holds that very process.
        try:
            await self._ask()
        except ChannelError:
            process.close()
            raise
        if self.client.peer is not peer:
            process.close()
            raise ChannelError("the gateway's control connection changed while it was being verified")
        return process

    async def _retire(self, process: PinnedProcess, grace: float) -> None:
        """SIGTERM (in-flight requests get `grace` and the gateway's own STOP_GRACE), then SIGKILL."""
        process.send(signal.SIGTERM)
        deadline = self._monotonic() + grace + STOP_GRACE + 5.0
        while self._monotonic() < deadline:  # usually not our child: no event to wait on
            if not process.alive():
                return
            await asyncio.sleep(0.05)
        process.send(signal.SIGKILL)

    def _spawn(self) -> subprocess.Popen[bytes]:
        """Start the process and hand it its spec; systemd's variables stay ours (not the main process)."""
        drop = ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID")
        child = subprocess.Popen(
            [self._python, "-m", "vllm_watchdog.gateway", "--spec-stdin", "--log-level", self._log_level],
            stdin=subprocess.PIPE,
            env={k: v for k, v in os.environ.items() if k not in drop},
            start_new_session=True,  # a Ctrl-C or a kill of the daemon's group does not reach the data plane
        )
        self._let_go()
        self._process = PinnedProcess(child.pid, child=child)
        self.starts += 1
        assert child.stdin is not None
        child.stdin.write(json.dumps(encode(self.spec)).encode())
        child.stdin.close()
        return child

    async def _start(self) -> dict[str, Any]:
        child = self._spawn()
        deadline = self._monotonic() + START_TIMEOUT
        while True:
            await asyncio.sleep(0.05)
            code = child.poll()
            if code is not None:
                self._process = None
                raise OSError(self._exit_reason(code))
            with contextlib.suppress(ChannelError):
                hello, peer = await self._ask()
                if peer.pid == child.pid:
                    return hello
                # Not our child (an old gateway still answering on the path it is about to take): ask again.
                await self.client.aclose()
            if self._monotonic() > deadline:
                self._kill(child)
                raise OSError(f"the gateway process did not answer within {START_TIMEOUT:.0f} s")

    def _exit_reason(self, code: int) -> str:
        target = self.spec.gateway
        if code == EXIT_CANNOT_LISTEN:
            return f"gateway cannot listen on {target.listen_host}:{target.listen_port}"
        if code == EXIT_CONTROL_SOCKET:
            return f"gateway cannot serve its control socket {self.spec.control_socket} (its log says why)"
        return f"the gateway process exited with code {code} during start-up"

    def alive(self) -> bool:
        """Whether the gateway process this side holds (started or verified) still exists."""
        return self._process is not None and self._process.alive()

    async def request(self, op: str, args: Mapping[str, Any] | None = None) -> Any:
        """One command to the gateway (ChannelError if it cannot be reached, CommandRefused if refused)."""
        return await self.client.request(op, args)

    async def revive(self) -> dict[str, Any] | None:
        """After a failed command: start a new gateway if the old one is gone (supervised), or find the one
        another supervisor started; its hello, or None if there is none (yet) or the old one lives (slow)."""
        if not self.supervise or self._unpinned:  # not ours to start: it answers again, or it does not
            try:
                hello, _ = await self._ask()
            except ChannelError:
                return None
            return hello if self._stale(hello) is None else None
        if self.alive():
            return None
        log.error(
            "the gateway process is gone: starting a new one", extra={"target": self.spec.gateway.target}
        )
        return await self._start()

    async def stop(self, grace: float) -> None:
        """Stop the gateway process (supervised only): in-flight requests get `grace` seconds."""
        await self.client.aclose()
        process = self._process
        if not self.supervise or process is None or not process.alive():
            return
        await self._retire(process, grace)
        if process.child is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.child.wait(1.0)
        self._let_go()

    def _let_go(self) -> None:
        if self._process is not None:
            self._process.close()
            self._process = None

    @staticmethod
    def _kill(child: subprocess.Popen[bytes]) -> None:
        child.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            child.wait(5.0)
