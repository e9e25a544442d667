"""`vllm-watchdog replay`: a recorded scrape log through the rules, and its plot."""

# ruff: noqa: PLC0415

from __future__ import annotations

import argparse
import os
import sys
from typing import TYPE_CHECKING, Any

from .. import logs
from ..exitcodes import EXIT_CONFIG, EXIT_FAILED, EXIT_OK, EXIT_USAGE
from .common import add_command, load

if TYPE_CHECKING:
    from ..config.model import Config
    from ..ruler.files import RuleGroup


def add_parser(sub: Any) -> None:
    """Register `replay` and its options."""
    replay = add_command(
        sub,
        "replay",
        handle,
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


def handle(args: argparse.Namespace) -> int:
    """Replay a recorded scrape log through the rules and print the alert timeline (and plot it)."""
    from ..commands.replay import run_replay

    logs.setup("error", fmt="text")
    if args.audit and not args.plot:
        print("vllm-watchdog: --audit marks actions on the plot: give --plot too", file=sys.stderr)
        return EXIT_USAGE
    loaded = load(args)
    if loaded is None:
        return EXIT_CONFIG
    config, rules = loaded
    if not args.plot:
        return run_replay(config, rules, args.input, sys.stdout, start=args.start, end=args.end)
    return _plot(args, config, rules)


def _plot(args: argparse.Namespace, config: Config, rules: tuple[RuleGroup, ...]) -> int:
    from ..commands.plot import PlotError, build_timeline
    from ..commands.plotpng import render_png  # only `--plot` needs matplotlib
    from ..commands.replay import print_transitions, summary
    from ..scrapelog import ScrapeLogError

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
