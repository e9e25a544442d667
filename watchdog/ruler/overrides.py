"""Applies `rule_overrides:` (ruler/config.py) to the loaded rule groups, checking each override as a rule."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import replace

from ..errors import ConfigError, Problem
from ..promql.compile import compile_expr
from ..promql.positions import parse_error_text
from ..promql.values import PromQLError
from ..templates import check_template
from .config import RuleOverride
from .files import LABEL_NAME as _LABEL_NAME
from .files import Rule, RuleGroup


def apply_overrides(groups: Iterable[RuleGroup], overrides: Iterable[RuleOverride]) -> tuple[RuleGroup, ...]:
    """The groups with every override applied (a switched-off rule dropped); ConfigError naming each override
    that matches no rule or does not make a valid rule, at its file and line."""
    groups = tuple(groups)
    by_name = {o.name: o for o in overrides}
    named = {o.name: [r for g in groups for r in g.rules if r.name == o.name] for o in by_name.values()}
    problems = [p for o in by_name.values() for p in _invalid(o, named[o.name])]
    if problems:
        raise ConfigError(problems)
    out = []
    for group in groups:
        rules = tuple(_applied(r, by_name[r.name]) if r.name in by_name else r for r in group.rules)
        out.append(replace(group, rules=tuple(r for r in rules if r is not None)))
    return tuple(out)


def _problem(o: RuleOverride, message: str, key: str = "") -> Problem:
    return Problem(o.file, o.line, f"rule_overrides.{o.name}{'.' + key if key else ''}", message)


def _invalid(o: RuleOverride, rules: list[Rule]) -> list[Problem]:
    """What is wrong with an override of these rules (none: it matches no rule, which is wrong too)."""
    if not rules:
        return [_problem(o, f"no loaded rule is named {o.name!r}")]
    problems = []
    if o.expr is not None:
        try:
            compile_expr(o.expr)
        except PromQLError as exc:
            reason = parse_error_text(o.expr, exc.message, exc.position)
            problems.append(_problem(o, f"could not parse expression: {reason}", "expr"))
    alert_only = [k for k, v in (("for", o.for_), ("keep_firing_for", o.keep_firing_for)) if v is not None]
    alert_only += ["annotations"] if o.annotations else []
    if any(r.kind == "record" for r in rules):
        problems += [_problem(o, f"invalid field {k!r} for a recording rule", k) for k in alert_only]
    for name in o.labels:
        if not _LABEL_NAME.match(name) or name == "__name__":
            problems.append(_problem(o, f"invalid label name: {name}", "labels"))
    templated = {**o.labels, **o.annotations} if rules[0].kind == "alert" else {}
    for name, text in templated.items():
        error = check_template(text)
        if error is not None:
            problems.append(_problem(o, f"{name}: {error}", "labels" if name in o.labels else "annotations"))
    return problems


def _merged(base: Mapping[str, str], changes: Mapping[str, str]) -> dict[str, str]:
    merged = {**base, **changes}
    return {k: v for k, v in merged.items() if v != ""}


def _applied(rule: Rule, o: RuleOverride) -> Rule | None:
    if not o.enabled:
        return None
    keep = o.keep_firing_for
    return replace(
        rule,
        expr=o.expr if o.expr is not None else rule.expr,
        for_=o.for_ if o.for_ is not None and rule.kind == "alert" else rule.for_,
        keep_firing_for=keep if keep is not None and rule.kind == "alert" else rule.keep_firing_for,
        labels=_merged(rule.labels, o.labels),
        annotations=_merged(rule.annotations, o.annotations) if rule.kind == "alert" else rule.annotations,
    )
