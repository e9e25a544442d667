"""The tree of a parsed template: text, actions, control structures and operands."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Node:
    """Base of all tree nodes; `pos` is the offset in the template."""

    pos: int


@dataclass
class Text(Node):
    """Literal text between actions."""

    text: str


@dataclass
class Identifier(Node):
    """A function name."""

    name: str


@dataclass
class Dot(Node):
    """The cursor `.`."""


@dataclass
class Nil(Node):
    """The untyped `nil`."""


@dataclass
class Field(Node):
    """`.A.b`: fields of dot."""

    names: tuple[str, ...]


@dataclass
class Variable(Node):
    """`$x.a.b`: a variable and fields of it."""

    name: str
    names: tuple[str, ...]


@dataclass
class Literal(Node):
    """A string, bool or number constant; `value` is what Go's untyped constant becomes in interface{}."""

    source: str
    value: str | bool | int | float
    is_string: bool = False


@dataclass
class Chain(Node):
    """`(pipeline).a.b` or `func.a`: fields of a term's value."""

    node: Node
    names: tuple[str, ...]


@dataclass
class Command(Node):
    """One pipeline stage: operands separated by spaces."""

    args: list[Node]


@dataclass
class Pipe(Node):
    """`$x := a | b c`; `is_assign` for `=`."""

    decl: list[str]
    is_assign: bool
    cmds: list[Command]


@dataclass
class Action(Node):
    """`{{pipeline}}`: printed unless it declares variables."""

    pipe: Pipe


@dataclass
class Control(Node):
    """if / with / range with their bodies."""

    kind: str
    pipe: Pipe
    body: list[Node] = field(default_factory=list)
    else_body: list[Node] | None = None


@dataclass
class LoopJump(Node):
    """`{{break}}` or `{{continue}}`."""

    kind: str
