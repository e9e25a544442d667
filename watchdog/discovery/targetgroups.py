"""One file_sd file: Prometheus' list of target groups, `[{targets: [host:port, ...], labels: {...}}]`, made
into targets as the discovery's template says.

A group's labels are the labels of each of its targets' series, except these:

- `job` is the targets' `job` label (else the template's `job`, else `global.job`), as in Prometheus;
- `__scheme__` and `__metrics_path__` say where to scrape, as in Prometheus;
- `__watchdog_target__` names the target (its `target` label); one group then lists one address. Without
  it the name is the address, with every character other than letters, digits, `_ . -` made `_`
  (`gpu-3:8000` is `gpu-3_8000`);
- `__watchdog_container__` or `__watchdog_unit__` say how actions reach the server (docker or systemd mode),
  only where the discovery's `runtimes` allow that mode; `__watchdog_gpus__` lists its GPUs (`0,1`);
- other labels starting with `__` (`__meta_*`) are shown among the discovered labels only;
- `instance` and `target` are refused: both are derived from the target.

A file with any problem is refused as a whole, as Prometheus refuses it: the caller keeps what the file
said last time it was good. Problems name the file, the line and the field, never the file's contents.
"""

from __future__ import annotations

import json
import string
from collections.abc import Mapping
from dataclasses import dataclass, replace
from urllib.parse import urlsplit

import yaml

from ..config.addresses import http_url
from ..config.files import UnreadableFileError, read_text
from ..config.targets import TARGET_LABELS, DiscoveredBy, TargetConfig, valid_name
from ..config.yamlnodes import MAX_DEPTH, Node, Problems, compose, shown_key
from ..errors import Problem
from .config import FileSdConfig

MAX_FILE_BYTES = 1 << 20  # a file_sd file of a thousand targets is ~100 KiB
MAX_GROUPS = 1024  # groups in one file
MAX_LABELS = 64  # labels of one group
MAX_LABEL_VALUE = 1024  # characters
NAME_LABEL = "__watchdog_target__"
CONTAINER_LABEL = "__watchdog_container__"
UNIT_LABEL = "__watchdog_unit__"
GPUS_LABEL = "__watchdog_gpus__"
FILEPATH_LABEL = "__meta_filepath"  # Prometheus' own: the file a target was read from
_LABEL_START = frozenset(string.ascii_letters + "_")
_LABEL_CHARS = _LABEL_START | frozenset(string.digits)
_NAME_CHARS = frozenset(string.ascii_letters + string.digits + "_.-")
_UNIT_CHARS = frozenset(string.ascii_letters + string.digits + ":_.\\@-")


@dataclass(frozen=True)
class RuntimeRef:
    """Which container or systemd unit runs a server, and its GPUs, as its reserved labels name them (none:
    watch only). A reference the actions' Runtime for that server is chosen by."""

    container: str | None = None
    unit: str | None = None
    gpus: tuple[int, ...] = ()


def label_name_ok(name: str) -> bool:
    """Whether `name` is a Prometheus label name, `[a-zA-Z_][a-zA-Z0-9_]*` (no regex on a file's text)."""
    return bool(name) and name[0] in _LABEL_START and all(c in _LABEL_CHARS for c in name)


