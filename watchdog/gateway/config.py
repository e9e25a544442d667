"""The `gateway:` section of the config and the spec of `throttle` actions, as frozen dataclasses."""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from ..config.durations import parse_duration, parse_size
from ..config.gatewayreplay import ReplayConfig, parse_replay
from ..redact import secret, secret_keys
from .routes import ADMIN, admin_root

if TYPE_CHECKING:  # the gateway process reads its config as JSON, not YAML
    from ..config.yamlnodes import Node

MiB = 1024 * 1024
ADAPTIVE_SIGNALS = ("queue_time", "ttft")


@dataclass(frozen=True)
class PriorityConfig:
    """Priority classes, highest first; a request's class comes from a header or its API key."""

    header: str = "X-Priority"
    classes: tuple[str, ...] = ("interactive", "batch")
    default: str = "interactive"
    api_keys: Mapping[str, str] = field(default_factory=dict, metadata=secret(secret_keys))  # key -> class


@dataclass(frozen=True)
class SessionConfig:
    """Per-session limits; the key comes from `header`, then the body's `user`, then the API key."""

    header: str = "X-Session-ID"
    rate: float | None = None  # token-bucket refill in requests/s; None: no rate limit
    burst: int = 20  # token-bucket capacity
    max_in_flight: int | None = None  # per-session concurrency cap (admitted and not finished); None: none
    breaker_duration: float = 300.0  # how long throttle_session keeps a breaker open unless it says otherwise
    max_sessions: int = 10_000  # sessions remembered (least recently seen dropped first)
    top_k: int = 10  # sessions exported by name; the rest are summed into session="other"
    anonymous_share: float = 0.75  # requests without a session hold at most this share of the in-flight cap


@dataclass(frozen=True)
class UpstreamBackoffConfig:
    """The gateway's own reflex to vLLM answering 503 (its admission limits): see backoff.py."""

    enabled: bool = True
    factor: float = 0.5  # multiply the in-flight cap by this on a 503 (once per cap: see backoff.py)
    floor: int = 1  # never below
    quiet: float = 10.0  # seconds without a 503 before the cap climbs back
    step: int = 1  # then this many slots more...
    step_interval: float = 5.0  # ...every this many seconds, up to max_in_flight


@dataclass(frozen=True)
class ThrottleSpec:
    """How one action throttles: decrease by `factor` or to `limit`, recover by `step` per `step_interval`."""

    factor: float | None = None  # multiply the current limit (0 < f < 1), or
    limit: int | None = None  # set an absolute limit (exactly one of the two)
    floor: int = 1  # never below
    step: int = 1  # additive increase per step_interval once released
    step_interval: float = 10.0
    adaptive: str | None = None  # None | "queue_time" | "ttft": while held, follow it toward `target`
    target: float = 1.0  # seconds, for adaptive

    def __post_init__(self) -> None:
        if (self.factor is None) == (self.limit is None):
            raise ValueError("a throttle needs exactly one of factor and limit")
        if self.factor is not None and not 0 < self.factor < 1:
            raise ValueError(f"factor must be between 0 and 1 (exclusive), got {self.factor}")
        if self.limit is not None and self.limit < 1:
            raise ValueError(f"limit must be at least 1, got {self.limit}")
        if self.floor < 1:
            raise ValueError(f"floor must be at least 1, got {self.floor}")
        if self.step < 1:
            raise ValueError(f"step must be at least 1, got {self.step}")
        if not self.step_interval > 0 or not math.isfinite(self.step_interval):
            raise ValueError(f"step_interval must be a positive number of seconds, got {self.step_interval}")
        if self.adaptive is not None and self.adaptive not in ADAPTIVE_SIGNALS:
            raise ValueError(f"adaptive must be one of {', '.join(ADAPTIVE_SIGNALS)}, got {self.adaptive!r}")
        if not self.target > 0 or not math.isfinite(self.target):
            raise ValueError(f"target must be a positive number of seconds, got {self.target}")

    def lowered(self, current: int) -> int:
        """The cap a hold sets from `current`: by `factor` or to `limit`, never below `floor`, never up."""
        target = self.limit if self.limit is not None else math.floor(current * (self.factor or 1.0))
        return min(current, max(self.floor, target))

    def to_json(self) -> dict[str, object]:
        """The spec as a JSON object."""
        return asdict(self)

    @classmethod
    def from_json(cls, doc: object) -> ThrottleSpec | None:
        """A spec from to_json() output; None if `doc` is not a valid one."""
        if not isinstance(doc, Mapping):
            return None
        fields = {
            "factor": (float, int, type(None)),
            "limit": (int, type(None)),
            "floor": (int,),
            "step": (int,),
            "step_interval": (float, int),
            "adaptive": (str, type(None)),
            "target": (float, int),
        }
        values: dict[str, object] = {}
        for name, types in fields.items():
            if name in doc:
                value = doc[name]
                if isinstance(value, bool) or not isinstance(value, types):
                    return None
                values[name] = value
        try:
            return cls(**values)  # type: ignore[arg-type]
        except (TypeError, ValueError):
            return None


