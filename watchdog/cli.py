"""The `vllm-watchdog` command line: run, check, targets, fleet, query, test-rules, replay, top, init, reload
and incident."""

# Each handler imports what only its sub-command uses: `--version`, `check` and `test-rules` (CI runs it once
# per file) then start without the daemon, the gateway, an HTTP client or asyncio (tests/test_cli_imports.py).
# ruff: noqa: PLC0415

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from . import __version__, logs
from .config.durations import parse_size
from .errors import ConfigError
from .exitcodes import EXIT_CONFIG, EXIT_FAILED, EXIT_OK, EXIT_USAGE
from .redact import Redactor

if TYPE_CHECKING:
    from .config.model import Config
    from .ruler.files import RuleGroup

EXIT_HELP = """exit status (every command):
  0  ok
  1  ran and found problems: a target down, a rule test or a query failed
  2  usage error: the command line is wrong
  3  the config or a rule file is invalid (also a reload the daemon rejected)
  4  the daemon's API, or every target or the rule_backend, could not be reached"""
CONFIG_HELP = "config file (YAML); omitted: the embedded defaults (one vLLM on 127.0.0.1:8000)"


def _print_problems(exc: ConfigError) -> None:
    # The shapes the log masks (URL passwords, `--api-key X`) in rule-file problems too; values substituted
    # into secret fields are masked in config problems already (config.model._masked).
    red = Redactor()
    for p in exc.problems:
        print(f"{p.file}:{p.line}: {red.text(p.field)}: {red.text(p.message)}", file=sys.stderr)


def _load(args: argparse.Namespace, path: str | None = None) -> tuple[Config, tuple[RuleGroup, ...]] | None:
    """Config and rules of `path` (default --config), or None after printing every problem."""
    from .service.loading import load_all

    try:
        return load_all(path or args.config, os.environ)
    except ConfigError as exc:
        _print_problems(exc)
        return None


def cmd_run(args: argparse.Namespace) -> int:
    """Run the daemon until SIGTERM."""
    import asyncio

    from .fdlimits import raise_open_files_limit
    from .service.daemon import Daemon, DaemonOptions

    logs.setup(args.log_level, fmt=args.log_format)
    raise_open_files_limit()  # first: the listeners size their connection caps from it
    try:
        daemon = Daemon.load(
            DaemonOptions(
                args.config,
                record=args.record,
                record_max_bytes=args.record_max_bytes,
                record_keep=args.record_keep,
                external_gateway=args.external_gateway,
            )
        )
        asyncio.run(daemon.run())
    except ConfigError as exc:
        _print_problems(exc)
        return EXIT_CONFIG
    except OSError as exc:
        print(f"vllm-watchdog: {exc}", file=sys.stderr)
        return EXIT_FAILED
    return EXIT_OK


def cmd_gateway(args: argparse.Namespace) -> int:
    """Run the gateway process alone (systemd's vllm-watchdog-gateway.service, compose's gateway service)."""
    from .gateway.main import main as gateway_main  # the gateway imports no daemon code

    argv = ["--log-level", args.log_level]
    if args.config:
        argv += ["--config", args.config]
    return gateway_main(argv)


def cmd_check(args: argparse.Namespace) -> int:
    """Validate config and rule files; print every problem as file:line: field: message."""
    paths: list[str | None] = [*args.files, *([args.config] if args.config else [])] or [None]
    status = EXIT_OK
    for path in paths:  # each file on its own, every problem of each printed
        loaded = _load(args, path)
        if loaded is None:
            status = EXIT_CONFIG
            continue
        config, rules = loaded
        n_rules = sum(len(g.rules) for g in rules)
        print(
            f"{config.source}: OK: {len(config.targets)} targets, {len(rules)} rule groups, {n_rules} rules"
        )
        for rule_file in config.rule_files:
            print(f"  {rule_file}: OK")
        if not _check_file_sd(config):
            status = EXIT_CONFIG
    return status