def encodable(text: str) -> bool:
    """Whether `text` is valid Unicode: a YAML or JSON `\\ud800` escape gives a lone surrogate, which would
    fail later wherever the label is written out."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def name_from_address(address: str) -> str:
    """A target name for an address without `__watchdog_target__`: `gpu-3:8000` -> `gpu-3_8000`."""
    name = "".join(c if c in _NAME_CHARS else "_" for c in address).lstrip("_.-")
    return name or "_"


def target_url(scheme: str, address: str) -> str:
    """The base URL of a server at `host:port`; ValueError unless that is all the address holds."""
    if not address or any(c in address for c in "/?#@\\ \t\r\n"):
        raise ValueError(f"must be host:port, got {address[:64]!r}")
    url = f"{scheme}://{address}"
    http_url(url)
    if urlsplit(url).netloc != address:
        raise ValueError(f"must be host:port, got {address[:64]!r}")
    return url


def parse_gpus(text: str) -> tuple[int, ...]:
    """`0,1` -> (0, 1); ValueError for anything else."""
    out = []
    for raw in text.split(","):
        part = raw.strip()
        if not part.isascii() or not part.isdigit() or len(part) > 4:
            raise ValueError(f"must be GPU indices separated by commas, e.g. 0,1; got {text[:64]!r}")
        out.append(int(part))
    return tuple(out)


_AT = yaml.error.Mark("", 0, 0, 0, None, 0)  # JSON's nodes: a problem names the field, not a line
_TAGS = {dict: "tag:yaml.org,2002:map", list: "tag:yaml.org,2002:seq", str: "tag:yaml.org,2002:str"}


def _json_node(value: object, depth: int) -> yaml.Node:
    """A JSON document (read by the json module, ~300 times faster than a YAML reader) as the YAML nodes
    that the group reader walks."""
    if depth > MAX_DEPTH:
        raise ValueError("too deep")
    if isinstance(value, dict):
        pairs = [
            (yaml.ScalarNode(_TAGS[str], str(k), _AT, _AT), _json_node(v, depth + 1))
            for k, v in value.items()
        ]
        return yaml.MappingNode(_TAGS[dict], pairs, _AT, _AT)
    if isinstance(value, list):
        return yaml.SequenceNode(_TAGS[list], [_json_node(v, depth + 1) for v in value], _AT, _AT)
    if value is None:
        return yaml.ScalarNode("tag:yaml.org,2002:null", "null", _AT, _AT)
    return yaml.ScalarNode(_TAGS[str], value if isinstance(value, str) else json.dumps(value), _AT, _AT)


def read_groups(path: str, sd: FileSdConfig) -> tuple[tuple[TargetConfig, ...], list[Problem]]:
    """The targets a file lists, or the problems that make it unusable (then no targets)."""
    try:
        text = read_text(path, MAX_FILE_BYTES)
    except UnreadableFileError as exc:
        return (), [Problem(path, 1, "(file)", f"cannot read: {exc}")]
    return parse_groups(text, path, sd)


def parse_groups(text: str, path: str, sd: FileSdConfig) -> tuple[tuple[TargetConfig, ...], list[Problem]]:
    """Parse a file's text (JSON if `path` ends in .json, else YAML)."""
    problems = Problems(path)
    if path.lower().endswith(".json"):
        try:
            root: yaml.Node | None = _json_node(json.loads(text), 0)
        except json.JSONDecodeError as exc:
            return (), [Problem(path, exc.lineno, "(json)", exc.msg)]
        except (ValueError, RecursionError):
            return (), [
                Problem(path, 1, "(json)", f"not valid JSON, or nested deeper than {MAX_DEPTH} levels")
            ]
    else:
        root = compose(text, problems, aliases=False)
    if root is None:
        return (), problems.items  # an empty YAML file lists no groups
    groups = Node(root, "", problems, env={}, substitute=False).sequence() or []
    if len(groups) > MAX_GROUPS:
        return (), [Problem(path, 1, "(root)", f"{len(groups)} groups; at most {MAX_GROUPS} per file")]
    out: list[TargetConfig] = []
    for i, group in enumerate(groups):
        out += _group(group, f"{path}:{i}", path, sd)
        if len(out) > sd.max_targets:  # checked as it goes: a file's targets are built at most this far
            return (), [Problem(path, group.line, group.path, f"more than max_targets ({sd.max_targets})")]
    names: dict[str, int] = {}
    for target in out:
        names[target.name] = names.get(target.name, 0) + 1
    for name, count in sorted(names.items()):
        if count > 1:
            problems.add(root, "(root)", f"{count} targets are named {name!r}; names must be unique")
    if problems.items:
        return (), problems.items
    return tuple(out), []


def _group(node: Node, source: str, path: str, sd: FileSdConfig) -> list[TargetConfig]:
    """The targets of one group of a file; none when the group is invalid (its problems recorded)."""
    m = node.mapping({"targets", "labels"})
    if m is None:
        return []
    labels = _labels(m["labels"]) if "labels" in m else {}
    if labels is None:
        return []
    addresses = m["targets"].sequence() if "targets" in m else []
    if addresses is None:
        return []
    where = m.get("labels", node)
    if len(addresses) > sd.max_targets:
        m["targets"].error(f"{len(addresses)} addresses, more than max_targets ({sd.max_targets})")
        return []
    base = _shared(labels, len(addresses), where, sd)
    if base is None:
        return []
    out = []
    for item in m["targets"].items() if "targets" in m else []:
        target = _target(item, base, labels, where, (source, path), sd)
        if target is not None:
            out.append(target)
    return out


