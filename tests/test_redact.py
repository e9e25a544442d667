"""Redaction runs in linear time: adversarial values a target can export (runs of name characters that each
could start a name) are masked exactly as before, and complete. The outputs are asserted, not the time: a
quadratic redactor would not finish these within the suite's timeout (a 50 kB one took 37 s)."""

from __future__ import annotations

import pytest

from vllm_watchdog.redact import MASK, Redactor

SIZE = 200_000
RUN = "a." * (SIZE // 2)  # every `a` follows a `.`: each one could start a scheme, a flag or a field name


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (RUN + "=", RUN + "="),  # a field name with no value
        (RUN + "=x", RUN + "=x"),  # a field, but not a secret-named one
        (RUN + "-token=hunter2-value", RUN + f"-token={MASK}"),  # the last word names a secret
        (RUN + "@", RUN + "@"),
        (RUN + "://user:hunter2-value@host", RUN + f"://user:{MASK}@host"),
        (RUN + "://hunter2-token@host", RUN + f"://{MASK}@host"),
        ("-a." * (SIZE // 3) + " v", "-a." * (SIZE // 3) + " v"),  # a flag of no secret name
        ("--api-key." + RUN + " hunter2-value", "--api-key." + RUN + " hunter2-value"),
        ("--api-key " + RUN, f"--api-key {MASK}"),
        ("a " * (SIZE // 2), "a " * (SIZE // 2)),
        ("a=" * (SIZE // 2), "a=" * (SIZE // 2)),
        (": " * (SIZE // 2), ": " * (SIZE // 2)),
    ],
    ids=lambda v: repr(v[-24:]),
)
def test_adversarial_values_of_200_kb_are_masked_as_before(value: str, expected: str) -> None:
    assert Redactor().text(value) == expected


def test_a_label_set_with_an_adversarial_value_is_redacted_whole() -> None:
    labels = {"__name__": "vllm:x", "model": RUN + "=", "url": RUN + "://u:hunter2-value@h"}
    out = Redactor.of(["hunter2-value"]).value(labels)
    assert out == {"__name__": "vllm:x", "model": RUN + "=", "url": RUN + f"://u:{MASK}@h"}


def test_shapes_in_ordinary_text_are_unchanged() -> None:
    red = Redactor()
    assert red.text("x.token=abc") == "x.token=abc"  # `x.token` is the name, and it is not secret-named
    assert red.text("a.--api-key=abcd efg") == f"a.--api-key={MASK} efg"  # a flag after a dot starts anew
    assert red.text("see https://u:p4ss@h/?token=zz and HF_TOKEN: q") == (
        f"see https://u:{MASK}@h/?token={MASK} and HF_TOKEN: {MASK}"
    )
    assert red.text("git+ssh://tok@h") == f"git+ssh://{MASK}@h"
    assert red.text("_http://u:p@h") == "_http://u:p@h"  # no word boundary: not a URL scheme
