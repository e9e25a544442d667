"""`vllm-watchdog targets`: scrape every target once and print their state."""

# ruff: noqa: PLC0415

from __future__ import annotations

import argparse
import sys
from typing import Any

from .. import logs
from ..exitcodes import EXIT_CONFIG, EXIT_FAILED, EXIT_OK
from .common import add_command, load


def add_parser(sub: Any) -> None:
    """Register `targets`."""
    add_command(
        sub,
        "targets",
        handle,
        "scrape every target once and print their state",
        "Scrape, health-probe and canary every target once and print a table. "
        "Exit 0 if all are up, 1 if any is not, 3 on an invalid config.",
    )


def handle(args: argparse.Namespace) -> int:
    """Scrape every target once and print a table of their state."""
    logs.setup("error", fmt="text")
    loaded = load(args)
    if loaded is None:
        return EXIT_CONFIG
    from ..commands.targets import print_targets

    return EXIT_OK if print_targets(loaded[0], sys.stdout) else EXIT_FAILED
