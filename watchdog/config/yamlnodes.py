"""Reading YAML with line numbers: typed field access that collects file:line problems.

A problem never quotes what a file that is not a config holds (an include symlinked to a password file
would otherwise have its lines echoed as field names): a key is named only when it looks like a field name
(`shown_key`), a quoted value is clipped (`shown_value`), and so are the names in YAML syntax errors.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterator, Mapping
from typing import TypeVar

import yaml

from ..errors import Problem
from ..redact import is_secret_name

T = TypeVar("T")
MAX_DEPTH = 100  # nesting deeper than this is refused: PyYAML composes recursively (RecursionError otherwise)
_ENV = re.compile(r"\$\$|\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")
_DOLLARS = re.compile(r"\$\$")
_SHOWN_KEY = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}")
_SHOWN_VALUE = 64  # characters of a value quoted in a problem
_YAML_QUOTED = re.compile(r"'(?!<)[^']{3,}'|\"[^\"]{3,}\"")  # PyYAML quotes aliases and tags from the text


def shown_key(key: str) -> bool:
    """Whether a key may be named in a problem: short and shaped like a field name, not like file contents."""
    return _SHOWN_KEY.fullmatch(key) is not None


def did_you_mean(key: str, allowed: set[str]) -> str:
    """ "did you mean 'x'? " for a close match among `allowed` (difflib), else ""; `key` is a shown key."""
    import difflib  # noqa: PLC0415 - only an unknown key needs it

    close = difflib.get_close_matches(key, sorted(allowed), n=1, cutoff=0.7)
    return f"did you mean {close[0]!r}? " if close else ""


def shown_value(text: str) -> str:
    """A value quoted for a problem: its repr, clipped to a few dozen characters."""
    if len(text) <= _SHOWN_VALUE:
        return repr(text)
    return repr(text[:_SHOWN_VALUE]) + f"…({len(text)} characters)"


def _path_is_secret(path: str) -> bool:
    return any(is_secret_name(part) for part in re.split(r"[.\[\]]+", path) if part)


class Problems:
    """Collects problems for one file so that every error is reported, not just the first."""

    def __init__(self, file: str) -> None:
        self.file = file
        self.items: list[Problem] = []
        # Values substituted from the environment into a secret-named field, or from a secret-named
        # variable: masked wherever a problem or a log line could show them (`redact.config_secrets`).
        self.secrets: list[str] = []

    def add(self, node: yaml.Node | None, field: str, message: str) -> None:
        """Record a problem at the node's line (1-based)."""
        line = node.start_mark.line + 1 if node is not None else 1
        self.items.append(Problem(self.file, line, field, message))


