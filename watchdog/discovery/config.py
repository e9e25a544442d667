"""The discovery part of the config: `file_sd_configs:` and `docker_sd_configs:`, as frozen dataclasses.

Each discovery finds servers and makes each one a target as its `target:` template says (the keys of a
`targets:` entry that say how a server is watched). See docs/discovery.md for how a found server maps to a
target.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from ..config.durations import parse_duration
from ..config.targets import DEFAULT_JOB, TargetConfig, parse_template
from ..config.yamlnodes import Node

EXTENSIONS = (".json", ".yml", ".yaml")  # as Prometheus: all lower case or all upper case
RUNTIMES = ("docker", "systemd")  # how a file_sd group may let actions reach a server (never a command)
DEFAULT_MAX_TARGETS = 64
MAX_TARGETS_CEILING = 4096  # `max_targets` above this is refused: each target scrapes every interval
DEFAULT_PREFIX = "vllm-watchdog."
DEFAULT_PORT = 8000  # vLLM's own default


def _template() -> TargetConfig:
    return TargetConfig(name="-", url="http://-")


@dataclass(frozen=True)
class FileSdConfig:
    """Targets listed in JSON or YAML files in Prometheus' file_sd format, read again when they change."""

    name: str  # `file_sd_configs[0]`: how logs, metrics and the API name this discovery
    files: tuple[str, ...]  # absolute paths; the last part may hold one `*`
    refresh_interval: float = 10.0  # how often the files are looked at (stat); changed ones are read again
    scheme: str = "http"  # unless a group's `__scheme__` says otherwise
    runtimes: frozenset[str] = frozenset()  # which reserved labels may name how actions reach a server
    max_targets: int = DEFAULT_MAX_TARGETS
    target: TargetConfig = field(default_factory=_template)


@dataclass(frozen=True)
class DockerSdConfig:
    """Containers carrying `<label_prefix>target`, each a docker-mode target acting on that container."""

    name: str  # `docker_sd_configs[0]`
    label_prefix: str = DEFAULT_PREFIX
    port: int = DEFAULT_PORT  # unless the container's `<prefix>port` label says otherwise
    scheme: str = "http"
    refresh_interval: float = 15.0
    max_targets: int = DEFAULT_MAX_TARGETS
    target: TargetConfig = field(default_factory=_template)


def _valid_pattern(pattern: str) -> bool:
    """Prometheus' rule for file_sd paths: a JSON or YAML extension (all lower or all upper case), at most
    one `*`, and that one in the last part of the path."""
    ext = pattern[pattern.rfind(".") :]
    if ext.lower() not in EXTENSIONS or ext not in (ext.lower(), ext.upper()):
        return False
    star = pattern.find("*")
    return star < 0 or (pattern.count("*") == 1 and "/" not in pattern[star:])


@dataclass(frozen=True)
class _Common:
    """The keys both discoveries take."""

    refresh_interval: float
    scheme: str
    max_targets: int
    target: TargetConfig


def _common(m: dict[str, Node], job: str, refresh_interval: float) -> _Common:
    interval = None
    if "refresh_interval" in m:
        interval = m["refresh_interval"].parsed(parse_duration)
        if interval == 0:
            m["refresh_interval"].error("must be greater than 0")
            interval = None
    scheme = m["scheme"].string() if "scheme" in m else None
    if scheme not in (None, "http", "https"):
        m["scheme"].error("must be http or https")
        scheme = None
    limit = m["max_targets"].integer(minimum=1) if "max_targets" in m else None
    if limit is not None and limit > MAX_TARGETS_CEILING:
        m["max_targets"].error(f"must be at most {MAX_TARGETS_CEILING}")
        limit = None
    return _Common(
        refresh_interval=interval or refresh_interval,
        scheme=scheme or "http",
        max_targets=limit or DEFAULT_MAX_TARGETS,
        target=parse_template(m["target"], job) if "target" in m else TargetConfig("-", "http://-", job),
    )


def parse_file_sd(node: Node, base: Path, job: str = DEFAULT_JOB) -> tuple[FileSdConfig, ...]:
    """`file_sd_configs:`; relative paths are relative to `base`, the config file's directory."""
    out = []
    for i, item in enumerate(node.items()):
        m = item.mapping({"files", "refresh_interval", "scheme", "runtimes", "max_targets", "target"})
        if m is None:
            continue
        if "files" not in m:
            item.error("is required", field=f"{item.path}.files")
            continue
        files = []
        for entry in m["files"].items():
            pattern = entry.string()
            if pattern is None:
                continue
            if not _valid_pattern(pattern):
                entry.error(
                    "must end in .json, .yml or .yaml and hold at most one '*', in its last part "
                    "(Prometheus' rule for file_sd paths)"
                )
                continue
            pattern = os.path.expanduser(pattern)
            files.append(pattern if os.path.isabs(pattern) else str(base / pattern))
        if not files and m["files"].sequence() is not None:
            m["files"].error("must list at least one file or pattern")
        runtimes = set(m["runtimes"].string_list() or []) if "runtimes" in m else set()
        for unknown in sorted(runtimes - set(RUNTIMES)):
            m["runtimes"].error(f"unknown runtime {unknown!r} (allowed: {', '.join(RUNTIMES)})")
        common = _common(m, job, FileSdConfig.refresh_interval)
        out.append(
            FileSdConfig(
                name=f"file_sd_configs[{i}]",
                files=tuple(files),
                refresh_interval=common.refresh_interval,
                scheme=common.scheme,
                runtimes=frozenset(runtimes & set(RUNTIMES)),
                max_targets=common.max_targets,
                target=common.target,
            )
        )
    return tuple(out)


def parse_docker_sd(node: Node, job: str = DEFAULT_JOB) -> tuple[DockerSdConfig, ...]:
    """`docker_sd_configs:`."""
    out = []
    for i, item in enumerate(node.items()):
        m = item.mapping({"label_prefix", "port", "refresh_interval", "scheme", "max_targets", "target"})
        if m is None:
            continue
        prefix = m["label_prefix"].string() if "label_prefix" in m else DEFAULT_PREFIX
        port = m["port"].integer(minimum=1) if "port" in m else DEFAULT_PORT
        if port is not None and port > 65535:
            m["port"].error("must be a TCP port, 1 to 65535")
            port = None
        common = _common(m, job, DockerSdConfig.refresh_interval)
        out.append(
            DockerSdConfig(
                name=f"docker_sd_configs[{i}]",
                label_prefix=prefix or DEFAULT_PREFIX,
                port=port or DEFAULT_PORT,
                scheme=common.scheme,
                refresh_interval=common.refresh_interval,
                max_targets=common.max_targets,
                target=common.target,
            )
        )
    if len({sd.label_prefix for sd in out}) < len(out):
        node.error("two docker_sd_configs watch the same label_prefix; each container would be found twice")
    return tuple(out)
