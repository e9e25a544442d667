"""`vllm-watchdog fleet`: every member of the config's fleet group, from etcd."""

# ruff: noqa: PLC0415

from __future__ import annotations

import argparse
import sys
from typing import Any

from .. import logs
from ..exitcodes import EXIT_CONFIG, EXIT_FAILED, EXIT_OK, EXIT_USAGE
from .common import add_command, load


def add_parser(sub: Any) -> None:
    """Register `fleet`."""
    add_command(
        sub,
        "fleet",
        handle,
        "list every member of the fleet group, from etcd",
        "Read the fleet group's members from etcd and print each one's targets, firing alerts and running "
        "and waiting actions. Exit 0, 1 if etcd could not be read, 2 without a fleet: section, 3 on an "
        "invalid config.",
    )


def handle(args: argparse.Namespace) -> int:
    """List every member of the config's fleet group, from etcd."""
    logs.setup("error", fmt="text")
    loaded = load(args)
    if loaded is None:
        return EXIT_CONFIG
    if loaded[0].fleet is None:
        print("vllm-watchdog fleet: the config has no fleet: section", file=sys.stderr)
        return EXIT_USAGE
    from ..commands.fleet import print_fleet

    return EXIT_OK if print_fleet(loaded[0], sys.stdout, sys.stderr) else EXIT_FAILED
