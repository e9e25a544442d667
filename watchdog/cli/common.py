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
API_URL_HELP = "the watchdog's API; default: the `listen` of --config, else http://127.0.0.1:9460"

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


def api_endpoint(args: argparse.Namespace) -> tuple[str, str | None] | None:
    """The API's URL and token a client command uses: --url, else the `listen` of --config, else API_URL; the
    token from VLLM_WATCHDOG_TOKEN, else --config's `api_token`. None after printing the config's problems."""
    token = os.environ.get("VLLM_WATCHDOG_TOKEN") or None
    if args.config is None:
        return args.url or API_URL, token
    from ..config.model import load_config

    try:
        config = load_config(args.config, os.environ)
    except ConfigError as exc:
        print_problems(exc)
        return None
    host = {"": "127.0.0.1", "0.0.0.0": "127.0.0.1", "::": "::1"}.get(config.listen_host, config.listen_host)
    url = f"http://[{host}]:{config.listen_port}" if ":" in host else f"http://{host}:{config.listen_port}"
    return args.url or url, token or config.api_token
