"""Go's regular expressions, as Prometheus and Alertmanager run them, on RE2 (the google-re2 binding).

Every regex that reaches the watchdog from outside (selectors and label_replace() in rules and API
queries, matchers in routes, silences and inbound alerts, the template functions `match` and
`reReplaceAll`) is compiled here and nowhere else. RE2 runs in time linear in the text, with a bounded
memory budget, so no pattern can stall the process the way a backtracking engine can.

How Go's semantics are kept:

- Syntax: RE2's Perl-flavoured syntax is the one Go's regexp/syntax parses (same design, same author):
  flags `(?imsU)`, `\\p{Greek}` `\\pN` `\\p{^Greek}`, `[[:alpha:]]`, `\\Q...\\E`, `\\A` `\\z` `\\b` `\\B`,
  octal `\\123`, `\\x41` `\\x{263a}`, `(?P<name>...)`. Both refuse backreferences, lookaround, atomic
  groups, possessive and stacked repetitions (`a++`, `a**`), `\\Z`, `(?#...)`, `(?x)`, `\\u0041`,
  repetition counts over 1000, unknown classes. What RE2 would accept but Go refuses is refused here
  before RE2 sees it: `\\C` (any byte) and capture names that are not ASCII letters, digits or `_`.
- Options: UTF-8, leftmost-first (not leftmost-longest), `.` does not match a newline unless `(?s)`,
  `^`/`$` are the ends of the text unless `(?m)`, `\\d \\w \\s \\b` are ASCII: Go's defaults.
- Anchoring: `compile_anchored` compiles the text `^(?:` + pattern + `)$`, exactly as Prometheus and
  Alertmanager build it (so `\\Qabc` without `\\E` is refused there, as in Go).
- Positions: RE2 tries every byte offset as a start, and `\\B` (alone among assertions) holds inside a
  multi-byte character, where Go never looks. A pattern with `\\B` is therefore searched as
  `(?s:.*?)(pattern)` anchored at the start, which steps whole characters as Go's search does.
  ReplaceAllString and Expand follow Go's algorithms, including the empty-match-after-a-match rule and
  `$1x` naming the group `1x`.
- Text that is not valid Unicode (a lone surrogate) has each surrogate read as U+FFFD, as Go reads an
  invalid byte.

Known differences that remain:

- `(?<name>...)` is accepted, as by Go 1.22 and later; promtool 2.42 (Go 1.19) refuses it.
- Unicode tables are RE2's, newer than Go 1.19's (`\\p{Kawi}` is accepted; Go 1.19 refuses it).
- Go refuses expressions nested more than 1000 deep; RE2 accepts them within its memory budget.
- A pattern whose compiled program exceeds `MAX_MEM` (for example `\\pL{1000}`) is refused as too
  large here; Go accepts it. Patterns longer than `MAX_PATTERN_BYTES` are refused.
"""

from __future__ import annotations

import re
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import re2
from re2 import _re2

MAX_PATTERN_BYTES = 64 * 1024
MAX_MEM = 8 << 20  # RE2's own default budget per pattern: program plus its lazily built DFA
CACHE_ENTRIES = 256
CACHE_INSTRUCTIONS = 2_000_000  # total program size kept in the cache (a few tens of MiB at most)

_UNANCHORED = _re2.RE2.Anchor.UNANCHORED
_ANCHOR_START = _re2.RE2.Anchor.ANCHOR_START
_SURROGATE = re.compile("[\ud800-\udfff]")
_GO_CAPTURE_NAME = re.compile(r"[A-Za-z0-9_]+")


class RegexError(ValueError):
    """A pattern Go's regexp package refuses, or one too long or too large to compile here."""


def _options() -> re2.Options:
    options = re2.Options()
    options.encoding = re2.Options.Encoding.UTF8
    options.posix_syntax = False  # Perl syntax, as Go's syntax.Perl
    options.longest_match = False  # leftmost-first, as Go's Compile (not CompilePOSIX)
    options.literal = False
    options.never_nl = False
    options.dot_nl = False
    options.never_capture = False
    options.case_sensitive = True
    options.log_errors = False
    options.max_mem = MAX_MEM
    return options


_OPTIONS = _options()


def _encode(text: str) -> bytes:
    try:
        return text.encode()
    except UnicodeEncodeError:
        return _SURROGATE.sub("\ufffd", text).encode()


def _char_width(b: bytes, i: int) -> int:
    """Length of the UTF-8 sequence at b[i] (0 at the end), as Go's utf8.DecodeRune on valid text."""
    if i >= len(b):
        return 0
    lead = b[i]
    return 1 if lead < 0x80 else 2 if lead < 0xE0 else 3 if lead < 0xF0 else 4