def _check_file_sd(config: Config) -> bool:
    """Validate the files each file_sd_configs entry matches now, as promtool check config does."""
    from .discovery.files import check_files

    ok = True
    for sd in config.file_sd_configs:
        for path, count, problems in check_files(sd):
            if problems:
                _print_problems(ConfigError(problems))
                ok = False
            else:
                print(f"  {path}: OK: {count} targets ({sd.name})")
    return ok


def cmd_query(args: argparse.Namespace) -> int:
    """Scrape every target once, evaluate one expression, and print the result."""
    from .commands.query import parse_time, run_query

    logs.setup("error", fmt="text")
    try:
        at = None if args.time is None else parse_time(args.time)
    except ValueError as exc:
        print(f"vllm-watchdog query: --time: {exc}", file=sys.stderr)
        return EXIT_USAGE
    loaded = _load(args)
    if loaded is None:
        return EXIT_CONFIG
    return run_query(loaded[0], args.expr, sys.stdout, sys.stderr, at=at, output=args.output)


def cmd_test_rules(args: argparse.Namespace) -> int:
    """Run rule unit tests written for `promtool test rules`."""
    from .promtool.runner import run_rule_tests

    logs.setup("error", fmt="text")
    return run_rule_tests(list(args.files), sys.stdout, sys.stderr)


def cmd_replay(args: argparse.Namespace) -> int:
    """Replay a recorded scrape log through the rules and print the alert timeline (and plot it)."""
    from .commands.replay import run_replay

    logs.setup("error", fmt="text")
    if args.audit and not args.plot:
        print("vllm-watchdog: --audit marks actions on the plot: give --plot too", file=sys.stderr)
        return EXIT_USAGE
    loaded = _load(args)
    if loaded is None:
        return EXIT_CONFIG
    config, rules = loaded
    if not args.plot:
        return run_replay(config, rules, args.input, sys.stdout, start=args.start, end=args.end)
    return _plot(args, config, rules)


def _plot(args: argparse.Namespace, config: Config, rules: tuple[RuleGroup, ...]) -> int:
    from .commands.plot import PlotError, build_timeline, render_png  # only `--plot` needs matplotlib
    from .commands.replay import print_transitions, summary
    from .scrapelog import ScrapeLogError

    try:
        timeline, rp = build_timeline(
            config, rules, args.input, audit=args.audit, start=args.start, end=args.end
        )
        print_transitions(rp.transitions, 0, sys.stdout)
        summary(rp, sys.stdout)
        name = os.path.basename(args.input)
        title = f"{name}: {len(timeline.spans)} alert spans, {len(timeline.actions)} actions"
        render_png(timeline, args.plot, title=title)
    except (ScrapeLogError, PlotError) as exc:
        print(f"vllm-watchdog: {exc}", file=sys.stderr)
        return EXIT_FAILED
    print(f"plot: {args.plot}")
    return EXIT_OK


def cmd_top(args: argparse.Namespace) -> int:
    """A live table of targets, gateway, alerts and actions, read from a running watchdog's API."""
    from .commands.top import run_top

    color = sys.stdout.isatty() and not args.no_color
    return run_top(
        args.url,
        interval=max(args.interval, 0.1),
        once=args.once,
        out=sys.stdout,
        actions=args.actions,
        token=os.environ.get("VLLM_WATCHDOG_TOKEN") or None,
        color=color,
        plain=not sys.stdout.isatty(),
        fleet=args.fleet,
    )


def cmd_reload(args: argparse.Namespace) -> int:
    """Make a running daemon reload its config; exit non-zero when it rejected it (ExecReload)."""
    from .commands.reload import run_reload

    token = os.environ.get("VLLM_WATCHDOG_TOKEN") or None
    return run_reload(args.url, token=token, pid=args.pid, err=sys.stderr, timeout=args.timeout)


def cmd_init(args: argparse.Namespace) -> int:
    """Write a commented starting config for the vLLM servers found on this host."""
    from .commands.init import parse_ports, run_init

    try:
        ports = parse_ports(args.ports) if args.ports else None
    except ValueError as exc:
        print(f"vllm-watchdog init: --ports: {exc}", file=sys.stderr)
        return EXIT_USAGE
    return run_init(args.output, sys.stdout, sys.stderr, ports=ports)


