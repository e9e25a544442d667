"""Parsers of config, rule, promtool test files and silences run in linear time on hostile text, and read every
text as the backtracking regexes they replace did.

Each old regex is kept here as the reference: hypothesis checks the new code against it on short texts of the
characters that matter, and a 200 kB adversarial text, on which the old one ran for minutes to hours (quadratic:
16 kB took 2.4 s for a matcher, 40 kB 34 s for a template, 100 kB 27 s for `${VAR:-`, 20 kB 52 s for a number),
must give the right answer. The answers are asserted, not the time, as in test_redact: a quadratic parser would
not finish these within the suite's timeout.
"""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vllm_watchdog.config.yamlnodes import substitute_env
from vllm_watchdog.matchers import parse_matcher
from vllm_watchdog.promtool.series import go_number
from vllm_watchdog.ruler.expansion import reads_value

SIZE = 200_000

OLD_MATCHER = re.compile(r'^\s*([A-Za-z_][A-Za-z0-9_]*)\s*(=~|!~|!=|=)\s*(?:"((?:[^"\\]|\\.)*)"|(.*?))\s*$')
OLD_ENV = re.compile(r"\$\$|\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")
OLD_ACTION = re.compile(r"\{\{(.*?)\}\}", re.S)
OLD_DECIMAL = re.compile(r"(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")
OLD_TOKEN = re.compile(r"\$\w*(?:\.\w+)*|\d+(?:\.\d+)?|\w+|\S")


def old_matcher(text: str) -> tuple[str, str, str] | None:
    m = OLD_MATCHER.match(text)
    if m is None:
        return None
    if m.group(3) is not None:
        return m.group(1), m.group(2), re.sub(r"\\(.)", r"\1", m.group(3))
    return m.group(1), m.group(2), m.group(4)


def new_matcher(text: str) -> tuple[str, str, str] | None:
    try:
        m = parse_matcher(text)
    except ValueError:
        return None
    return m.name, m.op, m.value


def old_env(text: str, env: dict[str, str]) -> str | None:
    def repl(m: re.Match[str]) -> str:
        if m.group(0) == "$$":
            return "$"
        if m.group(1) in env:
            return env[m.group(1)]
        if m.group(2) is not None:
            return str(m.group(2))
        raise KeyError(m.group(1))

    try:
        return OLD_ENV.sub(repl, text)
    except KeyError:
        return None


def new_env(text: str, env: dict[str, str]) -> str | None:
    try:
        return substitute_env(text, env)
    except KeyError:
        return None


def old_reads_value(text: str) -> bool:
    for action in OLD_ACTION.findall(text):
        if any(c in action for c in "\"'`/"):
            return True
        for token in OLD_TOKEN.findall(action):
            if token[0] == "." or token == "$" or token.startswith(("$.", "$value")):
                return True
    return False


# Texts of the characters each grammar turns on, so that short random ones reach every branch.
MATCHERS = st.text(alphabet=' \t\n\r\x0ba_Z9=!~"\\x', max_size=14)
ENVS = st.text(alphabet="${}:-A_x ", max_size=16)
TEMPLATES = st.text(alphabet="{}$.v aule'1", max_size=16)
NUMBERS = st.text(alphabet="0123456789.eE+-x_", max_size=10)


@settings(max_examples=600, deadline=None)
@given(MATCHERS)
def test_matchers_read_as_the_backtracking_regex_did(text: str) -> None:
    old = old_matcher(text)
    if old is not None and old[1] in ("=~", "!~"):
        return  # the value is then compiled as a regex too: refusals of it are test_matchers' business
    assert new_matcher(text) == old


@settings(max_examples=600, deadline=None)
@given(ENVS)
def test_env_references_read_as_the_backtracking_regex_did(text: str) -> None:
    for env in ({}, {"A": "a", "A_": "b"}):
        assert new_env(text, env) == old_env(text, env)


@settings(max_examples=600, deadline=None)
@given(TEMPLATES)
def test_template_actions_read_as_the_backtracking_regex_did(text: str) -> None:
    assert reads_value(text) == old_reads_value(text)


@settings(max_examples=600, deadline=None)
@given(NUMBERS)
def test_numbers_read_as_the_backtracking_regex_did(text: str) -> None:
    if text.isdigit():
        return  # read as an integer first, by no regex
    try:
        go_number(text)
    except ValueError:
        assert OLD_DECIMAL.fullmatch(text) is None
    else:
        assert OLD_DECIMAL.fullmatch(text) is not None


BLANKS = " \t" * (SIZE // 2)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("a=x" + BLANKS + "y", ("a", "=", "x" + BLANKS + "y")),  # blanks inside an unquoted value
        ("a=x" + BLANKS, ("a", "=", "x")),  # trailing blanks
        ("a=x" + BLANKS + "\ny", None),  # an unquoted value is one line
        ('a="' + '\\"' * (SIZE // 2) + '"' + BLANKS, ("a", "=", '"' * (SIZE // 2))),
        ('a="' + '\\"' * (SIZE // 2) + "x", ("a", "=", '"' + '\\"' * (SIZE // 2) + "x")),  # never closed
        ("a" * SIZE, None),
        (BLANKS + "a" + BLANKS + "!=" + BLANKS, ("a", "!=", "")),
    ],
    ids=[
        "inner blanks",
        "trailing blanks",
        "two lines",
        "escaped quotes",
        "unclosed quote",
        "no op",
        "blank",
    ],
)
def test_a_200_kb_hostile_matcher_is_read_right(text: str, expected: tuple[str, str, str] | None) -> None:
    assert new_matcher(text) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("${A:-" * (SIZE // 5), "${A:-" * (SIZE // 5)),  # no `}` anywhere: nothing is a reference
        ("${A:-" * (SIZE // 5) + "}$$", "v$"),  # the first reference runs to the one `}`
        ("x${B:-" * (SIZE // 6) + "}", "x" + "x${B:-" * (SIZE // 6 - 1)),  # B unset: that is its default
        (
            "$$" * (SIZE // 2) + "${A}" + "${A:-" * (SIZE // 10),
            "$" * (SIZE // 2) + "v" + "${A:-" * (SIZE // 10),
        ),
    ],
    ids=["unclosed", "one closed", "its default", "dollars"],
)
def test_200_kb_of_unclosed_env_references_are_read_right(text: str, expected: str) -> None:
    assert substitute_env(text, {"A": "v"}) == expected


def test_200_kb_of_unclosed_template_actions_are_read_right() -> None:
    assert not reads_value("{{" * (SIZE // 2))
    assert reads_value("{{" * (SIZE // 2) + " $value }}")  # one action: everything after the first `{{`
    assert not reads_value("{{ $labels.x }}" + "{{" * (SIZE // 2))


def test_a_200_kb_number_that_is_not_one_is_refused() -> None:
    with pytest.raises(ValueError, match="invalid syntax"):
        go_number("1" * SIZE + "x")
    assert go_number("1" * 300 + "." + "5" * SIZE) == float("1" * 300 + ".5")
