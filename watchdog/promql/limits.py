"""How large and deep an expression may be, checked in one linear pass before the parser sees it.

promql-parser (Rust) recurses once per level of the tree it builds: about 4,500 levels overflow the stack and
kill the process, and building the tree costs memory and time in proportion to the sum of every node's depth
(4,000 chained `+` take 3.8 s and 2.2 GB). A chain of binary operators is a deep tree without a single
bracket, so the depth counted here is a bound on the tree's: each bracketed group adds one level plus one per
operator directly inside it. The limits sit far above what a rule or a dashboard writes and far below the
parser's trouble: the deepest tree accepted parses in a few milliseconds, and evaluating it stays within
Python's recursion limit.
"""

from __future__ import annotations

from dataclasses import dataclass

from .values import PromQLError

MAX_LENGTH = 16_384  # characters, as the HTTP API allows for one parameter
MAX_DEPTH = 128  # bound on the tree's depth: brackets, calls, and operators within one group
MAX_TERMS = 2_048  # names, numbers, strings, operators and brackets

_OPEN = frozenset("([{")
_CLOSE = {")": "(", "]": "[", "}": "{"}
_SYMBOLS = frozenset("+-*/%^<>=!")
_TWO_CHARACTER = ("==", "!=", ">=", "<=", "=~", "!~")
_WORD_OPERATORS = frozenset(("and", "or", "unless", "atan2"))
_QUOTES = frozenset("\"'`")


@dataclass
class _Group:
    """One bracketed group: where it opens, its enclosing group, and the operators directly inside it."""

    start: int
    bracket: str
    parent: int
    operators: list[int]


@dataclass(frozen=True)
class Shape:
    """What the check measured: the depth bound and the number of terms."""

    depth: int
    terms: int


def _skip_string(text: str, i: int) -> int:
    """The offset just past the string literal opening at i (the end of text if it never closes)."""
    quote, n = text[i], len(text)
    i += 1
    while i < n:
        c = text[i]
        if c == quote:
            return i + 1
        if c == "\\" and quote != "`":
            i += 1
        i += 1
    return n


def _skip_word(text: str, i: int) -> int:
    """The offset just past a name, number or duration starting at i (an exponent's sign included)."""
    n = len(text)
    signed = (text[i].isdigit() or text[i] == ".") and not text.startswith(("0x", "0X"), i)
    while i < n:
        c = text[i]
        if not (c.isalnum() or c in "_:." or (signed and c in "+-" and text[i - 1] in "eE")):
            break
        i += 1
    return i


def _scan(text: str) -> tuple[list[_Group], int]:
    """Split the text into groups (group 0 is the whole expression) and count its terms."""
    groups = [_Group(0, "", -1, [])]
    current, terms, i, n = 0, 0, 0, len(text)
    while i < n:
        c = text[i]
        if c.isspace() or c == ",":
            i += 1
            continue
        terms += 1
        if c == "#":
            end = text.find("\n", i)
            i, terms = (n if end < 0 else end), terms - 1
        elif c in _QUOTES:
            i = _skip_string(text, i)
        elif c.isalnum() or c in "_:.":
            end = _skip_word(text, i)
            if text[i:end].lower() in _WORD_OPERATORS and groups[current].bracket != "{":
                groups[current].operators.append(i)
            i = end
        elif c in _OPEN:
            groups.append(_Group(i, c, current, []))
            current, i = len(groups) - 1, i + 1
        elif c in _CLOSE:
            if groups[current].bracket == _CLOSE[c]:
                current = groups[current].parent
            i += 1
        elif c in _SYMBOLS:
            width = 2 if text.startswith(_TWO_CHARACTER, i) else 1
            if groups[current].bracket != "{":
                groups[current].operators.append(i)  # `1 - -1` has two: each a node of the tree
            i += width
        else:
            i += 1
    return groups, terms


def _depths(groups: list[_Group]) -> tuple[list[int], int | None]:
    """Each group's depth bound, and the offset where it first passes MAX_DEPTH (None if nowhere)."""
    depth = [0] * len(groups)
    where = None
    for g, group in enumerate(groups):  # parents come before their children
        above = depth[group.parent] if group.parent >= 0 else 0
        depth[g] = above + 1 + len(group.operators)
        if where is None and depth[g] > MAX_DEPTH:
            where = group.start if above + 1 > MAX_DEPTH else group.operators[MAX_DEPTH - above - 1]
    return depth, where


def check_shape(text: str) -> Shape:
    """Refuse an expression too long, too deep or with too many terms; raises PromQLError with a position."""
    if len(text) > MAX_LENGTH:
        message = f"expression too long: {len(text)} characters, the limit is {MAX_LENGTH}"
        raise PromQLError(message, MAX_LENGTH)
    groups, terms = _scan(text)
    depth, where = _depths(groups)
    if where is not None:
        raise PromQLError(
            f"expression nested too deeply: more than {MAX_DEPTH} levels of brackets, calls and operators",
            where,
        )
    if terms > MAX_TERMS:
        raise PromQLError(
            f"expression too large: {terms} names, numbers, strings, operators and brackets, "
            f"the limit is {MAX_TERMS}",
            0,
        )
    return Shape(max(depth), terms)
