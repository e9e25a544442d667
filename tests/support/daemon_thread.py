"""A real Daemon on its own thread and event loop, for tests that talk to its API over blocking raw sockets."""

from __future__ import annotations

import asyncio
import resource
import threading
from pathlib import Path

from tests.support.vllm_server import free_port
from vllm_watchdog.listener import ListenerLimits
from vllm_watchdog.service.daemon import Daemon, DaemonOptions


def raise_nofile() -> None:
    """Soft RLIMIT_NOFILE up to the hard limit: hostile tests hold hundreds of sockets on both ends."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


class DaemonThread:
    """A daemon with one (unreachable) target and no gateway, serving its API on 127.0.0.1:`port`."""

    def __init__(self, tmp: Path, limits: ListenerLimits, token: str | None = None) -> None:
        self.port = free_port()
        cfg = tmp / "watchdog.yml"
        cfg.write_text(
            (f"api_token: {token}\n" if token else "")
            + f"listen: 127.0.0.1:{self.port}\nstate_dir: {tmp / 'state'}\ndry_run: true\n"
            f"targets:\n  - {{name: vllm-0, url: 'http://127.0.0.1:{free_port()}', canary: false}}\n"
        )
        self._options = DaemonOptions(str(cfg), env={}, api_limits=limits)
        self.daemon: Daemon  # built on the daemon's thread, before __enter__ returns
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._failure: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="test-daemon", daemon=True)

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)

        async def main() -> None:
            # Built on this thread: its SQLite connections may be used only where they were opened.
            self.daemon = Daemon.load(self._options)
            ready = asyncio.Event()
            task = asyncio.create_task(self.daemon.run(ready))
            await asyncio.wait([task, asyncio.create_task(ready.wait())], return_when="FIRST_COMPLETED")
            self._ready.set()
            await task

        try:
            self._loop.run_until_complete(main())
        except BaseException as exc:
            self._failure = exc
        finally:
            self._ready.set()
            self._loop.close()

    def __enter__(self) -> DaemonThread:
        self._thread.start()
        self._ready.wait(30)
        if self._failure is not None:
            raise RuntimeError("the daemon did not start") from self._failure
        return self

    def __exit__(self, *exc: object) -> None:
        if self._thread.is_alive():
            self._loop.call_soon_threadsafe(self.daemon.stop)
        self._thread.join(20)
