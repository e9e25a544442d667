"""`vllm-watchdog check`: validate config and rule files."""

# ruff: noqa: PLC0415

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from ..errors import ConfigError
from ..exitcodes import EXIT_CONFIG, EXIT_OK
from .common import add_command, load, print_problems

if TYPE_CHECKING:
    from ..config.model import Config


def add_parser(sub: Any) -> None:
    """Register `check` and its arguments."""
    check = add_command(
        sub,
        "check",
        handle,
        "validate config and rule files",
        "Validate each config and every rule file it names (no file: the embedded defaults). Exit 0 if "
        "valid, else 3 with every problem as file:line: field: message.",
    )
    check.add_argument("files", nargs="*", metavar="FILE", help="config files (as --config, several allowed)")


def handle(args: argparse.Namespace) -> int:
    """Validate config and rule files; print every problem as file:line: field: message."""
    paths: list[str | None] = [*args.files, *([args.config] if args.config else [])] or [None]
    status = EXIT_OK
    for path in paths:  # each file on its own, every problem of each printed
        loaded = load(args, path)
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
        if not _check_file_sd(config) or not _check_integrity(config):
            status = EXIT_CONFIG
    return status


def _check_integrity(config: Config) -> bool:
    """The known-answer prompts file (parsed with the config) and the pinned baseline file: it must be a
    baseline of the prompts as they are now."""
    from ..errors import Problem
    from ..integrity.baseline import BaselineError, check_pinned
    from ..integrity.prompts import prompt_set

    section = config.integrity
    if section.prompts_file is not None:
        print(f"  {section.prompts_file}: OK: {len(section.prompts)} known-answer prompts")
    if section.baseline_file is None:
        return True
    try:
        baseline = check_pinned(section.baseline_file, prompt_set(section))
    except BaselineError as exc:
        print_problems(ConfigError([Problem(section.baseline_file, 1, "baseline_file", str(exc))]))
        return False
    print(f"  {section.baseline_file}: OK: pinned baseline of {baseline.identity.key}")
    return True


def _check_file_sd(config: Config) -> bool:
    """Validate the files each file_sd_configs entry matches now, as promtool check config does."""
    from ..discovery.files import check_files

    ok = True
    for sd in config.file_sd_configs:
        for path, count, problems in check_files(sd):
            if problems:
                print_problems(ConfigError(problems))
                ok = False
            else:
                print(f"  {path}: OK: {count} targets ({sd.name})")
    return ok
