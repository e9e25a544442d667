"""The `vllm-watchdog` command line: run, check, targets (later issues add more)."""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from collections.abc import Sequence

import httpx

from . import __version__, logs
from .config import Config
from .daemon import Daemon, load_all
from .errors import ConfigError
from .monitor import Monitor

EXIT_OK, EXIT_INVALID, EXIT_DOWN = 0, 1, 2
CONFIG_HELP = "config file (YAML); omitted: the embedded defaults (one vLLM on 127.0.0.1:8000)"


def _print_problems(exc: ConfigError) -> None:
    for problem in exc.problems:
        print(problem, file=sys.stderr)


def cmd_run(args: argparse.Namespace) -> int:
    """Run the daemon until SIGTERM."""
    logs.setup(args.log_level, fmt=args.log_format)
    try:
        asyncio.run(Daemon(args.config).run())
    except ConfigError as exc:
        _print_problems(exc)
        return EXIT_INVALID
    except OSError as exc:
        print(f"vllm-watchdog: {exc}", file=sys.stderr)
        return EXIT_INVALID
    return EXIT_OK


def cmd_check(args: argparse.Namespace) -> int:
    """Validate config and rule files; print every problem as file:line: field: message."""
    try:
        config, rules = load_all(args.config, os.environ)
    except ConfigError as exc:
        _print_problems(exc)
        return EXIT_INVALID
    n_rules = sum(len(g.rules) for g in rules)
    print(f"{config.source}: OK: {len(config.targets)} targets, {len(rules)} rule groups, {n_rules} rules")
    for path in config.rule_files:
        print(f"  {path}: OK")
    return EXIT_OK


async def _scrape_once(config: Config) -> Monitor:
    monitor = Monitor(config, (), client_factory=lambda: httpx.AsyncClient(trust_env=False), keep_all=True)
    try:
        now = time.time()
        jobs = []
        for name in monitor.targets:
            jobs += [
                monitor.scrape(name, now),
                monitor.probe_health(name, now),
                monitor.probe_canary(name, now),
            ]
        await asyncio.gather(*jobs)
    finally:
        await monitor.aclose()
    return monitor


def _fmt_probe(ok: bool | None, latency: float) -> str:
    if ok is None:
        return "-"
    return f"{'ok' if ok else 'FAIL'} {latency * 1000:.0f}ms"


def cmd_targets(args: argparse.Namespace) -> int:
    """Scrape every target once and print a table of their state."""
    logs.setup("error", fmt="text")
    try:
        config, _ = load_all(args.config, os.environ)
    except ConfigError as exc:
        _print_problems(exc)
        return EXIT_INVALID
    monitor = asyncio.run(_scrape_once(config))
    rows = [("TARGET", "URL", "UP", "SAMPLES", "SCRAPE", "HEALTH", "CANARY", "ERROR")]
    all_up = True
    for rt in monitor.targets.values():
        st = rt.scrape.status
        canary = rt.canary.status if rt.canary else None
        errors = [e for e in (st.last_error, rt.health.status.last_error, canary and canary.last_error) if e]
        all_up = all_up and st.up and bool(rt.health.status.ok) and (canary is None or bool(canary.ok))
        rows.append(
            (
                rt.config.name,
                rt.config.url,
                "1" if st.up else "0",
                str(st.samples),
                f"{st.last_duration * 1000:.0f}ms",
                _fmt_probe(rt.health.status.ok, rt.health.status.latency),
                _fmt_probe(canary.ok, canary.latency) if canary else "off",
                "; ".join(errors) or "-",
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    for row in rows:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=False)) + "  " + row[-1])
    return EXIT_OK if all_up else EXIT_DOWN


def build_parser() -> argparse.ArgumentParser:
    """The argument parser with one sub-parser per command."""
    parser = argparse.ArgumentParser(prog="vllm-watchdog", description="Watch and remediate vLLM servers.")
    parser.add_argument("--version", action="version", version=f"vllm-watchdog {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    run = sub.add_parser("run", help="run the daemon", description="Run the watchdog daemon until SIGTERM.")
    run.add_argument("--config", "-c", help=CONFIG_HELP)
    run.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    run.add_argument("--log-format", default="auto", choices=["auto", "json", "text"])
    run.set_defaults(func=cmd_run)
    check = sub.add_parser(
        "check",
        help="validate config and rule files",
        description="Validate the config and every rule file it names. Exit 0 if valid, "
        "else 1 with every problem as file:line: field: message.",
    )
    check.add_argument("--config", "-c", help=CONFIG_HELP)
    check.set_defaults(func=cmd_check)
    targets = sub.add_parser(
        "targets",
        help="scrape every target once and print their state",
        description="Scrape, health-probe and canary every target once and print a table. "
        "Exit 0 if all are up, 2 if any is not, 1 on invalid config.",
    )
    targets.add_argument("--config", "-c", help=CONFIG_HELP)
    targets.set_defaults(func=cmd_targets)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `vllm-watchdog` console script."""
    args = build_parser().parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
