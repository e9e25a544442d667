"""`vllm-watchdog incident`: list the incident bundles, or show one."""

# ruff: noqa: PLC0415

from __future__ import annotations

import argparse
import sys
from typing import Any

from ..exitcodes import EXIT_CONFIG
from .common import add_command, load


def add_parser(sub: Any) -> None:
    """Register `incident` and its arguments."""
    incident = add_command(
        sub,
        "incident",
        handle,
        "list incident bundles, or show one",
        "`list` the incident bundles in the config's state_dir/incidents, newest first; `show ID` prints one "
        "as a summary: what fired, what was done (and its outcome), where each vLLM thread was, what the "
        "GPUs said, and the last log lines. Exit 0, 1 if the bundle cannot be read, 2 without a state_dir or "
        "ID.",
    )
    incident.add_argument("verb", choices=["list", "show"])
    incident.add_argument("id", nargs="?", help="the incident's id (show)")
    incident.add_argument("--frames", type=int, default=5, help="innermost frames shown per thread")
    incident.add_argument("--lines", type=int, default=20, help="last log lines shown")


def handle(args: argparse.Namespace) -> int:
    """List the incident bundles of the config's state_dir, or show one as a readable summary."""
    from ..commands.incident import run_incident

    loaded = load(args)
    if loaded is None:
        return EXIT_CONFIG
    return run_incident(
        loaded[0], args.verb, args.id, sys.stdout, sys.stderr, frames=args.frames, lines=args.lines
    )