def _shared(labels: dict[str, str], count: int, where: Node, sd: FileSdConfig) -> TargetConfig | None:
    """What the `count` targets of a group share, from its labels over the config's defaults; None when a
    label is invalid (recorded at `where`)."""
    if NAME_LABEL in labels and count > 1:
        where.error(f"{NAME_LABEL} names one server; this group lists {count} addresses")
        return None
    scheme = labels.get("__scheme__", sd.scheme)
    if scheme not in ("http", "https"):
        where.error(f"__scheme__ must be http or https, got {scheme[:16]!r}")
        return None
    metrics_path = labels.get("__metrics_path__", sd.target.metrics_path)
    if not metrics_path.startswith("/"):
        where.error("__metrics_path__ must start with '/'")
        return None
    how = _runtime_ref(labels, where, sd)
    if how is None:
        return None
    own = {k: v for k, v in labels.items() if not k.startswith("__") and k != "job"}
    return replace(
        sd.target,
        job=labels.get("job") or sd.target.job,
        metrics_path=metrics_path,
        labels={**sd.target.labels, **own},
        container=how.container,
        unit=how.unit,
        gpus=how.gpus,
    )


def _target(
    item: Node,
    base: TargetConfig,
    labels: dict[str, str],
    where: Node,
    origin: tuple[str, str],
    sd: FileSdConfig,
) -> TargetConfig | None:
    """The target at one address of a group (`origin`: the file's source and path); None when invalid."""
    address = item.string()
    if address is None:
        return None
    scheme = labels.get("__scheme__", sd.scheme)
    try:
        url = target_url(scheme, address)
    except ValueError as exc:
        item.error(str(exc))
        return None
    name = labels.get(NAME_LABEL) or name_from_address(address)
    if not valid_name(name):
        where.error(f"{NAME_LABEL} must be letters, digits, '_', '.' or '-'")
        return None
    source, path = origin
    found = {
        "__address__": address,
        "__scheme__": scheme,
        "__metrics_path__": base.metrics_path,
        FILEPATH_LABEL: path,
        **labels,
    }
    by = DiscoveredBy("file_sd", sd.name, source, found)
    return replace(base, name=name, url=url, discovered=by)


def _labels(node: Node) -> dict[str, str] | None:
    """A group's labels, every name and value checked; None if any is bad (problems recorded)."""
    labels = node.string_map()
    if labels is None:
        return None
    ok = True
    if len(labels) > MAX_LABELS:
        node.error(f"{len(labels)} labels; at most {MAX_LABELS}")
        return None
    for key, value in labels.items():
        if not label_name_ok(key):
            shown = f" {key!r}" if shown_key(key) else ""
            node.error(f"invalid label name{shown} (must match [a-zA-Z_][a-zA-Z0-9_]*)")
            ok = False
        elif key in TARGET_LABELS and key != "job":
            hint = f"; name the target with {NAME_LABEL}" if key == "target" else ""
            node.error(f"must not set {key!r}: it is derived from the target{hint}")
            ok = False
        elif len(value) > MAX_LABEL_VALUE or not encodable(value):
            node.error(f"label {key} must be valid text of at most {MAX_LABEL_VALUE} characters")
            ok = False
    return labels if ok else None


def _runtime_ref(labels: Mapping[str, str], where: Node, sd: FileSdConfig) -> RuntimeRef | None:
    """The container, unit and GPUs the reserved labels give; None if they ask what `runtimes` forbids or
    name no valid container or unit (problems recorded)."""
    container, unit = labels.get(CONTAINER_LABEL) or None, labels.get(UNIT_LABEL) or None
    for label, mode, value in ((CONTAINER_LABEL, "docker", container), (UNIT_LABEL, "systemd", unit)):
        if value is not None and mode not in sd.runtimes:
            where.error(f"{label} needs runtimes: [{mode}] in {sd.name} (off by default)")
            return None
    if container is not None and unit is not None:
        where.error(f"set at most one of {CONTAINER_LABEL} or {UNIT_LABEL}")
        return None
    if container is not None and not valid_name(container):  # Docker's rule for names is the same
        where.error(f"{CONTAINER_LABEL} is not a Docker container name")
        return None
    if unit is not None and (unit.startswith("-") or not all(c in _UNIT_CHARS for c in unit)):
        where.error(f"{UNIT_LABEL} is not a systemd unit name")
        return None
    gpus: tuple[int, ...] = ()
    if labels.get(GPUS_LABEL):
        try:
            gpus = parse_gpus(labels[GPUS_LABEL])
        except ValueError as exc:
            where.error(f"{GPUS_LABEL} {exc}")
            return None
    return RuntimeRef(container, unit, gpus)
