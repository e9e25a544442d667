"""`include:`: actions, routes and notifiers kept in other files, merged into the including config.

An included file holds only `actions:`, `routes:` and `notifiers:`; it cannot include further files, so there
are no cycles. Paths are relative to the including file, or `bundled:NAME` for a file shipped with the
package, which must stay inside the bundled folder; every file is read by `config.files.read_text`. Merge
order: the including file's own actions override included ones of the same name; its own routes come first,
then each included file's routes in order; notifiers are appended likewise. Every problem names the file it
is in and its line.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from ..actions.config import ActionConfig, RouteConfig, parse_action, parse_route
from ..notifiers.config import NotifierConfig, parse_notifier
from .files import UnreadableFileError, read_text, resolve_bundled
from .yamlnodes import Node, Problems, compose

BUNDLED_PREFIX = "bundled:"
INCLUDABLE = ("actions", "routes", "notifiers")


@dataclass(frozen=True)
class Part:
    """The remediation keys of one file, read with that file's own name for its problems."""

    keys: Mapping[str, Node]
    problems: Problems


def read_includes(node: Node, base: Path, bundled: Path, env: Mapping[str, str] | None) -> list[Part]:
    """Read every file listed under `include:`; problems about the list itself go to the including file."""
    parts: list[Part] = []
    seen: dict[Path, int] = {}
    for item in node.items():
        spec = item.string()
        if spec is None:
            continue
        path = Path(spec)
        try:
            if spec.startswith(BUNDLED_PREFIX):
                path = resolve_bundled(spec[len(BUNDLED_PREFIX) :], bundled)
            else:
                path = Path(spec).expanduser()
                path = path if path.is_absolute() else base / path
            key = path.resolve()
            if key in seen:
                item.error(f"{spec} is already included (line {seen[key]})")
                continue
            seen[key] = item.line
            text = read_text(path)
        except UnreadableFileError as exc:
            item.error(f"cannot read included file {path} ({exc})")
            continue
        parts.append(_part(text, str(path), env))
    return parts


def _part(text: str, source: str, env: Mapping[str, str] | None) -> Part:
    problems = Problems(source)
    root = compose(text, problems)
    if root is None:
        if not problems.items:
            problems.add(None, "(root)", "included file is empty")
        return Part({}, problems)
    top = Node(root, "", problems, env).mapping()
    keys: dict[str, Node] = {}
    for name, child in (top or {}).items():
        if name == "include":
            child.error("an included file cannot include other files")
        elif name not in INCLUDABLE:
            child.error(f"an included file holds only {', '.join(INCLUDABLE)}")
        else:
            keys[name] = child
    return Part(keys, problems)


def _declared(keys: Mapping[str, Node]) -> dict[str, Node]:
    return (keys["actions"].mapping() or {}) if "actions" in keys else {}


def merge_remediation(
    own: Mapping[str, Node], parts: list[Part], http_url: Callable[[str], str]
) -> tuple[dict[str, ActionConfig], tuple[RouteConfig, ...], tuple[NotifierConfig, ...]]:
    """Actions, routes and notifiers of the including file (`own`) merged with its included parts."""
    own_actions = _declared(own)
    declared: dict[str, Node] = {}  # action name -> the node that defines it (own ones win)
    for part in parts:
        for name, node in _declared(part.keys).items():
            if name in declared and name not in own_actions:
                first = declared[name]
                node.error(f"action {name!r} is already defined in {first.problems.file}:{first.line}")
                continue
            declared[name] = node
    declared.update(own_actions)
    actions: dict[str, ActionConfig] = {}
    for name, node in declared.items():
        action = parse_action(name, node)
        if action is not None:
            actions[name] = action
    sources = [own, *(p.keys for p in parts)]
    routes: list[RouteConfig | None] = []
    notifiers: list[NotifierConfig] = []
    for keys in sources:
        routes += [parse_route(item, actions, set(declared)) for item in _items(keys, "routes")]
        for item in _items(keys, "notifiers"):
            notifier = parse_notifier(item, len(notifiers), http_url)
            if notifier is not None and any(n.name == notifier.name for n in notifiers):
                item.error(f"duplicate notifier name {notifier.name!r}", field=f"{item.path}.name")
            elif notifier is not None:
                notifiers.append(notifier)
    return actions, tuple(r for r in routes if r is not None), tuple(notifiers)


def _items(keys: Mapping[str, Node], key: str) -> list[Node]:
    return list(keys[key].items()) if key in keys else []