@dataclass(frozen=True)
class GatewayConfig:
    """The gateway in front of one target: where it listens, what it admits and how long things may take."""

    target: str  # the target's name
    upstream: str  # the target's base URL, e.g. http://127.0.0.1:8000
    listen_host: str = "127.0.0.1"
    listen_port: int = 8080  # vLLM itself usually has 8000
    max_body: int = 16 * MiB
    max_in_flight: int = 64  # global cap on forwarded requests; the ceiling the throttle works below
    max_queue: int = 256  # requests waiting for a slot, all classes together
    max_queue_time: float = 30.0  # longest wait for a slot before 429
    drain_mode: str = "hold"  # while drained: "hold" new requests until undrained, or "reject" with 503
    drain_max_wait: float = 300.0  # hold mode: longest wait through a drain before 503
    connect_timeout: float = 5.0  # upstream connect; beyond it 502
    read_timeout: float = 600.0  # upstream silence between bytes; beyond it 504
    client_timeout: float = 30.0  # a client must send its headers and whole body within this (slowloris)
    write_timeout: float = 30.0  # a client that takes none of its response for this long is cut off
    max_json_elements: int = 1_000_000  # elements of a parsed request body (each costs ~70 bytes); 413 beyond
    keepalive_timeout: float = 75.0  # idle client connections close after this
    max_connections: int = 4096  # open client connections (bounded by the fd limit); the oldest idle go first
    allow_admin_paths: tuple[str, ...] = ()  # vLLM admin endpoints forwarded rather than refused (403)
    supervise: bool = True  # the daemon starts the gateway process (False: systemd or compose runs it)
    control_socket: str | None = None  # the control channel's Unix socket; None: in the runtime directory
    control_lease: float = 60.0  # drains and throttle holds lapse when the daemon is silent this long
    priority: PriorityConfig = field(default_factory=PriorityConfig)
    sessions: SessionConfig = field(default_factory=SessionConfig)
    upstream_backoff: UpstreamBackoffConfig = field(default_factory=UpstreamBackoffConfig)
    replay: ReplayConfig = field(default_factory=ReplayConfig)  # requests held through a restart


_KEYS = {
    "listen",
    "target",
    "max_body",
    "max_in_flight",
    "max_queue",
    "max_queue_time",
    "drain_mode",
    "drain_max_wait",
    "connect_timeout",
    "read_timeout",
    "client_timeout",
    "write_timeout",
    "max_json_elements",
    "keepalive_timeout",
    "max_connections",
    "allow_admin_paths",
    "supervise",
    "control_socket",
    "control_lease",
    "priority",
    "sessions",
    "upstream_backoff",
    "replay",
}
_DURATIONS = (
    "max_queue_time",
    "drain_max_wait",
    "connect_timeout",
    "read_timeout",
    "client_timeout",
    "write_timeout",
    "keepalive_timeout",
    "control_lease",
)
_HEADER = re.compile(r"^[A-Za-z0-9!#$%&'*+.^_`|~-]+$")  # an HTTP token (RFC 9110)


