"""`vllm-watchdog reload`: make a running watchdog reload its config."""

# ruff: noqa: PLC0415

from __future__ import annotations

import argparse
import sys
from typing import Any

from ..exitcodes import EXIT_CONFIG
from .common import API_URL_HELP, add_command, api_endpoint


def add_parser(sub: Any) -> None:
    """Register `reload` and its options."""
    reload = add_command(
        sub,
        "reload",
        handle,
        "make a running watchdog reload its config",
        "Ask a running watchdog to reload its config and rule files, and wait for the outcome: with "
        "VLLM_WATCHDOG_TOKEN through POST /-/reload (the problems are printed), else with --pid by SIGHUP, "
        "reading the outcome from /metrics. Exit 0 when applied, 3 when rejected (the old config stays), "
        "4 when the API cannot be reached. systemd's ExecReload runs it, so `systemctl reload` fails too.",
    )
    reload.add_argument("--url", help=API_URL_HELP)
    reload.add_argument("--pid", type=int, help="the daemon's pid (systemd: $MAINPID), for SIGHUP")
    reload.add_argument("--timeout", type=float, default=30.0, help="seconds to wait for the outcome")


def handle(args: argparse.Namespace) -> int:
    """Make a running daemon reload its config; exit non-zero when it rejected it (ExecReload)."""
    from ..commands.reload import run_reload

    endpoint = api_endpoint(args)
    if endpoint is None:
        return EXIT_CONFIG
    url, token = endpoint
    return run_reload(url, token=token, pid=args.pid, err=sys.stderr, timeout=args.timeout)
