"""label_replace() and label_join() on sorted Labels tuples, with Go (RE2) regex and $-expansion semantics."""

from __future__ import annotations

import re
from functools import lru_cache

from ..store import Labels
from .values import QueryError

_LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*\Z")
_WORD = "0-9A-Za-z_"
_SPACE = r"\t\n\f\r "
_PERL = {"d": "0-9", "w": _WORD, "s": _SPACE}
_POSIX = {
    "alnum": "0-9A-Za-z",
    "alpha": "A-Za-z",
    "ascii": r"\x00-\x7f",
    "blank": r"\t ",
    "cntrl": r"\x00-\x1f\x7f",
    "digit": "0-9",
    "graph": "!-~",
    "lower": "a-z",
    "print": " -~",
    "punct": r"!-/:-@\[-`{-~",
    "space": r"\t\n\v\f\r ",
    "upper": "A-Z",
    "word": _WORD,
    "xdigit": "0-9A-Fa-f",
}
_SIMPLE_ESCAPES = set("aftnrv")
_GO_FLAGS = set("imsU")


class _Unsupported(ValueError):
    pass


def is_valid_label_name(name: str) -> bool:
    """Prometheus' label name rule: [a-zA-Z_][a-zA-Z0-9_]*."""
    return _LABEL_NAME.match(name) is not None


def _code_point(p: str, i: int) -> tuple[str, int]:
    """Translate a Go octal (\\12) or hex (\\x41, \\x{263a}) escape whose first char is p[i]."""
    if p[i] == "x":
        if p[i + 1 : i + 2] == "{":
            end = p.index("}", i)
            value, i = int(p[i + 2 : end], 16), end + 1
        else:
            value, i = int(p[i + 1 : i + 3], 16), i + 3
        return f"\\U{value:08x}", i
    j = i + 1
    if p[i] != "0" and not (j < len(p) and p[j] in "01234567"):
        raise _Unsupported("backreferences are not supported")
    while j < len(p) and j < i + 3 and p[j] in "01234567":
        j += 1
    return f"\\U{int(p[i:j], 8):08x}", j


def _escape(p: str, i: int, in_class: bool) -> tuple[str, int]:
    """Translate the escape starting at p[i] == '\\'."""
    if i + 1 >= len(p):
        raise _Unsupported("trailing backslash")
    c = p[i + 1]
    if c in _PERL:
        return (_PERL[c] if in_class else f"[{_PERL[c]}]"), i + 2
    if c in "DWS":
        body = _PERL[c.lower()]
        if in_class:
            raise _Unsupported(f"\\{c} inside a character class")
        return f"[^{body}]", i + 2
    if c in "0123456789x":
        return _code_point(p, i + 1)
    if c in _SIMPLE_ESCAPES or (not c.isalnum() and c.isascii()):
        return "\\" + c, i + 2
    if not in_class and c in "AbB":
        return ("\\A" if c == "A" else f"(?a:\\{c})"), i + 2
    if not in_class and c == "z":
        return "\\Z", i + 2
    if not in_class and c == "Q":
        end = p.find("\\E", i + 2)
        literal = p[i + 2 :] if end < 0 else p[i + 2 : end]
        return re.escape(literal), len(p) if end < 0 else end + 2
    raise _Unsupported(f"escape \\{c}")


def _char_class(p: str, i: int) -> tuple[str, int]:
    """Translate the class starting at p[i] == '['."""
    out = ["["]
    j = i + 1
    if p[j : j + 1] == "^":
        out.append("^")
        j += 1
    first = True
    while True:
        if j >= len(p):
            raise _Unsupported("missing closing ]")
        c = p[j]
        if c == "]" and not first:
            out.append("]")
            return "".join(out), j + 1
        first = False
        if c == "[" and p[j + 1 : j + 2] == ":":
            end = p.find(":]", j + 2)
            name = p[j + 2 : end] if end >= 0 else ""
            if name not in _POSIX:
                raise _Unsupported(f"character class [:{name}:]")
            out.append(_POSIX[name])
            j = end + 2
        elif c == "\\":
            text, j = _escape(p, j, True)
            out.append(text)
        else:
            out.append("\\" + c if c in "[&~|" else c)
            j += 1


def _group_open(p: str, i: int) -> tuple[str, int, str | None]:
    """Translate '(' at p[i]; returns (text, next index, flags of a Go '(?flags)' group or None)."""
    if p[i + 1 : i + 2] != "?":
        return "(", i + 1, None
    if p[i + 2 : i + 4] == "P<":
        end = p.index(">", i)
        return p[i : end + 1], end + 1, None
    j = i + 2
    while j < len(p) and (p[j] in _GO_FLAGS or p[j] == "-"):
        j += 1
    flags = p[i + 2 : j]
    if j >= len(p) or p[j] not in ":)" or "U" in flags or (flags == "" and p[j] == ")"):
        raise _Unsupported("group syntax")
    if p[j] == ":":
        return f"(?{flags}:" if flags else "(?:", j + 1, None
    return f"(?{flags}:", j + 1, flags


