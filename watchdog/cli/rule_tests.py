"""`vllm-watchdog test-rules`: rule unit tests written for `promtool test rules`."""

# ruff: noqa: PLC0415

from __future__ import annotations

import argparse
import sys
from typing import Any

from .. import logs
from .common import add_command


def add_parser(sub: Any) -> None:
    """Register `test-rules` and its arguments."""
    tests = add_command(
        sub,
        "test-rules",
        handle,
        "run rule unit tests (promtool test rules format)",
        "Run rule unit tests in the format of `promtool test rules`. Exit 0 if all pass, else 1.",
        config=False,
    )
    tests.add_argument("files", nargs="+", metavar="FILE", help="unit-test files")


def handle(args: argparse.Namespace) -> int:
    """Run rule unit tests written for `promtool test rules`."""
    from ..promtool.runner import run_rule_tests

    logs.setup("error", fmt="text")
    return run_rule_tests(list(args.files), sys.stdout, sys.stderr)