def cmd_targets(args: argparse.Namespace) -> int:
    """Scrape every target once and print a table of their state."""
    logs.setup("error", fmt="text")
    loaded = _load(args)
    if loaded is None:
        return EXIT_CONFIG
    from .commands.targets import print_targets

    return EXIT_OK if print_targets(loaded[0], sys.stdout) else EXIT_FAILED


def cmd_fleet(args: argparse.Namespace) -> int:
    """List every member of the config's fleet group, from etcd."""
    logs.setup("error", fmt="text")
    loaded = _load(args)
    if loaded is None:
        return EXIT_CONFIG
    if loaded[0].fleet is None:
        print("vllm-watchdog fleet: the config has no fleet: section", file=sys.stderr)
        return EXIT_USAGE
    from .commands.fleet import print_fleet

    return EXIT_OK if print_fleet(loaded[0], sys.stdout, sys.stderr) else EXIT_FAILED


def cmd_incident(args: argparse.Namespace) -> int:
    """List the incident bundles of the config's state_dir, or show one as a readable summary."""
    from .commands.incident import run_incident

    loaded = _load(args)
    if loaded is None:
        return EXIT_CONFIG
    return run_incident(
        loaded[0], args.verb, args.id, sys.stdout, sys.stderr, frames=args.frames, lines=args.lines
    )


