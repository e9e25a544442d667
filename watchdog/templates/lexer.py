"""Tokens of Go text/template: text, {{ }} with trim markers, comments, and the words inside actions."""

from __future__ import annotations

from dataclasses import dataclass

KEYWORDS = frozenset(
    {"block", "break", "continue", "define", "else", "end", "if", "range", "template", "with"}
)
_SPACE = " \t\r\n"


class TemplateError(ValueError):
    """A template that does not parse or fails to execute; the message says what and where."""

    def __init__(self, message: str, text: str = "", offset: int | None = None) -> None:
        self.offset = offset
        self.line = self.column = 0
        if offset is not None:
            self.line = text.count("\n", 0, offset) + 1
            self.column = offset - (text.rfind("\n", 0, offset) + 1) + 1
            message = f"{message} (line {self.line}, column {self.column})"
        super().__init__(message)


@dataclass(frozen=True)
class Token:
    """One lexeme; `pos` is its offset in the template text."""

    # text left right space ident keyword field var dot char number string raw bool nil | ( ) := = , eof
    kind: str
    val: str
    pos: int


def _alnum(c: str) -> bool:
    return c == "_" or c.isalpha() or c.isdigit()


class _Lexer:
    def __init__(self, text: str) -> None:
        self.text = text
        self.pos = 0
        self.tokens: list[Token] = []
        self.trim_next = False

    def fail(self, message: str, pos: int | None = None) -> TemplateError:
        return TemplateError(message, self.text, self.pos if pos is None else pos)

    def emit(self, kind: str, start: int) -> None:
        self.tokens.append(Token(kind, self.text[start : self.pos], start))

    def right_delim(self) -> tuple[bool, bool]:
        """At '}}' or ' -}}'? Returns (at delimiter, with trim marker)."""
        t, p = self.text, self.pos
        if t.startswith("}}", p):
            return True, False
        if p + 1 < len(t) and t[p] in _SPACE and t[p + 1] == "-" and t.startswith("}}", p + 2):
            return True, True
        return False, False

    def run(self) -> list[Token]:
        t = self.text
        while self.pos < len(t):
            start = self.pos
            j = t.find("{{", start)
            end = len(t) if j < 0 else j
            trim_left = j >= 0 and t[j + 2 : j + 3] == "-" and t[j + 3 : j + 4] in tuple(_SPACE)
            body_start, body_end = start, end
            if self.trim_next:
                while body_start < body_end and t[body_start] in _SPACE:
                    body_start += 1
            if trim_left:
                while body_end > body_start and t[body_end - 1] in _SPACE:
                    body_end -= 1
            self.trim_next = False
            if body_end > body_start:
                self.tokens.append(Token("text", t[body_start:body_end], body_start))
            if j < 0:
                break
            self.pos = j + (4 if trim_left else 2)
            self.action(j)
        self.tokens.append(Token("eof", "", len(t)))
        return self.tokens

    def action(self, delim_pos: int) -> None:
        """Lex an action (or a comment) whose left delimiter is at `delim_pos`, up to its right delimiter."""
        t = self.text
        if t.startswith("/*", self.pos):
            self.comment(delim_pos)
            return
        self.tokens.append(Token("left", "{{", delim_pos))
        paren_depth = 0
        while True:
            at, trim = self.right_delim()
            if at and paren_depth == 0:
                self.tokens.append(Token("right", "}}", self.pos))
                self.pos += 4 if trim else 2
                self.trim_next = trim
                return
            if self.pos >= len(t):
                raise self.fail("unclosed action", delim_pos)
            if at and paren_depth:
                raise self.fail("unclosed left paren")
            paren_depth = self.item(paren_depth)

    def comment(self, delim_pos: int) -> None:
        """Skip a {{/* comment */}}, which must end at the right delimiter."""
        close = self.text.find("*/", self.pos + 2)
        if close < 0:
            raise self.fail("unclosed comment", delim_pos)
        self.pos = close + 2
        at, trim = self.right_delim()
        if not at:
            raise self.fail("comment ends before closing delimiter")
        self.pos += 4 if trim else 2
        self.trim_next = trim

    def item(self, paren_depth: int) -> int:
        """Lex the item of an action at pos; returns the paren depth after it."""
        t = self.text
        start, c = self.pos, t[self.pos]
        if c in _SPACE:
            self.space(start)
        elif t.startswith(":=", start):
            self.pos += 2
            self.emit(":=", start)
        elif c in "=|,()":
            self.pos += 1
            paren_depth += {"(": 1, ")": -1}.get(c, 0)
            if paren_depth < 0:
                raise self.fail("unexpected right paren", start)
            self.emit(c, start)
        elif c in "\"'":
            self.quote(start, c)
        elif c == "`":
            self.raw(start)
        elif c == "$" or (c == "." and not t[start + 1 : start + 2].isdigit()):
            self.field_or_var(start, "var" if c == "$" else "field")
        elif c in "+-." or c.isdigit():
            self.number(start)
        elif _alnum(c):
            self.word(start)
        else:
            raise self.fail(f"unrecognized character in action: {c!r}", start)
        return paren_depth

    def space(self, start: int) -> None:
        """A run of spaces, up to a trimming right delimiter (' -}}', which starts at a space)."""
        t = self.text
        while self.pos < len(t) and t[self.pos] in _SPACE and not self.right_delim()[1]:
            self.pos += 1
        if self.pos > start:
            self.emit("space", start)

    def raw(self, start: int) -> None:
        """A `raw string`."""
        close = self.text.find("`", start + 1)
        if close < 0:
            raise self.fail("unterminated raw quoted string", start)
        self.pos = close + 1
        self.emit("raw", start)

    def word(self, start: int) -> None:
        """A keyword, true/false, nil or an identifier."""
        t = self.text
        while self.pos < len(t) and _alnum(t[self.pos]):
            self.pos += 1
        self.terminator()
        word = t[start : self.pos]
        kind = "keyword" if word in KEYWORDS else "bool" if word in ("true", "false") else "ident"
        self.emit("nil" if word == "nil" else kind, start)

    def terminator(self) -> None:
        t, p = self.text, self.pos
        if p < len(t) and t[p] not in _SPACE + ".,|:()" and not self.right_delim()[0]:
            raise self.fail(f"bad character {t[p]!r}")

    def field_or_var(self, start: int, kind: str) -> None:
        t = self.text
        self.pos += 1
        while self.pos < len(t) and _alnum(t[self.pos]):
            self.pos += 1
        self.terminator()
        if self.pos == start + 1 and kind == "field":
            kind = "dot"
        self.emit(kind, start)

    def quote(self, start: int, q: str) -> None:
        t = self.text
        self.pos += 1
        while True:
            if self.pos >= len(t) or t[self.pos] == "\n":
                what = "quoted string" if q == '"' else "character constant"
                raise self.fail(f"unterminated {what}", start)
            c = t[self.pos]
            self.pos += 2 if c == "\\" else 1
            if c == q:
                break
        self.emit("string" if q == '"' else "char", start)

    def number(self, start: int) -> None:
        t = self.text
        p = start
        if p < len(t) and t[p] in "+-":
            p += 1
        digits = "0123456789_"
        if t[p : p + 1] == "0" and t[p + 1 : p + 2] in tuple("xXoObB"):
            digits = {"x": "0123456789abcdefABCDEF_", "o": "01234567_", "b": "01_"}[t[p + 1].lower()]
            p += 2
        while p < len(t) and t[p] in digits:
            p += 1
        if t[p : p + 1] == ".":
            p += 1
            while p < len(t) and t[p] in digits:
                p += 1
        exp = "eE" if len(digits) == 11 else "pP" if len(digits) == 23 else ""
        if exp and t[p : p + 1] and t[p] in exp:
            p += 1
            if t[p : p + 1] in ("+", "-"):
                p += 1
            while p < len(t) and t[p] in "0123456789_":
                p += 1
        if t[p : p + 1] == "i":
            p += 1
        self.pos = p
        if p < len(t) and _alnum(t[p]):
            raise self.fail(f"bad number syntax: {t[start : p + 1]!r}", start)
        self.emit("number", start)


def lex(text: str) -> list[Token]:
    """Split a template into tokens; comments vanish and trim markers are applied to the text."""
    return _Lexer(text).run()
