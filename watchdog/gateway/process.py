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

from .channel import ChannelError, ControlClient
from .codec import encode
from .config import GatewayConfig
from .spec import EXIT_CANNOT_LISTEN, STOP_GRACE, GatewaySpec, spec_for

log = logging.getLogger(__name__)
START_TIMEOUT = 60.0  # a new gateway process must answer on its control socket within this


class StaleGateway(Exception):
    """The gateway on our socket serves another target, address or upstream than the config says."""

    def __init__(self, message: str, pid: int | None) -> None:
        super().__init__(message)
        self.pid = pid


def process_link(gateway: GatewayConfig, state_dir: str | None) -> GatewayProcess:
    """The daemon's link to the gateway process a config describes."""
    return GatewayProcess(spec_for(gateway, state_dir), supervise=gateway.supervise)


class GatewayProcess:
    """Starts the gateway process, or adopts one that already answers; starts a new one when it died."""

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
        self._child: subprocess.Popen[bytes] | None = None
        self.pid: int | None = None
        self.starts = 0  # processes this daemon started (the first one included)

    async def attach(self) -> dict[str, Any]:
        """Reach the gateway: adopt a running one, else start one (supervised); returns its hello.
        OSError if it cannot be started or cannot listen."""
        try:
            return await self._hello()
        except ChannelError:
            pass
        except StaleGateway as exc:
            if not self.supervise:
                raise OSError(str(exc)) from None
            # Ours (same state_dir, target and listen address), started before a config change: replace it.
            log.warning("stopping a gateway that serves an old config", extra={"why": str(exc)})
            await self.client.aclose()
            if exc.pid is not None:
                await self._retire(exc.pid, 0.0)
        if not self.supervise:  # systemd or compose starts it, and may not have yet
            raise OSError(f"no gateway answers on {self.spec.control_socket}")
        return await self._start()

    async def _retire(self, pid: int, grace: float) -> None:
        """SIGTERM (in-flight requests get `grace` and the gateway's own STOP_GRACE), then SIGKILL."""
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
        deadline = self._monotonic() + grace + STOP_GRACE + 5.0
        while self._monotonic() < deadline:  # usually not our child: no event to wait on
            if _gone(pid):
                return
            await asyncio.sleep(0.05)
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)

    async def _hello(self) -> dict[str, Any]:
        hello = await self.client.request("hello", timeout=2.0)
        if not isinstance(hello, dict):
            raise ChannelError("bad hello")
        config = self.spec.gateway
        ours = (config.target, f"{config.listen_host}:{config.listen_port}", config.upstream)
        theirs = (hello.get("target"), hello.get("listen"), hello.get("upstream"))
        pid = hello.get("pid")
        if theirs != ours:
            raise StaleGateway(
                f"the gateway on {self.spec.control_socket} serves {theirs[0]!r} on {theirs[1]} for "
                f"{theirs[2]}, not {ours[0]!r} on {ours[1]} for {ours[2]}",
                pid if isinstance(pid, int) else None,
            )
        self.pid = pid if isinstance(pid, int) else self.pid
        return hello

    def _spawn(self) -> subprocess.Popen[bytes]:
        """Start the process and hand it its spec; systemd's variables stay ours (not the main process)."""
        drop = ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID")
        child = subprocess.Popen(
            [self._python, "-m", "vllm_watchdog.gateway", "--spec-stdin", "--log-level", self._log_level],
            stdin=subprocess.PIPE,
            env={k: v for k, v in os.environ.items() if k not in drop},
            start_new_session=True,  # a Ctrl-C or a kill of the daemon's group does not reach the data plane
        )
        self._child, self.pid = child, child.pid
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
                self._child = None
                target = self.spec.gateway
                if code == EXIT_CANNOT_LISTEN:
                    raise OSError(f"gateway cannot listen on {target.listen_host}:{target.listen_port}")
                raise OSError(f"the gateway process exited with code {code} during start-up")
            with contextlib.suppress(ChannelError):
                return await self._hello()
            if self._monotonic() > deadline:
                self._kill(child)
                raise OSError(f"the gateway process did not answer within {START_TIMEOUT:.0f} s")

    def alive(self) -> bool:
        """Whether the gateway process (ours or adopted) still exists."""
        if self._child is not None:
            return self._child.poll() is None
        return self.pid is not None and not _gone(self.pid)

    async def request(self, op: str, args: Mapping[str, Any] | None = None) -> Any:
        """One command to the gateway (ChannelError if it cannot be reached, CommandRefused if refused)."""
        return await self.client.request(op, args)

    async def revive(self) -> dict[str, Any] | None:
        """After a failed command: start a new gateway if the old one is gone (supervised), or find the one
        another supervisor started; its hello, or None if there is none (yet) or the old one lives (slow)."""
        if not self.supervise:
            try:
                return await self._hello()
            except (ChannelError, StaleGateway):
                return None
        if self.alive():
            return None
        log.error(
            "the gateway process is gone: starting a new one", extra={"target": self.spec.gateway.target}
        )
        self._child = None
        return await self._start()

    async def stop(self, grace: float) -> None:
        """Stop the gateway process (supervised only): in-flight requests get `grace` seconds."""
        await self.client.aclose()
        if not self.supervise or self.pid is None or not self.alive():
            return
        await self._retire(self.pid, grace)
        if self._child is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._child.wait(1.0)
            self._child = None

    @staticmethod
    def _kill(child: subprocess.Popen[bytes]) -> None:
        child.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            child.wait(5.0)


def _gone(pid: int) -> bool:
    """Whether the process has ended (reaped here if it was our child)."""
    with contextlib.suppress(ChildProcessError):
        if os.waitpid(pid, os.WNOHANG)[0] == pid:
            return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:  # alive, another user's
        return False
    return False