def _skip_class(p: str, i: int) -> int:
    """Index just past the character class opening at p[i] == '['."""
    i += 1
    if p[i : i + 1] == "^":
        i += 1
    if p[i : i + 1] == "]":
        i += 1  # a leading ']' is literal
    while i < len(p) and p[i] != "]":
        if p[i] == "\\":
            i += 2
        elif p.startswith("[:", i) and p.find(":]", i + 2) >= 0:
            i = p.find(":]", i + 2) + 2
        else:
            i += 1
    return i + 1


@dataclass(frozen=True)
class _Syntax:
    """What a scan of an accepted pattern finds that RE2 does not report."""

    names: tuple[str, ...]  # capture group names in order, '' for unnamed ones
    not_word_boundary: bool  # a \B: the one assertion that holds inside a multi-byte character
    open_quote: bool  # ends inside \Q... with no \E


def _scan(p: str) -> _Syntax:
    """Scan a pattern RE2 has accepted (so well formed); RegexError for what only RE2 accepts."""
    names: list[str] = []
    not_word_boundary = False
    i = 0
    while i < len(p):
        c = p[i]
        if c == "\\":
            if p.startswith("\\Q", i):
                end = p.find("\\E", i + 2)
                if end < 0:
                    return _Syntax(tuple(names), not_word_boundary, True)
                i = end + 2
                continue
            if p.startswith("\\C", i):
                raise RegexError("error parsing regexp: invalid escape sequence: `\\C`")
            not_word_boundary = not_word_boundary or p.startswith("\\B", i)
            i += 2
        elif c == "[":
            i = _skip_class(p, i)
        elif c == "(" and not p.startswith("(?", i):
            names.append("")
            i += 1
        elif p.startswith(("(?P<", "(?<"), i):
            start = p.index("<", i) + 1
            end = p.index(">", start)
            name = p[start:end]
            if not _GO_CAPTURE_NAME.fullmatch(name):
                raise RegexError(f"error parsing regexp: invalid named capture: `{p[i : end + 1]}`")
            names.append(name)
            i = end + 1
        else:
            i += 1
    return _Syntax(tuple(names), not_word_boundary, False)


def _compile(source: str) -> Any:
    try:
        compiled = _re2.RE2(source.encode(), _OPTIONS)
    except re2.error as exc:  # the binding raises for some errors instead of setting ok()
        raise RegexError(_go_message(str(exc))) from None
    if not compiled.ok():
        raise RegexError(_go_message(compiled.error().decode("utf-8", "replace")))
    return compiled


def _go_message(error: str) -> str:
    """RE2's "code: fragment" in Go's wording "error parsing regexp: code: `fragment`"."""
    if "pattern too large" in error:
        return f"error parsing regexp: expression too large (over RE2's {MAX_MEM >> 20} MiB budget)"
    code, sep, fragment = error.partition(": ")
    return f"error parsing regexp: {code}: `{fragment}`" if sep else f"error parsing regexp: {error}"


class Submatch:
    """The spans of one match in the UTF-8 text it was found in (Go's FindStringSubmatchIndex)."""

    __slots__ = ("_spans", "_text")

    def __init__(self, text: bytes, spans: list[tuple[int, int]]) -> None:
        self._text = text
        self._spans = spans

    def group(self, index: int) -> str | None:
        """The text of group `index` (0: the whole match), None if it did not take part."""
        if not 0 <= index < len(self._spans):
            return None
        start, end = self._spans[index]
        return None if start < 0 else self._text[start:end].decode()

    @property
    def span(self) -> tuple[int, int]:
        """Byte offsets of the whole match."""
        return self._spans[0]