def parse_gateway(
    node: Node,
    targets: Mapping[str, str],
    parse_listen: Callable[[str], tuple[str, int]],
    own_listen: tuple[str, int],
) -> GatewayConfig | None:
    """The `gateway:` mapping; `targets` maps target names to their URLs, `own_listen` is the own API's."""
    m = node.mapping(_KEYS)
    if m is None:
        return None
    d = GatewayConfig(target="-", upstream="-")
    listen = m["listen"].parsed(parse_listen) if "listen" in m else None
    address = listen or (d.listen_host, d.listen_port)
    _check_listen(m.get("listen", node), address, own_listen)
    name = _target(node, m, targets, address)
    values = _scalars(m)
    priority = _priority(m["priority"]) if "priority" in m else d.priority
    sessions = _sessions(m["sessions"]) if "sessions" in m else d.sessions
    backoff = _upstream_backoff(m["upstream_backoff"]) if "upstream_backoff" in m else d.upstream_backoff
    replay = parse_replay(m["replay"]) if "replay" in m else d.replay
    if name is None:
        return None
    return GatewayConfig(
        target=name,
        upstream=targets[name].rstrip("/"),
        listen_host=address[0],
        listen_port=address[1],
        priority=priority,
        sessions=sessions,
        upstream_backoff=backoff,
        replay=replay,
        **values,  # type: ignore[arg-type]
    )


def _target(
    node: Node, m: Mapping[str, Node], targets: Mapping[str, str], listen: tuple[str, int]
) -> str | None:
    """The target the gateway fronts (the only one if none is named); None, and a problem, if unknown or if
    the gateway would listen on its own upstream."""
    name = m["target"].string() if "target" in m else None
    if name is None and "target" not in m:
        if len(targets) == 1:
            name = next(iter(targets))
        else:
            node.error("is required when there is not exactly one target", field=f"{node.path}.target")
    if name is not None and name not in targets:
        m["target"].error(f"unknown target {name!r} (configured: {', '.join(sorted(targets)) or 'none'})")
        name = None
    if name is not None:
        upstream = urlsplit(targets[name])
        if (upstream.hostname, upstream.port) == listen:
            (m.get("listen", node)).error(
                f"is the address of its own target {name!r}: the gateway would forward to itself"
            )
    return name


def _scalars(m: Mapping[str, Node]) -> dict[str, object]:
    """The keys given as one value each (durations, sizes, counts, flags, paths), by GatewayConfig field."""
    values: dict[str, object] = {}
    for key in _DURATIONS:
        if key in m:
            value = m[key].parsed(parse_duration)
            if value == 0:
                m[key].error("must be greater than 0")
            elif value is not None:
                values[key] = value
    if "max_body" in m and (size := m["max_body"].parsed(parse_size)) is not None:
        values["max_body"] = size
    for key in ("max_in_flight", "max_queue", "max_connections", "max_json_elements"):
        if key in m and (number := m[key].integer(minimum=0 if key == "max_queue" else 1)) is not None:
            values[key] = number
    if "supervise" in m and (supervise := m["supervise"].boolean()) is not None:
        values["supervise"] = supervise
    if "control_socket" in m:
        path = m["control_socket"].string()
        if path is not None and (not path.startswith("/") or len(path.encode()) > 107):
            m["control_socket"].error("must be an absolute path of at most 107 bytes (a Unix socket)")
        elif path is not None:
            values["control_socket"] = path
    if "drain_mode" in m:
        mode = m["drain_mode"].string()
        if mode not in (None, "hold", "reject"):
            m["drain_mode"].error(f"must be hold or reject, got {mode!r}")
        elif mode is not None:
            values["drain_mode"] = mode
    if "allow_admin_paths" in m:
        values["allow_admin_paths"] = _admin_paths(m["allow_admin_paths"])
    return values


def _check_listen(node: Node, listen: tuple[str, int], own_listen: tuple[str, int]) -> None:
    if listen == own_listen:
        node.error("must differ from `listen`, where the own API is served")


def _admin_paths(node: Node) -> tuple[str, ...]:
    out: list[str] = []
    for path in node.string_list() or ():
        if admin_root(path) is None:
            known = ", ".join(sorted(ADMIN))
            node.error(f"{path!r} is not an admin path the gateway refuses (those are: {known})")
        else:
            out.append(path)
    return tuple(out)


