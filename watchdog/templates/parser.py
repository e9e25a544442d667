"""Parse tokens into a Go text/template tree, checking functions and variables as Go's parser does."""

from __future__ import annotations

from collections.abc import Collection

from ..formats.gostrconv import parse_float
from .lexer import TemplateError, Token, lex
from .nodes import (
    Action,
    Chain,
    Command,
    Control,
    Dot,
    Field,
    Identifier,
    Literal,
    LoopJump,
    Nil,
    Node,
    Pipe,
    Text,
    Variable,
)

_MAX_DEPTH = 100


_UNESCAPES = {"a": "\a", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t", "v": "\v", "\\": "\\"}


def unquote(src: str) -> str:
    """strconv.Unquote for "...", `...` and '.' literals; ValueError when malformed."""
    q, body = src[0], src[1:-1]
    if q == "`":
        return body.replace("\r", "")
    out = bytearray()
    i = 0
    while i < len(body):
        c = body[i]
        if c != "\\":
            if c == q:
                raise ValueError("invalid syntax")
            out += c.encode()
            i += 1
            continue
        e = body[i + 1 : i + 2]
        if e in _UNESCAPES or e == q:
            out += _UNESCAPES.get(e, e).encode()
            i += 2
        elif e in ("x", "u", "U") or e.isdigit():
            n = {"x": 2, "u": 4, "U": 8}.get(e, 3)
            start = i + (1 if e.isdigit() else 2)
            digits = body[start : start + n]
            base = 8 if e.isdigit() else 16
            if len(digits) != n or any(
                d not in "0123456789abcdefABCDEF"[: base + (6 if base == 16 else 0)] for d in digits
            ):
                raise ValueError("invalid syntax")
            code = int(digits, base)
            if e in "uU":
                if code > 0x10FFFF or 0xD800 <= code < 0xE000:
                    raise ValueError("invalid syntax")
                out += chr(code).encode()
            elif code > 255:
                raise ValueError("invalid syntax")
            else:
                out.append(code)
            i = start + n
        else:
            raise ValueError("invalid syntax")
    text = out.decode("utf-8", "replace")
    if q == "'" and len(text) != 1:
        raise ValueError("invalid syntax")
    return text


def _go_int(text: str) -> int | None:
    """strconv.ParseInt(text, 0, 64) for template numbers; None when it is not an integer."""
    body = text.lstrip("+-")
    neg = text.startswith("-")
    if text[:2].count("+") + text[:2].count("-") > 1 or "_" in body[-1:] or "__" in body:
        return None
    clean = body.replace("_", "")
    base = 10
    if len(clean) > 1 and clean[0] == "0":
        base = {"x": 16, "o": 8, "b": 2}.get(clean[1].lower(), 8)
        clean = clean[2:] if clean[1].isalpha() else clean[1:]
    elif body.startswith("_"):
        return None
    try:
        n = int(clean, base) if clean else None
    except ValueError:
        return None
    if n is None:
        return None
    n = -n if neg else n
    return n if -(2**63) <= n < 2**64 else None


def number_value(tok: Token, text: str) -> int | float:
    """The value of a number or character constant as an empty-interface argument (int or float64)."""
    src = tok.val
    fail = TemplateError(f"illegal number syntax: {src!r}", text, tok.pos)
    if tok.kind == "char":
        try:
            return ord(unquote(src))
        except ValueError:
            raise TemplateError(f"malformed character constant: {src}", text, tok.pos) from None
    if src.endswith("i"):
        raise TemplateError(f"complex constant {src} is not supported", text, tok.pos)
    n = _go_int(src)
    is_hex_int = src.lstrip("+-")[:2].lower() == "0x" and not any(c in src for c in ".pP")
    if n is not None and (is_hex_int or not any(c in src for c in ".eEpP")):
        if n >= 2**63:
            raise TemplateError(f"{src} overflows int", text, tok.pos)
        return n
    try:
        f = parse_float(src)
    except ValueError:
        raise fail from None
    if not any(c in src for c in ".eEpP"):
        raise TemplateError(f"integer overflow: {src!r}", text, tok.pos)
    return f


class Parser:
    """Recursive descent over tokens, following text/template/parse."""

    def __init__(
        self, text: str, functions: Collection[str], unsupported: dict[str, str], variables: list[str]
    ):
        self.text = text
        self.toks = lex(text)
        self.i = 0
        self.functions = functions
        self.unsupported = unsupported
        self.vars = list(variables)
        self.range_depth = 0
        self.depth = 0

    def fail(self, message: str, pos: int) -> TemplateError:
        return TemplateError(message, self.text, pos)

    def next(self) -> Token:
        tok = self.toks[self.i]
        self.i += 1
        return tok

    def peek(self) -> Token:
        return self.toks[self.i]

    def next_non_space(self) -> Token:
        tok = self.next()
        while tok.kind == "space":
            tok = self.next()
        return tok

    def peek_non_space(self) -> Token:
        tok = self.next_non_space()
        self.i -= 1
        return tok

    def expect(self, kind: str, context: str) -> Token:
        tok = self.next_non_space()
        if tok.kind != kind:
            raise self.unexpected(tok, context)
        return tok

    def unexpected(self, tok: Token, context: str) -> TemplateError:
        what = "EOF" if tok.kind == "eof" else f"{tok.val!r}"
        return self.fail(f"unexpected {what} in {context}", tok.pos)

    def parse(self) -> list[Node]:
        """Parse the whole template."""
        nodes, stop = self.item_list(top=True)
        assert stop is None
        return nodes

    def item_list(self, top: bool = False) -> tuple[list[Node], Token | None]:
        """Nodes up to {{end}} or {{else}} (returned, consumed up to the keyword) or EOF at top level."""
        nodes: list[Node] = []
        while True:
            tok = self.next()
            if tok.kind == "eof":
                if top:
                    return nodes, None
                raise self.fail("unexpected EOF", tok.pos)
            if tok.kind == "text":
                nodes.append(Text(tok.pos, tok.val))
                continue
            word = self.peek_non_space()
            if word.kind == "keyword" and word.val in ("end", "else"):
                if top:
                    raise self.fail(f"unexpected {{{{{word.val}}}}}", word.pos)
                self.next_non_space()
                return nodes, word
            nodes.append(self.action(tok))

    def action(self, left: Token) -> Node:
        tok = self.next_non_space()
        if tok.kind == "keyword":
            if tok.val in ("if", "with", "range"):
                return self.control(tok)
            if tok.val in ("break", "continue"):
                if self.range_depth == 0:
                    raise self.fail(f"{{{{{tok.val}}}}} outside {{{{range}}}}", tok.pos)
                self.expect("right", tok.val)
                return LoopJump(tok.pos, tok.val)
            raise self.fail(f"{{{{{tok.val}}}}} is not supported in alert templates", tok.pos)
        self.i -= 1
        return Action(left.pos, self.pipeline("command", "right"))

    def control(self, kw: Token) -> Control:
        self.depth += 1
        if self.depth > _MAX_DEPTH:
            raise self.fail("template nested too deeply", kw.pos)
        mark = len(self.vars)
        pipe = self.pipeline(kw.val, "right")
        if kw.val == "range":
            self.range_depth += 1
        body, stop = self.item_list()
        if kw.val == "range":
            self.range_depth -= 1
        node = Control(kw.pos, kw.val, pipe, body)
        assert stop is not None
        if stop.val == "else":
            nxt = self.peek_non_space()
            if kw.val == "if" and nxt.kind == "keyword" and nxt.val == "if":
                self.next_non_space()
                node.else_body = [self.control(nxt)]
            else:
                self.expect("right", "else")
                node.else_body, stop = self.item_list()
                assert stop is not None
                if stop.val != "end":
                    raise self.fail("expected end; found {{else}}", stop.pos)
                self.expect("right", "end")
        else:
            self.expect("right", "end")
        del self.vars[mark:]
        self.depth -= 1
        return node

    def pipeline(self, context: str, end: str) -> Pipe:
        start = self.peek_non_space()
        decl: list[str] = []
        is_assign = False
        while (v := self.peek_non_space()).kind == "var":
            save = self.i
            self.next_non_space()
            after = self.peek_non_space()
            if after.kind in (":=", "="):
                self.next_non_space()
                is_assign = after.kind == "="
                if is_assign and context == "range":
                    raise self.fail("assigning range variables with = is not supported; use :=", after.pos)
                if is_assign and v.val not in self.vars:
                    raise self.fail(f"undefined variable {v.val!r}", v.pos)
                decl.append(v.val)
                break
            if after.kind == "," and context == "range" and not decl:
                self.next_non_space()
                decl.append(v.val)
                continue
            if after.kind == ",":
                raise self.fail(f"too many declarations in {context}", after.pos)
            if decl:
                raise self.fail("range can only initialize variables", v.pos)
            self.i = save
            break
        else:
            if decl:
                raise self.fail("range can only initialize variables", v.pos)
        cmds: list[Command] = []
        while True:
            tok = self.peek_non_space()
            if tok.kind == end:
                self.next_non_space()
                break
            if tok.kind in (
                "bool",
                "char",
                "dot",
                "field",
                "ident",
                "number",
                "nil",
                "raw",
                "string",
                "var",
                "(",
            ):
                cmds.append(self.command())
            else:
                raise self.unexpected(tok, context)
        if not cmds:
            raise self.fail(f"missing value for {context}", start.pos)
        for n, cmd in enumerate(cmds[1:], start=2):
            if isinstance(cmd.args[0], (Literal, Dot, Nil)):
                raise self.fail(f"non executable command in pipeline stage {n}", cmd.pos)
        self.vars.extend(decl)
        return Pipe(start.pos, decl, is_assign, cmds)

    def command(self) -> Command:
        cmd = Command(self.peek_non_space().pos, [])
        while True:
            self.peek_non_space()
            operand = self.operand()
            if operand is not None:
                cmd.args.append(operand)
            tok = self.next()
            if tok.kind == "space":
                continue
            if tok.kind in ("right", ")"):
                self.i -= 1
            elif tok.kind != "|":
                raise self.unexpected(tok, "operand")
            break
        if not cmd.args:
            raise self.fail("empty command", cmd.pos)
        return cmd

    def operand(self) -> Node | None:
        node = self.term()
        if node is None or self.peek().kind != "field":
            return node
        names: list[str] = []
        while self.peek().kind == "field":
            names.append(self.next().val[1:])
        if isinstance(node, Field):
            return Field(node.pos, node.names + tuple(names))
        if isinstance(node, Variable):
            return Variable(node.pos, node.name, node.names + tuple(names))
        if isinstance(node, (Literal, Nil, Dot)):
            raise self.fail("unexpected . after term", node.pos)
        return Chain(node.pos, node, tuple(names))

    def term(self) -> Node | None:
        tok = self.next_non_space()
        k = tok.kind
        if k == "ident":
            if tok.val in self.unsupported:
                raise self.fail(
                    f"function {tok.val!r} is not supported: {self.unsupported[tok.val]}", tok.pos
                )
            if tok.val not in self.functions:
                raise self.fail(f"function {tok.val!r} not defined", tok.pos)
            return Identifier(tok.pos, tok.val)
        if k == "dot":
            return Dot(tok.pos)
        if k == "nil":
            return Nil(tok.pos)
        if k == "var":
            if tok.val not in self.vars:
                raise self.fail(f"undefined variable {tok.val!r}", tok.pos)
            return Variable(tok.pos, tok.val, ())
        if k == "field":
            return Field(tok.pos, (tok.val[1:],))
        if k == "bool":
            return Literal(tok.pos, tok.val, tok.val == "true")
        if k in ("number", "char"):
            return Literal(tok.pos, tok.val, number_value(tok, self.text))
        if k in ("string", "raw"):
            try:
                return Literal(tok.pos, tok.val, unquote(tok.val), is_string=True)
            except ValueError:
                raise self.fail(f"invalid string literal {tok.val}", tok.pos) from None
        if k == "(":
            self.depth += 1
            if self.depth > _MAX_DEPTH:
                raise self.fail("template nested too deeply", tok.pos)
            pipe = self.pipeline("parenthesized pipeline", ")")
            self.depth -= 1
            return pipe
        self.i -= 1
        return None
