"""Go (RE2) regular expressions on Python's `re`: syntax translation, MatchString and ReplaceAllString."""

from __future__ import annotations

import functools
import re

_POSIX = {
    "alnum": "0-9A-Za-z", "alpha": "A-Za-z", "ascii": "\\x00-\\x7f", "blank": "\\t ",
    "cntrl": "\\x00-\\x1f\\x7f", "digit": "0-9", "graph": "!-~", "lower": "a-z", "print": " -~",
    "punct": "!-/:-@\\[-`{-~", "space": "\\t\\n\\v\\f\\r ", "upper": "A-Z", "word": "0-9A-Za-z_",
    "xdigit": "0-9A-Fa-f",
}  # fmt: skip
_FLAGS = re.compile(r"\(\?([imsU]*)(?:-([imsU]*))?([:)])")


class RegexpError(ValueError):
    """A pattern that Go's regexp package would reject, or that we cannot run faithfully."""


def _escape(p: str, i: int, in_class: bool) -> tuple[str, int]:
    """Translate the escape at p[i] == '\\'; returns (python text, next index)."""
    if i + 1 >= len(p):
        raise RegexpError("trailing backslash at end of expression")
    c = p[i + 1]
    if c == "Q" and not in_class:
        end = p.find("\\E", i + 2)
        lit = p[i + 2 :] if end < 0 else p[i + 2 : end]
        return re.escape(lit), len(p) if end < 0 else end + 2
    if c == "z" and not in_class:
        return "\\Z", i + 2
    if c == "x" and p[i + 2 : i + 3] == "{":
        end = p.find("}", i + 3)
        if end < 0:
            raise RegexpError(f"invalid escape sequence: `{p[i:]}`")
        return f"\\U{int(p[i + 3 : end], 16):08x}", end + 1
    if c in "pP" or c.isdigit() or c in "CGXZceghijklmoquy":
        raise RegexpError(f"invalid or unsupported escape sequence: `\\{c}`")
    return p[i : i + 2], i + 2


def translate(p: str) -> str:
    """RE2 syntax to Python `re` syntax (compiled with re.ASCII: Go's \\d \\w \\s \\b are ASCII)."""
    multiline = any("m" in (m.group(1) or "") for m in _FLAGS.finditer(p))
    out: list[str] = []
    closers: list[int] = [0]  # per open group: scoped-flag groups to close with it
    i = 0
    while i < len(p):
        c = p[i]
        if c == "\\":
            text, i = _escape(p, i, False)
            out.append(text)
        elif c == "[":
            j = i + 1
            out.append("[")
            if p[j : j + 1] == "^":
                out.append("^")
                j += 1
            if p[j : j + 1] == "]":
                out.append("\\]")
                j += 1
            while j < len(p) and p[j] != "]":
                if p[j] == "\\":
                    text, j = _escape(p, j, True)
                    out.append(text)
                elif p.startswith("[:", j) and ":]" in p[j:]:
                    end = p.index(":]", j)
                    name = p[j + 2 : end]
                    if name not in _POSIX:
                        raise RegexpError(f"invalid character class range: `{p[j : end + 2]}`")
                    out.append(_POSIX[name])
                    j = end + 2
                else:
                    out.append("\\" + p[j] if p[j] in "[&~|" else p[j])
                    j += 1
            if j >= len(p):
                raise RegexpError(f"missing closing ]: `{p[i:]}`")
            out.append("]")
            i = j + 1
        elif c == "(":
            m = _FLAGS.match(p, i)
            if p.startswith("(?P<", i) or p.startswith("(?:", i) or not p.startswith("(?", i):
                closers.append(0)
                n = (
                    p.index(">", i) + 1
                    if p.startswith("(?P<", i)
                    else i + (3 if p.startswith("(?:", i) else 1)
                )
                out.append(p[i:n])
                i = n
            elif m and "U" not in m.group(0):
                if m.group(3) == ":":
                    closers.append(0)
                    out.append(m.group(0))
                elif i == 0 or "".join(out) == "":
                    out.append(m.group(0))  # leading global flags are fine in Python
                else:  # Go applies mid-pattern flags to the rest of the group: open a scoped group
                    out.append(m.group(0)[:-1] + ":")
                    closers[-1] += 1
                i = m.end()
            else:
                raise RegexpError(f"invalid or unsupported Perl syntax: `{p[i : i + 3]}`")
        elif c == ")":
            if len(closers) == 1:
                raise RegexpError(f"unexpected ): `{p}`")
            out.append(")" * (closers.pop() + 1))
            i += 1
        elif c in "*+?}" and p[i + 1 : i + 2] == "+":
            raise RegexpError(f"invalid nested repetition operator: `{p[i : i + 2]}`")
        elif c == "{" and p[i + 1 : i + 2] == ",":
            out.append("\\{")
            i += 1
        elif c == "$" and not multiline:
            out.append("\\Z")
            i += 1
        else:
            out.append(c)
            i += 1
    if len(closers) > 1:
        raise RegexpError(f"missing closing ): `{p}`")
    out.append(")" * closers[0])
    return "".join(out)


@functools.lru_cache(maxsize=256)
def compile_go(pattern: str) -> re.Pattern[str]:
    """Compile a Go regexp; RegexpError with Go-like wording when it is invalid."""
    try:
        translated = translate(pattern)
    except RegexpError as e:
        raise RegexpError(f"error parsing regexp: {e}") from None
    try:
        return re.compile(translated, re.ASCII)
    except re.error as e:
        raise RegexpError(f"error parsing regexp: {e.msg}: `{pattern}`") from None


def _expand(template: str, m: re.Match[str]) -> str:
    """regexp.Expand: $1, ${1}, $name, ${name}, $$; unknown groups expand to nothing."""
    out: list[str] = []
    i = 0
    names = m.re.groupindex
    while True:
        j = template.find("$", i)
        if j < 0:
            out.append(template[i:])
            return "".join(out)
        out.append(template[i:j])
        rest = template[j + 1 :]
        if rest.startswith("$"):
            out.append("$")
            i = j + 2
            continue
        if rest.startswith("{"):
            end = rest.find("}")
            name = rest[1:end] if end > 0 else ""
            size = end + 1
        else:
            k = 0
            while k < len(rest) and (rest[k] == "_" or rest[k].isalnum()):
                k += 1
            name, size = rest[:k], k
        if not name or (rest.startswith("{") and not all(ch == "_" or ch.isalnum() for ch in name)):
            out.append("$")
            i = j + 1
            continue
        i = j + 1 + size
        group: int | str | None = int(name) if name.isdigit() else names.get(name)
        if isinstance(group, int) and group <= (m.re.groups or 0):
            out.append(m.group(group) or "")
    return "".join(out)


def replace_all(pattern: str, repl: str, text: str) -> str:
    """Regexp.ReplaceAllString, including Go's rule for empty matches right after a match."""
    rx = compile_go(pattern)
    out: list[str] = []
    last_end = search = 0
    while search <= len(text):
        m = rx.search(text, search)
        if m is None:
            break
        out.append(text[last_end : m.start()])
        if m.end() > last_end or m.start() == 0:
            out.append(_expand(repl, m))
        last_end = m.end()
        search = search + 1 if search + 1 > m.end() else m.end()
    out.append(text[last_end:])
    return "".join(out)


def match_string(pattern: str, text: str) -> bool:
    """regexp.MatchString: unanchored search."""
    return compile_go(pattern).search(text) is not None
