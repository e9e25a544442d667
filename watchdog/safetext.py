"""Text from untrusted sources (bundles, fleet members, targets) made safe to print on a terminal."""

from __future__ import annotations


def shown(text: str, keep: str = "\t") -> str:
    """`text` with each character a terminal would act on written as `?`: C0 and C1 controls (ESC begins
    every escape sequence; 0x9b is a one-byte CSI), DEL, format characters such as bidi overrides, line and
    paragraph separators, lone surrogates; the characters of `keep` stay. What is shown is never obeyed."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() or c in keep else "?" for c in text)
