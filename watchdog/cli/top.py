"""`vllm-watchdog top`: a live table of a running watchdog."""

# ruff: noqa: PLC0415

from __future__ import annotations

import argparse
import sys
from typing import Any

from ..exitcodes import EXIT_CONFIG
from .common import API_URL_HELP, add_command, api_endpoint


def add_parser(sub: Any) -> None:
    """Register `top` and its options."""
    top = add_command(
        sub,
        "top",
        handle,
        "live table of a running watchdog",
        "Show targets (health, canary, queue, KV, throughput, spec acceptance), the gateway, firing "
        "alerts, recent actions and open session breakers, read from a running watchdog's API and "
        "refreshed every --interval. vLLM values come from the watchdog's sample store: a family that no "
        "rule reads shows '-' unless global.keep_unreferenced is true. The token, if the API needs one, "
        "comes from VLLM_WATCHDOG_TOKEN. Not on a terminal it prints plain frames, without screen escapes. "
        "With --fleet it shows the watchdog's fleet group instead, as etcd has it. "
        "Exit 0, or 4 if --once cannot read the API (or, with --fleet, etcd behind it).",
    )
    top.add_argument("--url", help=API_URL_HELP)
    top.add_argument("--interval", type=float, default=1.0, help="seconds between refreshes")
    top.add_argument("--once", action="store_true", help="print one frame and exit (4 if unreachable)")
    top.add_argument("--actions", type=int, default=8, help="how many recent actions to show")
    top.add_argument("--no-color", action="store_true", help="no ANSI colours (none when not a terminal)")
    top.add_argument(
        "--fleet",
        action="store_true",
        help="the watchdog's fleet group instead: every member's targets, firing alerts, running and waiting "
        "actions, and the holds (read from etcd by the watchdog, GET /api/v1/fleet)",
    )


def handle(args: argparse.Namespace) -> int:
    """A live table of targets, gateway, alerts and actions, read from a running watchdog's API."""
    from ..commands.top import run_top

    endpoint = api_endpoint(args)
    if endpoint is None:
        return EXIT_CONFIG
    url, token = endpoint
    color = sys.stdout.isatty() and not args.no_color
    return run_top(
        url,
        interval=max(args.interval, 0.1),
        once=args.once,
        out=sys.stdout,
        actions=args.actions,
        token=token,
        color=color,
        plain=not sys.stdout.isatty(),
        fleet=args.fleet,
    )
