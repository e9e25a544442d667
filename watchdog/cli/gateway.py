"""`vllm-watchdog gateway`: the admission gateway as a process of its own."""

# ruff: noqa: PLC0415

from __future__ import annotations

import argparse
from typing import Any

from .common import LOG_LEVELS, add_command


def add_parser(sub: Any) -> None:
    """Register `gateway` and its options."""
    gateway = add_command(
        sub,
        "gateway",
        handle,
        "run the admission gateway process",
        "Run the `gateway:` of the config as a process of its own, as the daemon would start it; the daemon "
        "attaches to it over its control socket.",
    )
    gateway.add_argument("--log-level", default="info", choices=LOG_LEVELS)


def handle(args: argparse.Namespace) -> int:
    """Run the gateway process alone (systemd's vllm-watchdog-gateway.service, compose's gateway service)."""
    from ..gateway.dataplane.main import main as gateway_main  # the gateway imports no daemon code

    argv = ["--log-level", args.log_level]
    if args.config:
        argv += ["--config", args.config]
    return gateway_main(argv)