class GoRegex:
    """One compiled Go regexp; its methods are Go's MatchString, FindStringSubmatch, Expand, ReplaceAll."""

    __slots__ = ("_anchor", "_first", "_names", "_re", "size", "source")

    def __init__(self, source: str) -> None:
        if len(source.encode("utf-8", "surrogatepass")) > MAX_PATTERN_BYTES:
            raise RegexError(f"error parsing regexp: expression longer than {MAX_PATTERN_BYTES} bytes")
        try:
            source.encode()
        except UnicodeEncodeError:
            raise RegexError("error parsing regexp: invalid UTF-8") from None
        compiled = _compile(source)
        syntax = _scan(source)
        self._anchor = _UNANCHORED
        self._first = 0  # the index of the whole match among RE2's spans
        if syntax.not_word_boundary:
            # RE2 tries every byte offset as a start, and \B holds inside a character where Go never
            # looks; skipping such matches costs a new search each (quadratic). Instead let the pattern
            # itself step whole characters: Go's unanchored search is exactly `(?s:.*?)(pattern)`.
            close = "\\E)" if syntax.open_quote else ")"
            compiled = _compile(f"(?s:.*?)({source}{close}")
            self._anchor, self._first = _ANCHOR_START, 1
        names = list(syntax.names)
        if len(names) != compiled.NumberOfCapturingGroups() - self._first:  # cannot happen; trust RE2
            names = [""] * compiled.NumberOfCapturingGroups()
            for name, index in compiled.NamedCapturingGroups():
                names[index - 1] = name.decode()
            names = names[self._first :]
        self.source = source  # the text compiled, anchors included
        self.size: int = compiled.ProgramSize()
        self._re = compiled
        self._names = names

    def _search(self, b: bytes, pos: int) -> list[tuple[int, int]] | None:
        """Spans of the leftmost match starting at or after byte pos (always on a character boundary)."""
        spans: list[tuple[int, int]] = self._re.Match(self._anchor, b, pos, len(b))
        if spans[0][0] < 0:
            return None
        return spans[self._first :]

    def match_string(self, text: str) -> bool:
        """Whether the text contains a match (for an anchored pattern: whether it matches whole)."""
        return self._search(_encode(text), 0) is not None

    def find_string_submatch(self, text: str) -> Submatch | None:
        """The leftmost match and its groups, or None."""
        b = _encode(text)
        spans = self._search(b, 0)
        return None if spans is None else Submatch(b, spans)

    def expand_string(self, template: str, match: Submatch) -> str:
        """Go's Expand: `$1`, `${1}`, `$name`, `${name}`, `$$`; `$1x` is the group named `1x`."""
        out: list[str] = []
        i = 0
        while True:
            dollar = template.find("$", i)
            if dollar < 0:
                out.append(template[i:])
                return "".join(out)
            out.append(template[i:dollar])
            i = dollar + 1
            if template.startswith("$", i):
                out.append("$")
                i += 1
                continue
            ref = _reference(template, i)
            if ref is None:
                out.append("$")  # malformed: the $ is literal text
                continue
            name, i = ref
            out.append(self._group_by_name(name, match))

    def _group_by_name(self, name: str, match: Submatch) -> str:
        number = _number(name)
        if number >= 0:
            return match.group(number) or ""
        for index, group_name in enumerate(self._names, start=1):
            if group_name == name:
                value = match.group(index)
                if value is not None:
                    return value
        return ""

    def replace_all_string(self, text: str, template: str) -> str:
        """Go's ReplaceAllString: every match replaced by the expanded template."""
        b = _encode(text)
        out: list[bytes] = []
        last_end = pos = 0
        while pos <= len(b):
            spans = self._search(b, pos)
            if spans is None:
                break
            start, end = spans[0]
            out.append(b[last_end:start])
            if end > last_end or start == 0:  # no replacement for an empty match right after a match
                out.append(self.expand_string(template, Submatch(b, spans)).encode())
            last_end = end
            width = _char_width(b, pos)
            if pos + width > end:
                pos += width
            elif pos + 1 > end:
                pos += 1
            else:
                pos = end
        out.append(b[last_end:])
        return b"".join(out).decode()


def _reference(template: str, i: int) -> tuple[str, int] | None:
    """The group name after a '$' at template[i-1] and the index past it; None if malformed (Go's extract)."""
    brace = template.startswith("{", i)
    j = start = i + 1 if brace else i
    while j < len(template) and (template[j].isalpha() or template[j].isdecimal() or template[j] == "_"):
        j += 1
    if j == start:
        return None
    name = template[start:j]
    if brace:
        if not template.startswith("}", j):
            return None
        j += 1
    return name, j


def _number(name: str) -> int:
    """The group number a name spells in Go's Expand, or -1 (not ASCII digits, a leading 0, too big)."""
    if not (name.isascii() and name.isdigit()) or (len(name) > 1 and name[0] == "0") or len(name) > 9:
        return -1
    return int(name)


class _Cache:
    """Compiled patterns, least recently used first, bounded in entries and in total program size."""

    def __init__(self) -> None:
        self._entries: OrderedDict[str, GoRegex] = OrderedDict()
        self._size = 0
        self._lock = threading.Lock()

    def get(self, source: str) -> GoRegex:
        with self._lock:
            hit = self._entries.get(source)
            if hit is not None:
                self._entries.move_to_end(source)
                return hit
        compiled = GoRegex(source)  # outside the lock: compiling may take milliseconds
        if compiled.size > CACHE_INSTRUCTIONS // 4:
            return compiled  # too big to keep: a caller that repeats it pays the compile again
        with self._lock:
            if source not in self._entries:
                self._entries[source] = compiled
                self._size += compiled.size
            while len(self._entries) > CACHE_ENTRIES or self._size > CACHE_INSTRUCTIONS:
                _, evicted = self._entries.popitem(last=False)
                self._size -= evicted.size
        return compiled


_CACHE = _Cache()


def compile_go(pattern: str) -> GoRegex:
    """Go's regexp.Compile(pattern): unanchored, as template `match` and `reReplaceAll` use it."""
    return _CACHE.get(pattern)


def compile_anchored(pattern: str) -> GoRegex:
    """regexp.Compile("^(?:" + pattern + ")$"): a label matcher's or label_replace()'s regex."""
    try:
        return _CACHE.get(f"^(?:{pattern})$")
    except RegexError:
        compile_go(pattern)  # if the bare pattern is at fault, say so in terms of the pattern itself
        raise