def _header(node: Node) -> str | None:
    text = node.string()
    if text is not None and not _HEADER.match(text):
        node.error(f"must be an HTTP header name, got {text!r}")
        return None
    return text


def _priority(node: Node) -> PriorityConfig:
    d = PriorityConfig()
    m = node.mapping({"header", "classes", "default", "api_keys"})
    if m is None:
        return d
    classes = tuple(m["classes"].string_list() or ()) if "classes" in m else d.classes
    if "classes" in m and not classes:
        m["classes"].error("must list at least one class, highest first")
        classes = d.classes
    if len(set(classes)) != len(classes):
        m["classes"].error("classes must be distinct")
    default = (m["default"].string() or classes[0]) if "default" in m else classes[0]
    if default not in classes:
        m["default"].error(f"must be one of the classes ({', '.join(classes)})")
        default = classes[0]
    keys = (m["api_keys"].string_map() or {}) if "api_keys" in m else {}
    for cls in keys.values():
        if cls not in classes:
            m["api_keys"].error(f"an API key maps to unknown class {cls!r} (classes: {', '.join(classes)})")
    header = _header(m["header"]) if "header" in m else None
    return PriorityConfig(
        header=header or d.header,
        classes=classes,
        default=default,
        api_keys={k: v for k, v in keys.items() if v in classes},
    )


def _sessions(node: Node) -> SessionConfig:
    d = SessionConfig()
    keys = {"header", "rate", "burst", "max_in_flight", "breaker_duration", "max_sessions", "top_k"}
    keys.add("anonymous_share")
    m = node.mapping(keys)
    if m is None:
        return d
    rate = m["rate"].number() if "rate" in m and not m["rate"].is_null() else None
    if rate is not None and rate <= 0:
        m["rate"].error("must be greater than 0 (leave it out for no rate limit)")
        rate = None
    cap = (
        m["max_in_flight"].integer(minimum=1)
        if "max_in_flight" in m and not m["max_in_flight"].is_null()
        else None
    )
    ints = {}
    for key in ("burst", "max_sessions", "top_k"):
        ints[key] = (m[key].integer(minimum=1) if key in m else None) or getattr(d, key)
    breaker = m["breaker_duration"].parsed(parse_duration) if "breaker_duration" in m else None
    header = _header(m["header"]) if "header" in m else None
    share = m["anonymous_share"].number() if "anonymous_share" in m else None
    if share is not None and not 0 < share <= 1:
        m["anonymous_share"].error(f"must be greater than 0 and at most 1 (1: no limit), got {share:g}")
        share = None
    return SessionConfig(
        header=header or d.header,
        rate=rate,
        max_in_flight=cap,
        breaker_duration=breaker or d.breaker_duration,
        anonymous_share=d.anonymous_share if share is None else share,
        **ints,
    )


def _upstream_backoff(node: Node) -> UpstreamBackoffConfig:
    d = UpstreamBackoffConfig()
    m = node.mapping({"enabled", "factor", "floor", "quiet", "step", "step_interval"})
    if m is None:
        return d
    enabled = m["enabled"].boolean() if "enabled" in m else None
    factor = m["factor"].number() if "factor" in m else None
    if factor is not None and not 0 < factor < 1:
        m["factor"].error(f"must be between 0 and 1 (exclusive), got {factor:g}")
        factor = None
    ints = {key: m[key].integer(minimum=1) if key in m else None for key in ("floor", "step")}
    times: dict[str, float | None] = {}
    for key in ("quiet", "step_interval"):
        value = m[key].parsed(parse_duration) if key in m else None
        if value == 0:
            m[key].error("must be greater than 0")
            value = None
        times[key] = value
    return UpstreamBackoffConfig(
        enabled=d.enabled if enabled is None else enabled,
        factor=factor or d.factor,
        floor=ints["floor"] or d.floor,
        quiet=times["quiet"] or d.quiet,
        step=ints["step"] or d.step,
        step_interval=times["step_interval"] or d.step_interval,
    )
