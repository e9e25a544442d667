"""Alert templates expanded once per label set (and value, where the template reads it) across evaluations."""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.ruler.test_alerting import alerting, sample, table
from vllm_watchdog.ruler.expansion import Expander, reads_value
from vllm_watchdog.templates import Template

MIN = 60_000


@pytest.mark.parametrize(
    ("text", "reads"),
    [
        ("{{ $labels.instance }} is down", False),
        ("{{ $labels.instance }} on {{ $externalLabels.cluster }} ({{ $externalURL }})", False),
        ("{{- $labels.job -}} 0.5", False),
        ("plain text. With dots.", False),
        ("{{ $value }}", True),
        ("{{ $value | humanizePercentage }}", True),
        ("{{ .Value }}", True),
        ("{{ $.Value }}", True),
        ("{{ . }}", True),
        ("{{ $v := $ }}{{ $v.Value }}", True),
        ("{{ with $labels }}{{ .instance }}{{ end }}", True),  # the cursor: conservatively a read
        ("{{range.Value}}{{end}}", True),
        ('{{ printf "%.2f" $labels.x }}', True),  # a string could hide a closing delimiter
        ("{{/* $labels */}}", True),
    ],
)
def test_reads_value_is_conservative(text: str, reads: bool) -> None:
    assert reads_value(text) is reads


class CountingTemplate(Template):
    """A template that notes each render."""

    def __init__(self, text: str, renders: list[str]) -> None:
        super().__init__(text)
        self.renders = renders

    def render(
        self,
        labels: Mapping[str, str],
        value: float,
        external_labels: Mapping[str, str] | None = None,
        external_url: str = "",
    ) -> str:
        self.renders.append(self.text)
        return super().render(labels, value, external_labels, external_url)


def test_expanded_again_only_when_labels_or_a_read_value_change() -> None:
    rule = alerting(
        labels={"team": "{{ $labels.instance }}-owners"},
        annotations={"summary": "{{ $labels.instance }} is slow", "description": "value {{ $value }}"},
    )
    renders: list[str] = []
    for expander in [*rule.label_templates.values(), *rule.annotation_templates.values()]:
        expander.template = CountingTemplate(expander.text, renders)
    rows = {
        0: [sample(1.0, instance="a"), sample(2.0, instance="b")],
        MIN: [sample(1.0, instance="a"), sample(3.0, instance="b")],
        2 * MIN: [sample(1.0, instance="a")],
        3 * MIN: [sample(-0.0, instance="a"), sample(3.0, instance="b")],
        4 * MIN: [sample(0.0, instance="a"), sample(3.0, instance="b")],
    }
    query = table(rows)
    seen: list[tuple[int, dict[str, dict[str, str]]]] = []
    for ts in sorted(rows):
        renders.clear()
        rule.eval(ts, query)
        seen.append((len(renders), {dict(a.labels)["instance"]: a.annotations for a in rule.active.values()}))
    assert [n for n, _ in seen] == [6, 1, 0, 4, 1]
    # b is gone at 2m, so at 3m it is expanded anew; -0 and 0 print differently, so neither reuses the other.
    assert seen[3][1]["a"]["description"] == "value -0" and seen[4][1]["a"]["description"] == "value 0"
    assert seen[1][1]["b"] == {"summary": "b is slow", "description": "value 3"}
    assert {dict(a.labels)["team"] for a in rule.active.values()} == {"a-owners", "b-owners"}


def test_failed_expansions_are_logged_every_time(caplog: pytest.LogCaptureFixture) -> None:
    rule = alerting(annotations={"summary": "{{ index $labels.instance 5 }}"})
    query = table({0: [sample(1.0, instance="a")], MIN: [sample(1.0, instance="a")]})
    with caplog.at_level(logging.WARNING):
        rule.eval(0, query)
        rule.eval(MIN, query)
    assert [r.getMessage() for r in caplog.records].count("expanding alert template failed") == 2
    (alert,) = rule.active.values()
    assert alert.annotations["summary"].startswith("<error expanding template: ")


def test_new_external_labels_expand_again() -> None:
    rule = alerting(annotations={"summary": "{{ $labels.instance }} in {{ $externalLabels.dc }}"})
    rule.external_labels = {"dc": "x"}
    query = table({0: [sample(1.0, instance="a")], MIN: [sample(1.0, instance="a")]})
    rule.eval(0, query)
    rule.external_labels = {"dc": "y"}
    rule.eval(MIN, query)
    (alert,) = rule.active.values()
    assert alert.annotations["summary"] == "a in y"


def test_expander_without_template_returns_the_text() -> None:
    expander = Expander("no braces", "R")
    assert expander.expand_for((), {}, 1.0, {}, "") == "no braces"


# The backtracking regexes that found a template's actions before: hypothesis checks the new scan against them on
# short texts, and 200 kB of unclosed `{{` (40 kB took the old one 34 s, growing with the square) must be read
# right; a quadratic scan would not finish it within the suite's timeout.
OLD_ACTION = re.compile(r"\{\{(.*?)\}\}", re.S)
OLD_TOKEN = re.compile(r"\$\w*(?:\.\w+)*|\d+(?:\.\d+)?|\w+|\S")
TEMPLATES = st.text(alphabet="{}$.v aule'1", max_size=16)
SIZE = 200_000


def old_reads_value(text: str) -> bool:
    for action in OLD_ACTION.findall(text):
        if any(c in action for c in "\"'`/"):
            return True
        for token in OLD_TOKEN.findall(action):
            if token[0] == "." or token == "$" or token.startswith(("$.", "$value")):
                return True
    return False


@settings(max_examples=600, deadline=None)
@given(TEMPLATES)
def test_template_actions_read_as_the_backtracking_regex_did(text: str) -> None:
    assert reads_value(text) == old_reads_value(text)


def test_200_kb_of_unclosed_template_actions_are_read_right() -> None:
    assert not reads_value("{{" * (SIZE // 2))
    assert reads_value("{{" * (SIZE // 2) + " $value }}")  # one action: everything after the first `{{`
    assert not reads_value("{{ $labels.x }}" + "{{" * (SIZE // 2))
