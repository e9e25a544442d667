"""The gateway process's main loop: `python -m vllm_watchdog.gateway` and `vllm-watchdog gateway`.

The gateway carries inference traffic, so nothing the daemon does may slow or stop it: a busy rule evaluation,
a pathological API request, a SIGSTOP or a kill -9 of the daemon. It therefore runs in its own process, keeps
its last limits when the daemon is gone, and lifts drains and throttle holds once the daemon has been silent
past `gateway.control_lease`. The daemon's side, which starts and adopts this process, is `process.py`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import sys
from collections.abc import Mapping
from typing import Any

from ... import logs
from ...errors import ConfigError
from ...fdlimits import raise_open_files_limit
from ...sdnotify import Notifier
from ..protocol.channel import ControlServer
from ..protocol.codec import decode
from ..protocol.spec import EXIT_CANNOT_LISTEN, EXIT_CONTROL_SOCKET, STOP_GRACE, GatewaySpec, spec_for
from .commands import CommandError, GatewayCommands
from .server import GatewayServer

log = logging.getLogger("vllm_watchdog.gateway.main")  # the name its logs had before the sub-packages
LEASE_CHECK = 1.0


def serve(spec: GatewaySpec, env: Mapping[str, str] | None = None) -> int:
    """Run the gateway until SIGTERM/SIGINT; the exit code says why it ended."""
    # First: the listener sizes its connection cap (at most half the soft limit, the rest left for upstream
    # connections and the control channel) from the limit in force when it starts.
    raise_open_files_limit()
    server = GatewayServer(spec.gateway)
    try:
        server.start()
    except OSError as exc:
        log.error("gateway cannot listen", extra={"error": str(exc)})
        return EXIT_CANNOT_LISTEN
    try:
        return asyncio.run(_control(server, spec, Notifier(os.environ if env is None else env)))
    finally:
        server.stop(STOP_GRACE)


async def _control(server: GatewayServer, spec: GatewaySpec, notifier: Notifier) -> int:
    commands = GatewayCommands(server, lease=spec.control_lease)

    async def handle(op: str, args: Mapping[str, Any]) -> Any:
        try:
            return await server.call(lambda: commands.run(op, args))
        except CommandError as exc:
            raise ValueError(str(exc)) from None

    control = ControlServer(spec.control_socket, handle)
    try:
        await control.start()
    except OSError as exc:  # NotTrusted names the path, the owner found and the one expected
        log.error(
            "gateway cannot serve its control socket",
            extra={"control": spec.control_socket, "error": str(exc)},
        )
        return EXIT_CONTROL_SOCKET
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    log.info(
        "gateway serving",
        extra={"target": spec.gateway.target, "listen": server.url, "control": spec.control_socket},
    )
    notifier.ready()
    try:
        while not stop.is_set() and server.running:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(stop.wait(), LEASE_CHECK)
            if server.running:
                await server.call(commands.check_lease)
            notifier.ping()
    finally:
        notifier.stopping()
        await control.close()
    return 0 if stop.is_set() else 1


def _spec_from_config(path: str | None) -> GatewaySpec:
    from ...config.model import load_config  # noqa: PLC0415 - the daemon's spawn path never parses a config
    from ...redact import config_secrets  # noqa: PLC0415

    config = load_config(path, os.environ)
    if config.gateway is None:
        raise ValueError(f"{config.source}: no `gateway:` section")
    logs.use_secrets(config_secrets(config))
    return spec_for(config.gateway, config.state_dir)


def main(argv: list[str] | None = None) -> int:
    """`python -m vllm_watchdog.gateway [--config FILE | --spec-stdin] [--log-level L]`.

    With --config (systemd or compose run it) the `gateway:` section of that file; with --spec-stdin (the
    daemon starts it) a GatewaySpec as JSON on stdin."""
    args = sys.argv[1:] if argv is None else argv
    level = args[args.index("--log-level") + 1] if "--log-level" in args[:-1] else "info"
    logs.setup(level)
    try:
        if "--spec-stdin" in args:
            spec = decode(GatewaySpec, json.loads(sys.stdin.read(1024 * 1024)))
        else:
            spec = _spec_from_config(args[args.index("--config") + 1] if "--config" in args[:-1] else None)
    except (ValueError, TypeError, OSError) as exc:
        print(f"vllm-watchdog gateway: {exc}", file=sys.stderr)
        return 2
    except ConfigError as exc:
        for problem in exc.problems:
            print(problem, file=sys.stderr)
        return 2
    return serve(spec)
