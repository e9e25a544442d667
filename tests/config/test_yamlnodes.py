"""`${VAR}`, `${VAR:-default}` and `$$` in config values, substituted in linear time.

The backtracking regex that found them before is kept here as the reference: hypothesis checks the new scan
against it on short texts, and 200 kB of unclosed `${VAR:-` (100 kB took the old one 27 s, growing with the
square) must be read right; the answers are asserted, not the time: a quadratic scan would not finish them
within the suite's timeout.
"""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vllm_watchdog.config.yamlnodes import substitute_env

SIZE = 200_000
ENVS = st.text(alphabet="${}:-A_x ", max_size=16)  # the characters the grammar turns on
OLD_ENV = re.compile(r"\$\$|\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


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


@settings(max_examples=600, deadline=None)
@given(ENVS)
def test_env_references_read_as_the_backtracking_regex_did(text: str) -> None:
    for env in ({}, {"A": "a", "A_": "b"}):
        assert new_env(text, env) == old_env(text, env)


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
