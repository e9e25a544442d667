"""The `vllm-watchdog` command line: run, check, targets, fleet, query, test-rules, replay, top, init, reload
and incident.

Each sub-command is one module here with `add_parser(subparsers)` (its arguments) and `handle(args)` (its
exit status); adding a command is adding a module and naming it in COMMANDS.
"""

# Each handler imports what only its sub-command uses: `--version`, `check` and `test-rules` (CI runs it once
# per file) then start without the daemon, the gateway, an HTTP client or asyncio (tests/test_cli_imports.py).

from __future__ import annotations

import argparse
from collections.abc import Sequence

from .. import __version__
from . import check, fleet, gateway, incident, init, query, reload, replay, rule_tests, run, targets, top

EXIT_HELP = """exit status (every command):
  0  ok
  1  ran and found problems: a target down, a rule test or a query failed
  2  usage error: the command line is wrong
  3  the config or a rule file is invalid (also a reload the daemon rejected)
  4  the daemon's API, or every target or the rule_backend, could not be reached"""

# In the order `--help` lists them.
COMMANDS = (run, gateway, check, targets, fleet, query, rule_tests, replay, top, init, reload, incident)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser with one sub-parser per command."""
    parser = argparse.ArgumentParser(
        prog="vllm-watchdog",
        description="Watch and remediate vLLM servers.",
        epilog=EXIT_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"vllm-watchdog {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for command in COMMANDS:
        command.add_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `vllm-watchdog` console script."""
    args = build_parser().parse_args(argv)
    return int(args.func(args))
