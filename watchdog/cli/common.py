"""What the sub-commands share: the --config option, loading a config with its rules, printing problems."""

# ruff: noqa: PLC0415

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..errors import ConfigError
from ..redact import Redactor

if TYPE_CHECKING:
    from ..config.model import Config
    from ..ruler.files import RuleGroup

CONFIG_HELP = "config file (YAML); omitted: the embedded defaults (one vLLM on 127.0.0.1:8000)"
LOG_LEVELS = ["debug", "info", "warning", "error"]
API_URL = "http://127.0.0.1:9460"
API_URL_HELP = "the watchdog's API (its `listen`)"

Handler = Callable[[argparse.Namespace], int]


def print_problems(exc: ConfigError) -> None:
    """Print each problem as file:line: field: message, masked."""
    # The shapes the log masks (URL passwords, `--api-key X`) in rule-file problems too; values substituted
    # into secret fields are masked in config problems already (config.model._masked).
    red = Redactor()
    for p in exc.problems:
        print(f"{p.file}:{p.line}: {red.text(p.field)}: {red.text(p.message)}", file=sys.stderr)


def load(args: argparse.Namespace, path: str | None = None) -> tuple[Config, tuple[RuleGroup, ...]] | None:
    """Config and rules of `path` (default --config), or None after printing every problem."""
    from ..service.loading import load_all

    try:
        return load_all(path or args.config, os.environ)
    except ConfigError as exc:
        print_problems(exc)
        return None


def add_command(
    sub: Any,
    name: str,
    func: Handler,
    summary: str,
    description: str,
    *,
    config: bool = True,
) -> argparse.ArgumentParser:
    """One sub-command, with --config unless it reads no config."""
    parser: argparse.ArgumentParser = sub.add_parser(name, help=summary, description=description)
    if config:
        parser.add_argument("--config", "-c", help=CONFIG_HELP)
    parser.set_defaults(func=func)
    return parser