class _DepthLimitedLoader(yaml.SafeLoader):
    """The safe loader, refusing collections nested deeper than MAX_DEPTH at the line where that happens."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0

    def compose_node(self, parent: yaml.Node | None, index: int) -> yaml.Node | None:
        """Compose one node, counting how deep it is."""
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                mark = self.peek_event().start_mark  # type: ignore[no-untyped-call]
                raise yaml.composer.ComposerError(None, None, f"nested deeper than {MAX_DEPTH} levels", mark)
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


def _compose_data(text: str) -> yaml.Node | None:
    """Compose a file of data (a discovery file): no aliases (ten nested lists of ten aliases each are 10^10
    items to whoever walks them), at most MAX_DEPTH levels, checked on libyaml's events before its composer
    (recursive) runs; libyaml where PyYAML has it, ~15 times faster than the pure-Python loader."""
    loader = getattr(yaml, "CSafeLoader", None) if yaml.__with_libyaml__ else None
    depth = 0
    for event in yaml.parse(text, Loader=loader or yaml.SafeLoader):
        problem = ""
        if isinstance(event, yaml.AliasEvent):
            problem = "aliases (*name) are not allowed here"
        elif isinstance(event, (yaml.SequenceStartEvent, yaml.MappingStartEvent)):
            depth += 1
            problem = f"nested deeper than {MAX_DEPTH} levels" if depth > MAX_DEPTH else ""
        elif isinstance(event, (yaml.SequenceEndEvent, yaml.MappingEndEvent)):
            depth -= 1
        if problem:
            at = event.start_mark
            mark = yaml.error.Mark("", 0, at.line if at else 0, at.column if at else 0, None, 0)
            raise yaml.composer.ComposerError(None, None, problem, mark)
    return yaml.compose(text, Loader=loader or _DepthLimitedLoader)


def _unquoted(message: str) -> str:
    return _YAML_QUOTED.sub("'…'", message)


def compose(text: str, problems: Problems, aliases: bool = True) -> yaml.Node | None:
    """Parse YAML text into a node tree, recording a syntax error as a problem (an alias is one unless
    `aliases`)."""
    try:
        return yaml.compose(text, Loader=_DepthLimitedLoader) if aliases else _compose_data(text)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark
        line = mark.line + 1 if mark is not None else 1
        message = _unquoted(str(exc.problem))
        if exc.context and exc.context_mark is not None:
            message += f" ({_unquoted(exc.context)} started on line {exc.context_mark.line + 1})"
        problems.items.append(Problem(problems.file, line, "(yaml)", message))
    except yaml.reader.ReaderError as exc:  # a control character: binary data, most likely
        line = text.count("\n", 0, exc.position) + 1
        what = f"#x{exc.character:04x}" if isinstance(exc.character, int) else "byte"
        problems.items.append(Problem(problems.file, line, "(yaml)", f"unacceptable character {what}"))
    except yaml.YAMLError:
        problems.items.append(Problem(problems.file, 1, "(yaml)", "not valid YAML"))
    return None


def substitute_env(text: str, env: Mapping[str, str]) -> str:
    """Replace ${VAR} and ${VAR:-default}; `$$` is a literal `$`. Raise KeyError for unset VAR."""

    out: list[str] = []
    at = 0
    for start, end, name, default in _env_refs(text):
        out.append(text[at:start])
        if name is None:
            out.append("$")
        elif name in env:
            out.append(env[name])
        elif default is not None:
            out.append(default)
        else:
            raise KeyError(name)
        at = end
    out.append(text[at:])
    return "".join(out)


def _env_refs(text: str) -> Iterator[tuple[int, int, str | None, str | None]]:
    """Where `$$`, `${VAR}` and `${VAR:-default}` stand in `text`, left to right: (start, end, VAR or None for
    `$$`, default). In linear time: _ENV fails only where no `}` follows, after scanning to the end of the
    text, and from every `${VAR:-` there (100 kB of them took 27 s); so it runs up to the last `}`, and past
    that, where nothing but `$$` can match, only `$$` is looked for."""
    last = text.rfind("}") + 1
    for m in _ENV.finditer(text, 0, last):
        yield m.start(), m.end(), m.group(1), m.group(2)
    for m in _DOLLARS.finditer(text, last):
        yield m.start(), m.end(), None, None


class Node:
    """A YAML node with its dotted field path, for typed reads that record problems."""

    def __init__(
        self,
        node: yaml.Node,
        path: str,
        problems: Problems,
        env: Mapping[str, str] | None = None,
        substitute: bool = True,
    ) -> None:
        self.node = node
        self.path = path
        self.problems = problems
        self.env = os.environ if env is None else env
        self.substitute = substitute  # False: values are data (a discovery file), `${VAR}` is text

    @property
    def line(self) -> int:
        """1-based line of this node."""
        return int(self.node.start_mark.line) + 1

    def error(self, message: str, field: str | None = None) -> None:
        """Record a problem about this node."""
        self.problems.add(self.node, field or self.path or "(root)", message)

    def _child_path(self, key: str | int, line: int = 0) -> str:
        if isinstance(key, int):
            return f"{self.path}[{key}]"
        if key and not shown_key(key):
            key = f"<field at line {line}>"
        key = key or '""'  # an empty key still names a field
        return f"{self.path}.{key}" if self.path else key

    def mapping(self, allowed: set[str] | None = None) -> dict[str, Node] | None:
        """Return the children of a mapping; unknown keys are problems; None if not a mapping."""
        if not isinstance(self.node, yaml.MappingNode):
            self.error("must be a mapping")
            return None
        out: dict[str, Node] = {}
        for knode, vnode in self.node.value:
            key = str(knode.value)
            line = int(knode.start_mark.line) + 1
            child = Node(vnode, self._child_path(key, line), self.problems, self.env, self.substitute)
            if allowed is not None and key not in allowed:
                known = ", ".join(sorted(allowed))
                if shown_key(key) or not key:  # an empty key is named `""`
                    hint = did_you_mean(key, allowed)
                    self.problems.add(knode, child.path, f"unknown key ({hint}allowed: {known})")
                else:
                    where = self.path or "(root)"
                    self.problems.add(knode, where, f"unknown field at line {line} (allowed: {known})")
                continue
            if key in out:
                self.problems.add(knode, child.path, "duplicate key")
                continue
            out[key] = child
        return out

    def sequence(self) -> list[Node] | None:
        """Return the items of a sequence; None (with a problem) if not a sequence."""
        if not isinstance(self.node, yaml.SequenceNode):
            self.error("must be a list")
            return None
        return [
            Node(v, self._child_path(i), self.problems, self.env, self.substitute)
            for i, v in enumerate(self.node.value)
        ]

    def items(self) -> Iterator[Node]:
        """Iterate over a sequence's items (nothing if not a sequence)."""
        yield from self.sequence() or []

    def is_null(self) -> bool:
        """True for an explicit YAML null."""
        return isinstance(self.node, yaml.ScalarNode) and self.node.tag == "tag:yaml.org,2002:null"

    def scalar(self) -> str | None:
        """The scalar's text after ${ENV} substitution; None (with a problem) if not a scalar."""
        if not isinstance(self.node, yaml.ScalarNode):
            self.error("must be a scalar value")
            return None
        text = str(self.node.value)
        if not self.substitute:
            return text
        try:
            value = substitute_env(text, self.env)
        except KeyError as exc:
            self.error(f"environment variable {exc.args[0]} is not set (use ${{VAR:-default}})")
            return None
        if value != text:
            self._note_secrets(text)
        return value

    def _note_secrets(self, text: str) -> None:
        secret_field = _path_is_secret(self.path)
        for _, _, name, _ in _env_refs(text):
            if name is not None and (secret_field or is_secret_name(name)) and self.env.get(name):
                self.problems.secrets.append(self.env[name])

    def string(self) -> str | None:
        """A non-empty string."""
        text = self.scalar()
        if text is not None and text == "":
            self.error("must not be empty")
            return None
        return text

    def boolean(self) -> bool | None:
        """A YAML boolean."""
        text = self.scalar()
        if text is None:
            return None
        low = text.lower()
        if low in ("true", "yes", "on"):
            return True
        if low in ("false", "no", "off"):
            return False
        self.error(f"must be true or false, got {shown_value(text)}")
        return None

    def integer(self, minimum: int | None = None) -> int | None:
        """An integer, optionally bounded below."""
        text = self.scalar()
        if text is None:
            return None
        try:
            value = int(text)
        except ValueError:
            self.error(f"must be an integer, got {shown_value(text)}")
            return None
        if minimum is not None and value < minimum:
            self.error(f"must be >= {minimum}, got {value}")
            return None
        return value

    def number(self) -> float | None:
        """A float."""
        text = self.scalar()
        if text is None:
            return None
        try:
            return float(text)
        except ValueError:
            self.error(f"must be a number, got {shown_value(text)}")
            return None

    def parsed(self, parse: Callable[[str], T]) -> T | None:
        """A scalar converted by `parse`; a ValueError becomes a problem."""
        text = self.scalar()
        if text is None:
            return None
        try:
            return parse(text)
        except ValueError as exc:
            self.error(str(exc))
            return None

    def string_map(self) -> dict[str, str] | None:
        """A mapping of strings to strings (labels, headers)."""
        children = self.mapping()
        if children is None:
            return None
        out: dict[str, str] = {}
        for key, child in children.items():
            value = child.scalar()
            if value is not None:
                out[key] = value
        return out

    def string_list(self) -> list[str] | None:
        """A list of strings (a single string is accepted as a one-item list)."""
        if isinstance(self.node, yaml.ScalarNode) and not self.is_null():
            one = self.string()
            return None if one is None else [one]
        items = self.sequence()
        if items is None:
            return None
        values = [item.string() for item in items]
        return [v for v in values if v is not None]
