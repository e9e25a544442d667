"""Execute a parsed template against alert data, with Go text/template semantics and hard bounds."""

from __future__ import annotations

from collections.abc import Sequence

from .builtins import Func, FuncError, truth
from .functions import function_map
from .gofmt import fmt_value
from .govalues import AlertData, ArgsMap, GoTime, go_type
from .lexer import TemplateError
from .nodes import Action as ActionNode
from .nodes import (
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

MAX_OUTPUT = 1 << 20  # bytes of output one render may produce
MAX_STEPS = 200_000  # evaluation steps one render may take (nested ranges multiply)
_MISSING = object()  # no value piped in from a previous pipeline stage


class _Jump(Exception):
    def __init__(self, kind: str) -> None:
        self.kind = kind


class Executor:
    """State of one render: variables, output and budgets."""

    def __init__(self, text: str, data: AlertData, external_url: str) -> None:
        self.text = text
        self.funcs = function_map(external_url)
        self.vars: list[list[object]] = [
            ["$", data],
            ["$labels", data.Labels],
            ["$externalLabels", data.ExternalLabels],
            ["$externalURL", data.ExternalURL],
            ["$value", data.Value],
        ]
        self.out: list[str] = []
        self.size = 0
        self.steps = 0
        self.pos = 0

    def fail(self, message: str, pos: int | None = None) -> TemplateError:
        return TemplateError(
            f"error executing template: {message}", self.text, self.pos if pos is None else pos
        )

    def step(self, node: Node) -> None:
        self.pos = node.pos
        self.steps += 1
        if self.steps > MAX_STEPS:
            raise self.fail(f"template takes more than {MAX_STEPS} steps")

    def write(self, s: str) -> None:
        self.size += len(s)
        if self.size > MAX_OUTPUT:
            raise self.fail(f"template output exceeds {MAX_OUTPUT} characters")
        self.out.append(s)

    def run(self, nodes: Sequence[Node], dot: object) -> str:
        """Render the whole template."""
        self.walk_list(nodes, dot)
        return "".join(self.out)

    def walk_list(self, nodes: Sequence[Node], dot: object) -> None:
        for node in nodes:
            self.walk(node, dot)

    def walk(self, node: Node, dot: object) -> None:
        self.step(node)
        if isinstance(node, Text):
            self.write(node.text)
        elif isinstance(node, ActionNode):
            val = self.pipe(node.pipe, dot)
            if not node.pipe.decl:
                self.write("<no value>" if val is None else fmt_value(val))
        elif isinstance(node, LoopJump):
            raise _Jump(node.kind)
        elif isinstance(node, Control):
            mark = len(self.vars)
            if node.kind == "range":
                self.range(node, dot)
            else:
                val = self.pipe(node.pipe, dot)
                if truth(val):
                    self.walk_list(node.body, val if node.kind == "with" else dot)
                elif node.else_body is not None:
                    self.walk_list(node.else_body, dot)
            del self.vars[mark:]

    def range(self, node: Control, dot: object) -> None:
        val = self.pipe(node.pipe, dot)
        if isinstance(val, dict):
            items: list[tuple[object, object]] = sorted(val.items())
        elif val is None:
            items = []
        else:
            raise self.fail(f"range can't iterate over {fmt_value(val)}", node.pos)
        top = len(self.vars)
        for key, elem in items:
            if node.pipe.decl:
                self.vars[top - 1][1] = elem
            if len(node.pipe.decl) > 1:
                self.vars[top - 2][1] = key
            mark = len(self.vars)
            try:
                self.walk_list(node.body, elem)
            except _Jump as jump:
                if jump.kind == "break":
                    break
            finally:
                del self.vars[mark:]
        if not items and node.else_body is not None:
            self.walk_list(node.else_body, dot)

    def lookup(self, name: str) -> list[object]:
        for var in reversed(self.vars):
            if var[0] == name:
                return var
        raise self.fail(f"undefined variable: {name}")

    def pipe(self, pipe: Pipe, dot: object) -> object:
        val: object = _MISSING
        for cmd in pipe.cmds:
            val = self.command(cmd, dot, val)
        for name in pipe.decl:
            if pipe.is_assign:
                self.lookup(name)[1] = val
            else:
                self.vars.append([name, val])
        return val

    def not_a_function(self, args: list[Node], final: object) -> None:
        if len(args) > 1 or final is not _MISSING:
            raise self.fail(f"can't give argument to non-function {self.source(args[0])}", args[0].pos)

    def source(self, node: Node) -> str:
        if isinstance(node, Literal):
            return node.source
        if isinstance(node, Variable):
            return ".".join((node.name, *node.names))
        if isinstance(node, Field):
            return "." + ".".join(node.names)
        return self.text[node.pos : node.pos + 20].split()[0] if self.text[node.pos :].strip() else "?"

    def command(self, cmd: Command, dot: object, final: object) -> object:
        self.step(cmd)
        first = cmd.args[0]
        if isinstance(first, Field):
            return self.fields(dot, first.names, cmd.args, final)
        if isinstance(first, Chain):
            return self.fields(self.operand(first.node, dot), first.names, cmd.args, final)
        if isinstance(first, Identifier):
            return self.call(first, cmd.args, dot, final)
        if isinstance(first, Variable):
            val = self.lookup(first.name)[1]
            if not first.names:
                self.not_a_function(cmd.args, final)
                return val
            return self.fields(val, first.names, cmd.args, final)
        self.not_a_function(cmd.args, final)
        return self.operand(first, dot)

    def operand(self, node: Node, dot: object) -> object:
        """The value of a single operand used as an argument or receiver."""
        self.pos = node.pos
        if isinstance(node, Dot):
            return dot
        if isinstance(node, Literal):
            return node.value
        if isinstance(node, Pipe):
            return self.pipe(node, dot)
        if isinstance(node, Nil):
            raise self.fail("nil is not a command", node.pos)
        return self.command(Command(node.pos, [node]), dot, _MISSING)

    def fields(self, receiver: object, names: tuple[str, ...], args: list[Node], final: object) -> object:
        for n, name in enumerate(names):
            has_args = n == len(names) - 1 and (len(args) > 1 or final is not _MISSING)
            receiver = self.field(receiver, name, has_args)
        return receiver

    def field(self, receiver: object, name: str, has_args: bool) -> object:
        if receiver is None:
            return None
        if isinstance(receiver, AlertData) and name in ("Labels", "ExternalLabels", "ExternalURL", "Value"):
            if has_args:
                raise self.fail(f"{name} has arguments but cannot be invoked as function")
            return getattr(receiver, name)
        if isinstance(receiver, dict):
            if has_args:
                raise self.fail(f"{name} is not a method but has arguments")
            return receiver.get(name, None if isinstance(receiver, ArgsMap) else "")
        if isinstance(receiver, GoTime):
            raise self.fail(f"method {name} of time values is not supported")
        raise self.fail(f"can't evaluate field {name} in type {go_type(receiver)}")

    def call(self, ident: Identifier, nodes: list[Node], dot: object, final: object) -> object:
        name = ident.name
        fn: Func = self.funcs[name]
        args = nodes[1:]
        num_in = len(args) + (final is not _MISSING)
        if fn.variadic is not None:
            if num_in < len(fn.params):
                raise self.fail(
                    f"wrong number of args for {name}: want at least {len(fn.params)} got {len(args)}"
                )
        elif num_in != len(fn.params):
            raise self.fail(f"wrong number of args for {name}: want {len(fn.params)} got {num_in}")
        if name in ("and", "or"):
            val: object = None
            for arg in args:
                val = self.arg(arg, "any", dot)
                if truth(val) == (name == "or"):
                    return val
            return final if final is not _MISSING else val
        argv = [
            self.arg(a, fn.params[i] if i < len(fn.params) else str(fn.variadic), dot)
            for i, a in enumerate(args)
        ]
        if final is not _MISSING:
            last = num_in - 1
            argv.append(self.check(final, fn.params[last] if last < len(fn.params) else str(fn.variadic)))
        self.pos = ident.pos
        try:
            return fn.impl(*argv)
        except FuncError as e:
            raise self.fail(f"error calling {name}: {e}", ident.pos) from None

    def arg(self, node: Node, kind: str, dot: object) -> object:
        if isinstance(node, Literal):
            if kind == "string" and not node.is_string:
                raise self.fail(f"expected string; found {node.source}", node.pos)
            return node.value
        if isinstance(node, Nil):
            if kind == "string":
                raise self.fail("cannot assign nil to string", node.pos)
            return None
        return self.check(self.operand(node, dot), kind)

    def check(self, value: object, kind: str) -> object:
        if kind == "string":
            if value is None:
                raise self.fail("invalid value; expected string")
            if type(value) is not str:
                raise self.fail(f"wrong type for value; expected string; got {go_type(value)}")
        return value