@lru_cache(maxsize=256)
def _translate(pattern: str) -> str:
    """Rewrite a Go RE2 pattern as an equivalent Python pattern (ASCII \\d \\w \\s \\b, $ = end of text)."""
    multiline = re.search(r"\(\?[imsU-]*m", pattern) is not None
    out: list[str] = []
    scoped: list[list[str]] = [[]]  # per group level: Go "(?flags)" groups opened as Python "(?flags:"
    i = 0
    while i < len(pattern):
        c = pattern[i]
        if c == "\\":
            text, i = _escape(pattern, i, False)
            out.append(text)
        elif c == "[":
            text, i = _char_class(pattern, i)
            out.append(text)
        elif c == "(":
            text, i, flags = _group_open(pattern, i)
            out.append(text)
            if flags is None:
                scoped.append([])
            else:
                scoped[-1].append(flags)
        elif c == ")":
            out.append(")" * (len(scoped.pop()) + 1))
            if not scoped:
                raise _Unsupported("unexpected )")
            i += 1
        elif c == "|":
            pending = scoped[-1]
            out.append(")" * len(pending) + "|" + "".join(f"(?{f}:" for f in pending))
            i += 1
        elif c == "$" and not multiline:
            out.append("\\Z")
            i += 1
        elif c == "{" and pattern[i + 1 : i + 2] == ",":
            out.append("\\{")  # Go reads "{," literally; Python would read a repetition
            i += 1
        else:
            out.append(c)
            i += 1
    if len(scoped) != 1:
        raise _Unsupported("missing )")
    out.append(")" * len(scoped[0]))
    return "".join(out)


@lru_cache(maxsize=256)
def compile_go_regex(pattern: str) -> re.Pattern[str]:
    """Compile a Go regex anchored at both ends, as Prometheus does; ValueError if Go would reject it."""
    try:
        return re.compile(f"(?:{_translate(pattern)})\\Z")
    except (re.error, ValueError, IndexError) as exc:
        raise ValueError(f"invalid regular expression: {pattern}") from exc


def _template_ref(template: str, i: int) -> tuple[str, int] | None:
    """Parse the reference after a '$' at template[i-1]: Go's `name` / `{name}`; None if malformed."""
    brace = template[i : i + 1] == "{"
    j = i + 1 if brace else i
    start = j
    while j < len(template) and (template[j].isalpha() or template[j].isdecimal() or template[j] == "_"):
        j += 1
    if j == start:
        return None
    name = template[start:j]
    if brace:
        if template[j : j + 1] != "}":
            return None
        j += 1
    return name, j


def expand_template(match: re.Match[str], template: str) -> str:
    """Go's Regexp.ExpandString: $1, ${1}, $name, ${name}, $$; unknown groups expand to ''."""
    out: list[str] = []
    i = 0
    while True:
        dollar = template.find("$", i)
        if dollar < 0:
            out.append(template[i:])
            return "".join(out)
        out.append(template[i:dollar])
        i = dollar + 1
        if template[i : i + 1] == "$":
            out.append("$")
            i += 1
            continue
        ref = _template_ref(template, i)
        if ref is None:
            out.append("$")
            continue
        name, i = ref
        is_number = name.isascii() and name.isdigit() and (len(name) == 1 or name[0] != "0")
        index = int(name) if is_number else match.re.groupindex.get(name, -1)
        if 0 <= index <= (match.re.groups or 0):
            out.append(match.group(index) or "")


def _set_label(labels: Labels, name: str, value: str) -> Labels:
    """Labels with `name` set to value (removed when value is empty), still sorted."""
    kept = [(k, v) for k, v in labels if k != name]
    if value:
        kept.append((name, value))
        kept.sort()
    return tuple(kept)


def check_label_replace(dst: str, regex: str) -> re.Pattern[str]:
    """Validate label_replace()'s arguments like Prometheus (regex first); raise QueryError."""
    try:
        compiled = compile_go_regex(regex)
    except ValueError:
        raise QueryError(f"invalid regular expression in label_replace(): {regex}") from None
    if not is_valid_label_name(dst):
        raise QueryError(f"invalid destination label name in label_replace(): {dst}")
    return compiled


def label_replace(labels: Labels, dst: str, replacement: str, src: str, regex: str) -> Labels:
    """Set dst to the expanded replacement if regex fully matches src's value (missing label = '')."""
    compiled = check_label_replace(dst, regex)
    value = dict(labels).get(src, "")
    match = compiled.match(value)
    if match is None:
        return labels
    return _set_label(labels, dst, expand_template(match, replacement))


def check_label_join(dst: str, srcs: list[str] | tuple[str, ...]) -> None:
    """Validate label_join()'s label names like Prometheus (sources first); raise QueryError."""
    for src in srcs:
        if not is_valid_label_name(src):
            raise QueryError(f"invalid source label name in label_join(): {src}")
    if not is_valid_label_name(dst):
        raise QueryError(f"invalid destination label name in label_join(): {dst}")


def label_join(labels: Labels, dst: str, sep: str, srcs: list[str] | tuple[str, ...]) -> Labels:
    """Set dst to the source labels' values joined by sep (an empty result removes dst)."""
    check_label_join(dst, srcs)
    values = dict(labels)
    return _set_label(labels, dst, sep.join(values.get(src, "") for src in srcs))
