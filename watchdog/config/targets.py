"""The `targets:` of the config: each vLLM server to watch, how actions reach it, and its canary."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from ..redact import secret, secret_flags, secret_named, url_password
from .addresses import http_url, scrape_address
from .durations import parse_duration
from .httpclient import HttpClientConfig
from .httpkeys import HTTP_CLIENT_KEYS, parse_http_client
from .limits import LIMIT_KEYS, ScrapeLimits, parse_limits
from .yamlnodes import Node

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
DEFAULT_JOB = "vllm"
# Labels every series of a target carries, set by the watchdog: a target's `labels:` cannot set them.
TARGET_LABELS = ("job", "instance", "target")


@dataclass(frozen=True)
class CanaryConfig:
    """A tiny completion that proves the engine really generates tokens."""

    enabled: bool = True
    model: str | None = None  # None: ask /v1/models
    prompt: str = "Hello"
    max_tokens: int = 1
    interval: float = 5.0
    timeout: float = 10.0
    api_key: str | None = field(default=None, repr=False, metadata=secret())  # bearer (vLLM --api-key)


@dataclass(frozen=True)
class DiscoveredBy:
    """Where a discovered target came from: its discovery, the source within it (a file and group, a
    container), and the labels it found there (Prometheus' discoveredLabels)."""

    mechanism: str  # "file_sd" | "docker_sd"
    config: str  # which discovery of the config: `file_sd_configs[0]`
    source: str  # `/etc/vllm-watchdog/targets/a.json:0` (file and group), `docker:<container>`
    labels: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class TargetConfig:
    """One vLLM server to watch."""

    name: str
    url: str = field(metadata=secret(url_password))
    job: str = DEFAULT_JOB  # the `job` label, as the operator's Prometheus names its scrape job for vLLM
    container: str | None = None
    metrics_path: str = "/metrics"
    health_path: str = "/health"
    health_timeout: float = 2.0
    health_probe: bool = True
    canary: CanaryConfig = field(default_factory=CanaryConfig)
    labels: Mapping[str, str] = field(default_factory=dict)
    # process mode: the watchdog launches and supervises this vLLM, with this extra environment
    command: tuple[str, ...] = field(default=(), metadata=secret(secret_flags))
    env: Mapping[str, str] = field(default_factory=dict, metadata=secret(secret_named))
    unit: str | None = None  # systemd mode: restart only
    gpus: tuple[int, ...] = ()  # NVML indices of the GPUs this server uses (gpu_power_limit)
    http: HttpClientConfig = field(default_factory=HttpClientConfig)  # TLS and credentials, every request
    limits: Mapping[str, int] = field(default_factory=dict)  # its own ScrapeLimits, over the `global:` ones
    # Set on a discovered target; not part of its identity: the same server found again (another container
    # id after a restart) is the same target, its scrapes, caches and runtime kept.
    discovered: DiscoveredBy | None = field(default=None, compare=False)

    @property
    def mode(self) -> str | None:
        """How actions reach the server: "docker", "process", "systemd", or None (watch only)."""
        if self.container:
            return "docker"
        if self.command:
            return "process"
        return "systemd" if self.unit else None

    @property
    def instance(self) -> str:
        """The `instance` label: host:port of the URL, as Prometheus derives it from the scrape address."""
        return scrape_address(self.url)

    @property
    def series_labels(self) -> dict[str, str]:
        """The labels of every series the watchdog stores for this target (scraped and probed)."""
        return {**self.labels, "job": self.job, "instance": self.instance, "target": self.name}

    def scrape_limits(self, defaults: ScrapeLimits) -> ScrapeLimits:
        """The limits of its scrapes: its own where it sets them, `defaults` (the `global:` ones) else."""
        return replace(defaults, **self.limits) if self.limits else defaults

    @property
    def metrics_url(self) -> str:
        """Where /metrics is scraped."""
        return self.url.rstrip("/") + self.metrics_path

    @property
    def health_url(self) -> str:
        """Where /health is probed."""
        return self.url.rstrip("/") + self.health_path


def parse_canary(node: Node) -> CanaryConfig:
    """A target's `canary:` (a mapping, or `false`/`true`)."""
    d = CanaryConfig()
    if isinstance(node.node.value, str):  # `canary: false` shorthand
        enabled = node.boolean()
        return CanaryConfig(enabled=d.enabled if enabled is None else enabled)
    m = node.mapping({"enabled", "model", "prompt", "max_tokens", "interval", "timeout", "api_key"})
    if m is None:
        return d
    enabled = m["enabled"].boolean() if "enabled" in m else None
    max_tokens = m["max_tokens"].integer(minimum=1) if "max_tokens" in m else None
    interval = m["interval"].parsed(parse_duration) if "interval" in m else None
    timeout = m["timeout"].parsed(parse_duration) if "timeout" in m else None
    return CanaryConfig(
        enabled=d.enabled if enabled is None else enabled,
        model=m["model"].string() if "model" in m else None,
        prompt=(m["prompt"].string() or d.prompt) if "prompt" in m else d.prompt,
        max_tokens=max_tokens or d.max_tokens,
        interval=interval or d.interval,
        timeout=timeout or d.timeout,
        api_key=(m["api_key"].string() or None) if "api_key" in m else None,
    )


# The keys that say how a server is watched; a discovery's `target:` template takes these alone.
WATCH_KEYS = frozenset(
    {"job", "metrics_path", "health_path", "health_timeout", "health_probe", "canary", "labels"}
    | HTTP_CLIENT_KEYS
    | LIMIT_KEYS
)
# The keys that say which server it is and how actions reach it.
_OWN_KEYS = frozenset({"name", "url", "container", "command", "env", "unit", "gpus"})


def _watch_settings(m: dict[str, Node], node: Node, job: str) -> dict[str, Any]:
    """The TargetConfig fields of WATCH_KEYS, defaults filled in."""
    d = TargetConfig(name="-", url="http://-")
    paths = {}
    for key in ("metrics_path", "health_path"):
        value = m[key].string() if key in m else None
        if value is not None and not value.startswith("/"):
            m[key].error("must start with '/'")
            value = None
        paths[key] = value or getattr(d, key)
    timeout = m["health_timeout"].parsed(parse_duration) if "health_timeout" in m else None
    labels = m["labels"].string_map() if "labels" in m else None
    for reserved in TARGET_LABELS:
        if labels and reserved in labels:
            m["labels"].error(f"must not set {reserved!r}; it is derived from the target")
    own_job = m["job"].string() if "job" in m else None
    if "job" in m and not own_job:
        m["job"].error("must not be empty")
    probe = m["health_probe"].boolean() if "health_probe" in m else None
    return {
        "job": own_job or job,
        "metrics_path": paths["metrics_path"],
        "health_path": paths["health_path"],
        "health_timeout": timeout or d.health_timeout,
        "health_probe": d.health_probe if probe is None else probe,
        "canary": parse_canary(m["canary"]) if "canary" in m else d.canary,
        "labels": labels or {},
        "http": parse_http_client(m, node, {}),
        "limits": parse_limits(m),
    }


def parse_template(node: Node, job: str = DEFAULT_JOB) -> TargetConfig:
    """A discovery's `target:`: how each server it finds is watched (WATCH_KEYS); name and url are
    placeholders that every discovered target fills in."""
    m = node.mapping(set(WATCH_KEYS)) or {}
    return TargetConfig(name="-", url="http://-", **_watch_settings(m, node, job))


def parse_target(node: Node, job: str = DEFAULT_JOB) -> TargetConfig | None:
    """One item of `targets:`, with `job` unless it names its own; None when unusable (problems recorded)."""
    m = node.mapping(set(WATCH_KEYS | _OWN_KEYS))
    if m is None:
        return None
    for required in ("name", "url"):
        if required not in m:
            node.error("is required", field=f"{node.path}.{required}")
    name = m["name"].string() if "name" in m else None
    if name is not None and not valid_name(name):
        m["name"].error("must be letters, digits, '_', '.' or '-'")
        name = None
    url = m["url"].parsed(http_url) if "url" in m else None
    settings = _watch_settings(m, node, job)
    container = m["container"].string() if "container" in m else None
    command = tuple(m["command"].string_list() or []) if "command" in m else ()
    unit = m["unit"].string() if "unit" in m else None
    if sum(bool(x) for x in (container, command, unit)) > 1:
        node.error("set at most one of container, command or unit (how actions reach this server)")
    if "command" in m and not command:
        m["command"].error("must list the program and its arguments")
    gpus = [item.integer(minimum=0) for item in m["gpus"].items()] if "gpus" in m else []
    if name is None or url is None:
        return None
    return TargetConfig(
        name=name,
        url=url,
        container=container,
        command=command,
        env=(m["env"].string_map() or {}) if "env" in m else {},
        unit=unit,
        gpus=tuple(g for g in gpus if g is not None),
        **settings,
    )


def valid_name(name: str) -> bool:
    """Whether `name` is a target name: letters, digits, `_ . -`, starting with a letter or digit."""
    return _NAME.fullmatch(name) is not None
