"""`vllm-watchdog init`: a starting config for the vLLM servers on this host."""

# ruff: noqa: PLC0415

from __future__ import annotations

import argparse
import sys
from typing import Any

from ..exitcodes import EXIT_USAGE
from .common import add_command


def add_parser(sub: Any) -> None:
    """Register `init` and its options."""
    init = add_command(
        sub,
        "init",
        handle,
        "write a starting config for the vLLM servers on this host",
        "Find the vLLM servers on this host (TCP ports listening on loopback or every address whose /metrics "
        "has vllm: series or whose /v1/models is vLLM's; their Docker containers when Docker answers) and "
        "write a commented config that watches them, monitoring only, with examples of actions. Exit 0, "
        "or 1 if FILE exists.",
        config=False,
    )
    init.add_argument("--output", "-o", metavar="FILE", help="write here (never over a file); default stdout")
    init.add_argument("--ports", help="only these ports, e.g. 8000,8080-8089 (default: every listening one)")
    init.add_argument(
        "--listen",
        metavar="HOST:PORT",
        help="the watchdog's own API address (default 127.0.0.1:9460, or the next free port up to 9479)",
    )


def handle(args: argparse.Namespace) -> int:
    """Write a commented starting config for the vLLM servers found on this host."""
    from ..commands.init import parse_ports, run_init

    try:
        ports = parse_ports(args.ports) if args.ports else None
    except ValueError as exc:
        print(f"vllm-watchdog init: --ports: {exc}", file=sys.stderr)
        return EXIT_USAGE
    if args.listen is not None and not _host_port(args.listen):
        print(f"vllm-watchdog init: --listen: expected HOST:PORT, got {args.listen!r}", file=sys.stderr)
        return EXIT_USAGE
    return run_init(args.output, sys.stdout, sys.stderr, ports=ports, listen=args.listen)


def _host_port(text: str) -> bool:
    host, _, port = text.rpartition(":")
    return bool(host) and port.isdigit() and 0 < int(port) < 65536 and " " not in host
