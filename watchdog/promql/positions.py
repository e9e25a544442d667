"""Where in an expression a parse error is: promql-parser reports none, so we locate it ourselves."""

from __future__ import annotations

import re
from dataclasses import dataclass

import promql_parser

_TOKEN = re.compile(
    r"""(?P<space>\s+|\#[^\n]*)
      | (?P<string>"(?:[^"\\\n]|\\.)*"|'(?:[^'\\\n]|\\.)*'|`[^`]*`)
      | (?P<duration>(?:[0-9]+(?:ms|[smhdwy]))+)
      | (?P<number>0[xX][0-9a-fA-F]+|(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?)
      | (?P<ident>[a-zA-Z_:][a-zA-Z0-9_:]*)
      | (?P<op>==|!=|>=|<=|=~|!~|[-+*/%^<>=(){}\[\],:@])
      | (?P<bad>.)""",
    re.VERBOSE | re.DOTALL,
)
_CLOSERS = {"(": ")", "{": "}", "[": "]"}
# Completions tried after a prefix to decide whether the prefix could still become a valid expression.
# Up to this many tokens each prefix is tried in turn; a longer expression is bisected (each try parses it).
_LINEAR_SCAN = 64
_MIDDLES = ("", " x", " 1", '"a"', '="a"', "1m", " 1m", " (x)", " (a) (x)", " x)", ' "a"', "]", "a) (x")


@dataclass(frozen=True)
class Token:
    """One lexical token of an expression: its kind, text and 0-based start offset."""

    kind: str
    text: str
    start: int

    @property
    def end(self) -> int:
        """Offset just past the token."""
        return self.start + len(self.text)


def tokenize(text: str) -> list[Token]:
    """Split an expression into tokens (whitespace and comments dropped; unknown characters kept as 'bad')."""
    tokens = []
    for m in _TOKEN.finditer(text):
        kind = m.lastgroup or "bad"
        if kind != "space":
            tokens.append(Token(kind, m.group(), m.start()))
    return tokens


def is_syntax_error(message: str) -> bool:
    """True for parser messages about malformed text (as opposed to type or arity errors)."""
    return message.startswith("invalid promql query") or "unexpected" in message or "unclosed" in message


def _parses(text: str) -> bool:
    try:
        promql_parser.parse(text)
    except ValueError as exc:
        return not is_syntax_error(str(exc))
    return True


def _closers(tokens: list[Token]) -> str | None:
    stack: list[str] = []
    for tok in tokens:
        if tok.text in _CLOSERS and tok.kind == "op":
            stack.append(_CLOSERS[tok.text])
        elif tok.kind == "op" and tok.text in (")", "}", "]") and (not stack or stack.pop() != tok.text):
            return None
    return "".join(reversed(stack))


def _viable(text: str, tokens: list[Token]) -> bool:
    """Whether some short completion of this prefix parses."""
    closers = _closers(tokens)
    if closers is None:
        return False
    prefix = text[: tokens[-1].end]
    return any(_parses(prefix + middle + closers) for middle in _MIDDLES)


def find_token(tokens: list[Token], text: str, *, kind: str | None = None, call: bool = False) -> int | None:
    """Start of the first token with this text (and kind); with call=True it must be followed by '('."""
    for i, tok in enumerate(tokens):
        if tok.text != text or (kind is not None and tok.kind != kind):
            continue
        if call and (i + 1 >= len(tokens) or tokens[i + 1].text != "("):
            continue
        return tok.start
    return None


def _named_position(message: str, text: str, tokens: list[Token]) -> int | None:
    m = re.search(r"function (?:with name )?'(\w+)'|call to '(\w+)'", message)
    if m:
        return find_token(tokens, m.group(1) or m.group(2), kind="ident")
    m = re.search(r"set operator '(\w+)'", message)
    if m:
        return find_token(tokens, m.group(1), kind="ident")
    m = re.match(r"illegal regex for (.*)$", message, re.DOTALL)
    if m:
        for tok in tokens:
            if tok.kind == "string" and tok.text[1:-1] == m.group(1):
                return tok.start
    if "aggregat" in message:
        for tok in tokens:
            if tok.kind == "ident" and tok.text.lower() in PARSER_AGGREGATORS:
                return tok.start
    return None


# Aggregation keywords promql-parser accepts (compile.py rejects the ones newer than 2.42).
PARSER_AGGREGATORS = frozenset(
    (
        "sum",
        "avg",
        "min",
        "max",
        "count",
        "group",
        "stddev",
        "stdvar",
        "topk",
        "bottomk",
        "quantile",
        "count_values",
        "limitk",
        "limit_ratio",
    )
)


def error_position(text: str, message: str) -> int:
    """Best guess at the 0-based offset of the error the parser reported with `message`."""
    tokens = tokenize(text)
    for tok in tokens:
        if tok.kind == "bad":
            return tok.start
    named = _named_position(message, text, tokens)
    if named is not None:
        return named
    if not is_syntax_error(message):
        return tokens[0].start if tokens else 0
    if len(tokens) > _LINEAR_SCAN:
        return _bisect_position(text, tokens)
    for k in range(len(tokens)):
        if not _viable(text, tokens[: k + 1]):
            return tokens[k].start
    return len(text.rstrip())


def _bisect_position(text: str, tokens: list[Token]) -> int:
    """The start of the first token after which no completion parses, found in a logarithmic number of tries
    (a prefix that cannot be completed stays so when it grows); the linear scan would parse each prefix."""
    if _viable(text, tokens):
        return len(text.rstrip())
    lo, hi = 0, len(tokens) - 1  # the prefix of hi + 1 tokens is not viable; of lo tokens, assumed viable
    while lo < hi:
        mid = (lo + hi) // 2
        if _viable(text, tokens[: mid + 1]):
            lo = mid + 1
        else:
            hi = mid
    return tokens[hi].start


def line_column(text: str, position: int) -> tuple[int, int]:
    """1-based line and column of a 0-based offset, as Prometheus' parser reports them (`L:C:`)."""
    position = max(0, min(position, len(text)))
    line = text.count("\n", 0, position) + 1
    return line, position - (text.rfind("\n", 0, position) + 1) + 1


def parse_error_text(text: str, message: str, position: int | None) -> str:
    """promtool's wording of a parse error: `L:C: parse error: reason`. promql-parser's generic "invalid
    promql query" becomes what is at the position: the end of the input, or the token found there."""
    pos = position or 0
    at_end = pos >= len(text.rstrip())
    if at_end:
        pos = len(text)  # Prometheus reports what went wrong at the end at its EOF token, after any newline
    reason = message
    if message.startswith("invalid promql query"):
        if at_end:
            reason = "unexpected end of input"
        else:
            tok = next((t for t in tokenize(text) if t.start >= pos), None)
            kinds = {"ident": "identifier", "op": "character", "bad": "character"}
            reason = f'unexpected {kinds.get(tok.kind, tok.kind)} "{tok.text}"' if tok else reason
    line, column = line_column(text, pos)
    return f"{line}:{column}: parse error: {reason}"
