"""The actions part of the config: `routes:` and `actions:`, parsed into frozen dataclasses."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from ..config.durations import parse_duration, parse_size
from ..config.yamlnodes import Node
from ..gateway.config import ADAPTIVE_SIGNALS, ThrottleSpec
from ..matchers import Matcher, parse_matchers

ACTION_TYPES = (
    "restart",
    "disable_draft",
    "enable_draft",
    "reconfigure",
    "gpu_power_limit",
    "throttle",
    "throttle_session",
    "drain",
    "undrain",
)
GATEWAY_ACTIONS = frozenset({"throttle", "throttle_session", "drain", "undrain"})  # they steer the gateway
DEFAULT_THROTTLE = ThrottleSpec(factor=0.5)  # a throttle action that says nothing else halves the cap
DISRUPTIVE = frozenset({"restart", "disable_draft", "enable_draft", "reconfigure"})  # they stop the server
DRAFT_FLAGS = ("--speculative-config", "--speculative-model", "--num-speculative-tokens")
_FLAG = re.compile(r"^--[A-Za-z0-9][A-Za-z0-9_-]*$")
_ACTION_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


@dataclass(frozen=True)
class Budget:
    """At most `count` actions of one name per target within `window` seconds."""

    count: int
    window: float


@dataclass(frozen=True)
class ActionConfig:
    """One named action. Durations are seconds; `dry_run` None inherits the global setting."""

    name: str
    type: str
    dry_run: bool | None = None
    cooldown: float = 900.0
    max_per_window: Budget | None = None
    drain_timeout: float = 60.0
    stop_timeout: float = 90.0
    ready_timeout: float = 900.0
    startup_grace: float = 120.0  # no action while the target's server is younger than this
    backoff_initial: float = 60.0  # after a failed action; doubles per consecutive failure
    backoff_max: float = 3600.0
    crash_loop_window: float = 600.0  # the same action needed again this soon after a success: a crash loop
    crash_loop_max: int = 3  # consecutive crash loops before the action stops and alerts
    set_args: Mapping[str, str | None] = field(
        default_factory=dict
    )  # reconfigure: flag -> value (None: bare)
    remove_args: tuple[str, ...] = ()  # reconfigure: flags to drop
    restore_after: float | None = None  # reconfigure/power: restore once resolved this long; None: never
    power_limit_watts: float | None = None  # gpu_power_limit: absolute
    power_limit_ratio: float | None = None  # gpu_power_limit: fraction of the card's default limit
    throttle: ThrottleSpec | None = None  # throttle: how the gateway's cap moves
    breaker_duration: float | None = (
        None  # throttle_session: how long the breaker stays open; None: gateway's
    )
    # throttle_session: each repeat offence of a session doubles its breaker up to this; the record is
    # forgotten once the session stays clean this long after its last breaker ended (gateway/offences.py)
    breaker_max_duration: float = 3600.0
    breaker_reset_after: float = 3600.0
    line: int = 0

    @property
    def disruptive(self) -> bool:
        """Whether the action stops the server (one at a time per target)."""
        return self.type in DISRUPTIVE


@dataclass(frozen=True)
class IncidentConfig:
    """`incidents:`: the evidence collected before a disruptive action, and how many bundles are kept."""

    enabled: bool = True  # needs a state_dir: bundles go to state_dir/incidents
    budget: float = 5.0  # the most collection may delay the action's first disruptive step
    keep: int = 20  # bundles kept, newest first
    max_bytes: int = 256 * 1024 * 1024  # and at most this much in all
    log_lines: int = 200  # the last lines of the vLLM log
    metrics_window: float = 600.0  # the target's series this far back
    py_spy: str = ""  # the py-spy executable; "": next to the watchdog's interpreter, else on PATH


MAX_INCIDENT_BUDGET = 60.0
MAX_LOG_LINES = 10_000


@dataclass(frozen=True)
class RouteConfig:
    """Alerts whose labels satisfy every matcher run `actions`; `continue_` goes on to later routes."""

    matchers: tuple[Matcher, ...]
    actions: tuple[str, ...]
    continue_: bool = False
    line: int = 0


_DEFAULTS: dict[str, dict[str, object]] = {
    "restart": {"cooldown": 900.0, "max_per_window": Budget(3, 6 * 3600.0)},
    "disable_draft": {"cooldown": 3600.0, "remove_args": DRAFT_FLAGS},
    "enable_draft": {"cooldown": 0.0},
    "reconfigure": {"cooldown": 900.0},
    "gpu_power_limit": {"cooldown": 300.0},
    # Gateway actions are cheap and reversible: a throttle may tighten again each minute the alert is resent,
    # and a re-firing alert is no crash loop (window 0).
    "throttle": {"cooldown": 60.0, "crash_loop_window": 0.0, "startup_grace": 0.0},
    "throttle_session": {"cooldown": 0.0, "crash_loop_window": 0.0, "startup_grace": 0.0},
    "drain": {"cooldown": 0.0, "crash_loop_window": 0.0, "startup_grace": 0.0},
    "undrain": {"cooldown": 0.0, "crash_loop_window": 0.0, "startup_grace": 0.0},
}
_DURATIONS = (
    "cooldown",
    "drain_timeout",
    "stop_timeout",
    "ready_timeout",
    "startup_grace",
    "backoff_initial",
    "backoff_max",
    "crash_loop_window",
)


def _flag(node: Node, text: str) -> str | None:
    if not _FLAG.match(text):
        node.error(f"must be a long vLLM flag such as --max-num-seqs, got {text!r}")
        return None
    return text


def parse_action(name: str, node: Node) -> ActionConfig | None:
    """One entry of `actions:`."""
    keys = {"type", "dry_run", "max_per_window", "set", "remove", "restore_after", "watts", "ratio"}
    keys |= {"factor", "limit", "floor", "step", "step_interval", "adaptive", "target", "duration"}
    keys |= {"max_duration", "reset_after"}
    keys |= {"crash_loop_max", *_DURATIONS}
    m = node.mapping(keys)
    if m is None:
        return None
    if not _ACTION_NAME.match(name):
        node.error("action names must be letters, digits, '_', '.' or '-'")
    kind = m["type"].string() if "type" in m else None
    if kind is None:
        if "type" not in m:
            node.error("is required", field=f"{node.path}.type")
        return None
    if kind not in ACTION_TYPES:
        m["type"].error(f"unknown action type {kind!r} (known: {', '.join(ACTION_TYPES)})")
        return None
    values: dict[str, object] = dict(_DEFAULTS[kind])
    for key in _DURATIONS:
        if key in m:
            parsed = m[key].parsed(parse_duration)
            if parsed is not None:
                values[key] = parsed
    if "dry_run" in m:
        values["dry_run"] = m["dry_run"].boolean()
    if "crash_loop_max" in m:
        values["crash_loop_max"] = m["crash_loop_max"].integer(minimum=1) or 3
    if "max_per_window" in m:
        values["max_per_window"] = _budget(m["max_per_window"])
    if "restore_after" in m:
        values["restore_after"] = m["restore_after"].parsed(parse_duration)
    _type_specific(kind, m, node, values)
    return ActionConfig(name=name, type=kind, line=node.line, **values)  # type: ignore[arg-type]


def _type_specific(kind: str, m: Mapping[str, Node], node: Node, values: dict[str, object]) -> None:
    only = {
        "set": "reconfigure",
        "remove": "reconfigure",
        "watts": "gpu_power_limit",
        "ratio": "gpu_power_limit",
        **dict.fromkeys(
            ("factor", "limit", "floor", "step", "step_interval", "adaptive", "target"), "throttle"
        ),
        "duration": "throttle_session",
        "max_duration": "throttle_session",
        "reset_after": "throttle_session",
    }
    for key, owner in only.items():
        if key in m and kind != owner:
            m[key].error(f"only applies to type {owner}")
    if kind == "reconfigure":
        sets: dict[str, str | None] = {}
        if "set" in m:
            for flag, child in (m["set"].mapping() or {}).items():
                if _flag(child, flag) is not None:
                    sets[flag] = None if child.is_null() else child.scalar()
        removes = (
            tuple(f for f in (m["remove"].string_list() or []) if _flag(m["remove"], f))
            if "remove" in m
            else ()
        )
        if not sets and not removes:
            node.error("a reconfigure action needs `set` or `remove`")
        values["set_args"], values["remove_args"] = sets, removes
    if kind == "gpu_power_limit":
        watts = m["watts"].number() if "watts" in m else None
        ratio = m["ratio"].number() if "ratio" in m else None
        if (watts is None) == (ratio is None):
            node.error("set exactly one of `watts` or `ratio`")
        if watts is not None and watts <= 0:
            m["watts"].error("must be greater than 0")
        if ratio is not None and not 0 < ratio <= 1:
            m["ratio"].error("must be in (0, 1]")
        values["power_limit_watts"], values["power_limit_ratio"] = watts, ratio
    if kind == "throttle":
        values["throttle"] = _throttling(m, node)
    if kind == "throttle_session":
        _breaker(m, values)


def _breaker(m: Mapping[str, Node], values: dict[str, object]) -> None:
    """throttle_session: `duration`, `max_duration` (repeat offences double up to it), `reset_after`."""
    duration = m["duration"].parsed(parse_duration) if "duration" in m else None
    if duration == 0:
        m["duration"].error("must be greater than 0")
    values["breaker_duration"] = duration or None
    if "max_duration" in m:
        cap = m["max_duration"].parsed(parse_duration)
        if cap is not None and (cap == 0 or (duration and cap < duration)):
            m["max_duration"].error("must be greater than 0 and at least `duration`")
        elif cap is not None:
            values["breaker_max_duration"] = cap
    if "reset_after" in m:
        reset = m["reset_after"].parsed(parse_duration)
        if reset is not None:
            values["breaker_reset_after"] = reset


def _throttling(m: Mapping[str, Node], node: Node) -> ThrottleSpec:
    d = DEFAULT_THROTTLE
    factor = m["factor"].number() if "factor" in m else None
    limit = m["limit"].integer(minimum=1) if "limit" in m else None
    if factor is not None and limit is not None:
        node.error("set `factor` or `limit`, not both")
    if factor is not None and not 0 < factor < 1:
        m["factor"].error(f"must be between 0 and 1 (exclusive), got {factor}")
        factor = None
    floor = (m["floor"].integer(minimum=1) if "floor" in m else None) or d.floor
    step = (m["step"].integer(minimum=1) if "step" in m else None) or d.step
    interval = m["step_interval"].parsed(parse_duration) if "step_interval" in m else None
    if interval == 0:
        m["step_interval"].error("must be greater than 0")
    adaptive = m["adaptive"].string() if "adaptive" in m else None
    if adaptive is not None and adaptive not in ADAPTIVE_SIGNALS:
        m["adaptive"].error(f"must be one of {', '.join(ADAPTIVE_SIGNALS)}, got {adaptive!r}")
        adaptive = None
    target = m["target"].parsed(parse_duration) if "target" in m else None
    if target == 0:
        m["target"].error("must be greater than 0")
    if "target" in m and adaptive is None and "adaptive" not in m:
        m["target"].error("only applies with `adaptive`")
    if limit is not None and limit < floor:
        m["limit"].error(f"must not be below floor ({floor})")
    return ThrottleSpec(
        factor=None if limit is not None else (factor or d.factor),
        limit=limit,
        floor=floor,
        step=step,
        step_interval=interval or d.step_interval,
        adaptive=adaptive,
        target=target or d.target,
    )


def _budget(node: Node) -> Budget | None:
    if node.is_null():
        return None
    m = node.mapping({"count", "window"})
    if m is None:
        return None
    count = m["count"].integer(minimum=1) if "count" in m else None
    window = m["window"].parsed(parse_duration) if "window" in m else None
    if count is None or not window:
        if "count" not in m or "window" not in m:
            node.error("needs both `count` and `window`, e.g. {count: 3, window: 6h}")
        return None
    return Budget(count, window)


def parse_route(node: Node, actions: Mapping[str, ActionConfig], declared: set[str]) -> RouteConfig | None:
    """One entry of `routes:`; every action it names must be declared under `actions:`."""
    m = node.mapping({"match", "match_re", "matchers", "actions", "continue"})
    if m is None:
        return None
    names = tuple(m["actions"].string_list() or []) if "actions" in m else ()
    if "actions" not in m:
        node.error("is required", field=f"{node.path}.actions")
    for name in names:
        if name not in declared:
            m["actions"].error(f"unknown action {name!r} (declared: {', '.join(sorted(declared)) or 'none'})")
    cont = m["continue"].boolean() if "continue" in m else None
    return RouteConfig(
        matchers=parse_matchers(m),
        actions=tuple(n for n in names if n in actions),
        continue_=bool(cont),
        line=node.line,
    )


def parse_incidents(node: Node) -> IncidentConfig:
    """The `incidents:` section."""
    d = IncidentConfig()
    m = node.mapping({"enabled", "budget", "keep", "max_bytes", "log_lines", "metrics_window", "py_spy"})
    if m is None:
        return d
    enabled = m["enabled"].boolean() if "enabled" in m else None
    budget = m["budget"].parsed(parse_duration) if "budget" in m else None
    if budget is not None and not 0 < budget <= MAX_INCIDENT_BUDGET:
        m["budget"].error(f"must be greater than 0 and at most {MAX_INCIDENT_BUDGET:.0f}s")
        budget = None
    keep = m["keep"].integer(minimum=1) if "keep" in m else None
    size = m["max_bytes"].parsed(parse_size) if "max_bytes" in m else None
    if size == 0:
        m["max_bytes"].error("must be greater than 0")
    lines = m["log_lines"].integer(minimum=0) if "log_lines" in m else None
    if lines is not None and lines > MAX_LOG_LINES:
        m["log_lines"].error(f"must be at most {MAX_LOG_LINES}")
        lines = None
    window = m["metrics_window"].parsed(parse_duration) if "metrics_window" in m else None
    return IncidentConfig(
        enabled=d.enabled if enabled is None else enabled,
        budget=budget or d.budget,
        keep=keep or d.keep,
        max_bytes=size or d.max_bytes,
        log_lines=d.log_lines if lines is None else lines,
        metrics_window=d.metrics_window if window is None else window,
        py_spy=(m["py_spy"].string() or "") if "py_spy" in m else "",
    )
