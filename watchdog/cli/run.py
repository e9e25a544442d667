"""`vllm-watchdog run`: the daemon, until SIGTERM."""

# ruff: noqa: PLC0415

from __future__ import annotations

import argparse
import sys
from typing import Any

from .. import logs
from ..config.durations import parse_size
from ..errors import ConfigError
from ..exitcodes import EXIT_CONFIG, EXIT_FAILED, EXIT_OK
from .common import LOG_LEVELS, add_command, print_problems


def add_parser(sub: Any) -> None:
    """Register `run` and its options."""
    run = add_command(sub, "run", handle, "run the daemon", "Run the watchdog daemon until SIGTERM.")
    run.add_argument("--log-level", default="info", choices=LOG_LEVELS)
    run.add_argument("--log-format", default="auto", choices=["auto", "json", "text"])
    run.add_argument(
        "--record",
        metavar="FILE",
        help="append every scrape, probe and NVML reading to a compressed, rotated scrape log "
        "(FILE.NNNNNN.gz) that `replay` reads",
    )
    run.add_argument(
        "--record-max-bytes", type=parse_size, default=64 << 20, help="rotate segments at this size"
    )
    run.add_argument("--record-keep", type=int, default=8, help="segments kept after rotation")
    run.add_argument(
        "--external-gateway",
        action="store_true",
        help="another supervisor (systemd's vllm-watchdog-gateway.service, a compose service) runs the "
        "gateway "
        "process: attach to it and never start one",
    )


def handle(args: argparse.Namespace) -> int:
    """Run the daemon until SIGTERM."""
    import asyncio

    from ..fdlimits import raise_open_files_limit
    from ..service.daemon import Daemon, DaemonOptions

    logs.setup(args.log_level, fmt=args.log_format)
    raise_open_files_limit()  # first: the listeners size their connection caps from it
    try:
        daemon = Daemon.load(
            DaemonOptions(
                args.config,
                record=args.record,
                record_max_bytes=args.record_max_bytes,
                record_keep=args.record_keep,
                external_gateway=args.external_gateway,
            )
        )
        asyncio.run(daemon.run())
    except ConfigError as exc:
        print_problems(exc)
        return EXIT_CONFIG
    except OSError as exc:
        print(f"vllm-watchdog: {exc}", file=sys.stderr)
        return EXIT_FAILED
    return EXIT_OK