def _command(
    sub: Any,
    name: str,
    func: Callable[[argparse.Namespace], int],
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
    run = _command(sub, "run", cmd_run, "run the daemon", "Run the watchdog daemon until SIGTERM.")
    run.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    run.add_argument("--log-format", default="auto", choices=["auto", "json", "text"])
    run.add_argument(
        "--record",
        metavar="FILE",
        help="append every scrape, probe and NVML reading to a compressed, rotated scrape log "
        "(FILE.NNNNNN.gz) that `replay` reads",
    )
    run.add_argument(
        "--record-max-bytes", type=parse_size, default=64 << 20, help="rotate segments at this size"
    )
    run.add_argument("--record-keep", type=int, default=8, help="segments kept after rotation")
    run.add_argument(
        "--external-gateway",
        action="store_true",
        help="another supervisor (systemd's vllm-watchdog-gateway.service, a compose service) runs the "
        "gateway "
        "process: attach to it and never start one",
    )
    gateway = _command(
        sub,
        "gateway",
        cmd_gateway,
        "run the admission gateway process",
        "Run the `gateway:` of the config as a process of its own, as the daemon would start it; the daemon "
        "attaches to it over its control socket.",
    )
    gateway.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    check = _command(
        sub,
        "check",
        cmd_check,
        "validate config and rule files",
        "Validate each config and every rule file it names (no file: the embedded defaults). Exit 0 if "
        "valid, else 3 with every problem as file:line: field: message.",
    )
    check.add_argument("files", nargs="*", metavar="FILE", help="config files (as --config, several allowed)")
    _command(
        sub,
        "targets",
        cmd_targets,
        "scrape every target once and print their state",
        "Scrape, health-probe and canary every target once and print a table. "
        "Exit 0 if all are up, 1 if any is not, 3 on an invalid config.",
    )
    _command(
        sub,
        "fleet",
        cmd_fleet,
        "list every member of the fleet group, from etcd",
        "Read the fleet group's members from etcd and print each one's targets, firing alerts and running "
        "and waiting actions. Exit 0, 1 if etcd could not be read, 2 without a fleet: section, 3 on an "
        "invalid config.",
    )
    query = _command(
        sub,
        "query",
        cmd_query,
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
    tests = _command(
        sub,
        "test-rules",
        cmd_test_rules,
        "run rule unit tests (promtool test rules format)",
        "Run rule unit tests in the format of `promtool test rules`. Exit 0 if all pass, else 1.",
        config=False,
    )
    tests.add_argument("files", nargs="+", metavar="FILE", help="unit-test files")
    replay = _command(
        sub,
        "replay",
        cmd_replay,
        "replay a recorded scrape log through the rules",
        "Rebuild the samples of a scrape log written by `run --record`, evaluate the config's "
        "rules over them on a simulated clock, and print the timeline of alerts.",
    )
    replay.add_argument("--input", "-i", required=True, help="the scrape log (as given to run --record)")
    replay.add_argument("--start", type=float, help="first unix time to replay (default: the log's start)")
    replay.add_argument("--end", type=float, help="last unix time to replay (default: the log's end)")
    replay.add_argument(
        "--plot",
        metavar="PNG",
        help="also draw a timeline of key metrics with the alerts marked (needs [plot])",
    )
    replay.add_argument(
        "--audit", metavar="STATE_DIR", help="with --plot: mark the actions of this state_dir's audit log"
    )
    top = _command(
        sub,
        "top",
        cmd_top,
        "live table of a running watchdog",
        "Show targets (health, canary, queue, KV, throughput, spec acceptance), the gateway, firing "
        "alerts, recent actions and open session breakers, read from a running watchdog's API and "
        "refreshed every --interval. vLLM values come from the watchdog's sample store: a family that no "
        "rule reads shows '-' unless global.keep_unreferenced is true. The token, if the API needs one, "
        "comes from VLLM_WATCHDOG_TOKEN. Not on a terminal it prints plain frames, without screen escapes. "
        "With --fleet it shows the watchdog's fleet group instead, as etcd has it. "
        "Exit 0, or 4 if --once cannot read the API (or, with --fleet, etcd behind it).",
        config=False,
    )
    top.add_argument("--url", default="http://127.0.0.1:9460", help="the watchdog's API (its `listen`)")
    top.add_argument("--interval", type=float, default=1.0, help="seconds between refreshes")
    top.add_argument("--once", action="store_true", help="print one frame and exit (4 if unreachable)")
    top.add_argument("--actions", type=int, default=8, help="how many recent actions to show")
    top.add_argument("--no-color", action="store_true", help="no ANSI colours (none when not a terminal)")
    top.add_argument(
        "--fleet",
        action="store_true",
        help="the watchdog's fleet group instead: every member's targets, firing alerts, running and waiting "
        "actions, and the holds (read from etcd by the watchdog, GET /api/v1/fleet)",
    )
    init = _command(
        sub,
        "init",
        cmd_init,
        "write a starting config for the vLLM servers on this host",
        "Find the vLLM servers on this host (TCP ports listening on loopback or every address whose /metrics "
        "has vllm: series or whose /v1/models is vLLM's; their Docker containers when Docker answers) and "
        "write a commented config that watches them, monitoring only, with examples of actions. Exit 0, "
        "or 1 if FILE exists.",
        config=False,
    )
    init.add_argument("--output", "-o", metavar="FILE", help="write here (never over a file); default stdout")
    init.add_argument("--ports", help="only these ports, e.g. 8000,8080-8089 (default: every listening one)")
    reload = _command(
        sub,
        "reload",
        cmd_reload,
        "make a running watchdog reload its config",
        "Ask a running watchdog to reload its config and rule files, and wait for the outcome: with "
        "VLLM_WATCHDOG_TOKEN through POST /-/reload (the problems are printed), else with --pid by SIGHUP, "
        "reading the outcome from /metrics. Exit 0 when applied, 3 when rejected (the old config stays), "
        "4 when the API cannot be reached. systemd's ExecReload runs it, so `systemctl reload` fails too.",
        config=False,
    )
    reload.add_argument("--url", default="http://127.0.0.1:9460", help="the watchdog's API (its `listen`)")
    reload.add_argument("--pid", type=int, help="the daemon's pid (systemd: $MAINPID), for SIGHUP")
    reload.add_argument("--timeout", type=float, default=30.0, help="seconds to wait for the outcome")
    incident = _command(
        sub,
        "incident",
        cmd_incident,
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
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `vllm-watchdog` console script."""
    args = build_parser().parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
