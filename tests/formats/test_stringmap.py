"""The string-map check of decoded JSON."""

from __future__ import annotations

from vllm_watchdog.formats.stringmap import string_map


def test_a_map_of_strings_is_copied() -> None:
    value = {"a": "1"}
    found = string_map(value)
    assert found == {"a": "1"} and found is not value


def test_anything_else_is_none() -> None:
    for value in (None, [], "a", {"a": 1}, {1: "a"}, {"a": None}):
        assert string_map(value) is None
