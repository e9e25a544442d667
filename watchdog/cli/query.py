"""`vllm-watchdog query`: one PromQL expression against live targets."""

# ruff: noqa: PLC0415

from __future__ import annotations

import argparse
import sys
from typing import Any

from .. import logs
from ..exitcodes import EXIT_CONFIG, EXIT_USAGE
from .common import add_command, load


def add_parser(sub: Any) -> None:
    """Register `query` and its arguments."""
    query = add_command(
        sub,
        "query",
        handle,
        "evaluate a PromQL expression against live targets once",
        "Scrape every target once (or ask the configured rule_backend) and print the result "
        "of one PromQL expression. Exit 0 on success, 1 on an invalid expression or a failed evaluation, "
        "3 on an invalid config, 4 when no target (or the rule_backend) answers.",
    )
    query.add_argument("expr", help="PromQL expression, e.g. 'vllm:num_requests_waiting > 2'")
    query.add_argument("--time", help="evaluation time, RFC 3339 or unix seconds (default: now)")
    query.add_argument(
        "--output", "-o", choices=["text", "json"], default="text", help="json: the API's `data` object"
    )


def handle(args: argparse.Namespace) -> int:
    """Scrape every target once, evaluate one expression, and print the result."""
    from ..commands.query import parse_time, run_query

    logs.setup("error", fmt="text")
    try:
        at = None if args.time is None else parse_time(args.time)
    except ValueError as exc:
        print(f"vllm-watchdog query: --time: {exc}", file=sys.stderr)
        return EXIT_USAGE
    loaded = load(args)
    if loaded is None:
        return EXIT_CONFIG
    return run_query(loaded[0], args.expr, sys.stdout, sys.stderr, at=at, output=args.output)
