"""The actions part of the config: `routes:` and `actions:`, parsed into frozen dataclasses."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from ..config.durations import parse_duration, parse_size
from ..config.yamlnodes import Node
from ..gateway.config import ThrottleSpec
from ..matchers import Matcher, parse_matchers

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
    # the drain ends early once nothing in flight progressed this long (no upstream byte, no engine step:
    # actions/pipeline/progress.py); 0 waits for all to finish or drain_timeout, as before
    stall_after: float = 5.0
    stop_timeout: float = 90.0
    ready_timeout: float = 900.0
    startup_grace: float = 120.0  # no action while the target's server is younger than this
    backoff_initial: float = 60.0  # after a failed action; doubles per consecutive failure
    backoff_max: float = 3600.0
    crash_loop_window: float = 600.0  # the same action needed again this soon after a success: a crash loop
    crash_loop_max: int = 3  # consecutive crash loops before the action stops and alerts
    retry_timeout: float = 60.0  # recover: engines healthy again and a canary token within this of a retry
    retry_window: float = 600.0  # recover: a fault again this soon after a successful retry: restart
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
    # forgotten once the session stays clean this long after its last breaker ended
    # (gateway/dataplane/offences.py)
    breaker_max_duration: float = 3600.0
    breaker_reset_after: float = 3600.0
    line: int = 0

    @property
    def traits(self) -> Traits:
        """What its kind does (kinds/ declares each); the traits of no kind for an unknown type."""
        return traits_of(self.type)

    @property
    def disruptive(self) -> bool:
        """Whether the action stops the server (the trait stops_server)."""
        return self.traits.stops_server


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


@dataclass(frozen=True)
class Traits:
    """What an action kind does, each by name: every set of kinds and every branch on a kind reads these."""

    stops_server: bool = False  # its flow stops or replaces vLLM
    one_at_a_time_per_target: bool = False  # the busy rail: no two such actions on one target at once
    needs_startup_grace: bool = False  # the startup_grace rail reads when the server started
    allowed_while_paused_or_asleep: bool = True  # False: the engine_paused rail refuses it
    needs_writable_state: bool = False  # refused while the state_dir (its audit row) cannot be written
    takes_fleet_slot: bool = False  # waits for a slot of the fleet's disruption budget (and tells it alerts)
    collects_evidence: bool = False  # an incident bundle is collected before its first disruptive step
    once_per_episode: bool = False  # runs once per firing episode, not per resend of its alert
    steers_gateway: bool = False  # acts on the gateway in front of the target (needs one)
    holds_gateway_cap: bool = False  # a throttle hold: kept alive while resent, released once resolved
    acts_on_session: bool = False  # acts on the alert's `session` (shown in its audit rows)
    needs_runtime: bool = False  # acts through the target's runtime (container, command or unit)
    relaunches: bool = False  # replaces the server with a changed launch (docker or process mode only)
    needs_nvml: bool = False  # acts on the target's GPUs through NVML


ParseKind = Callable[[Mapping[str, Node], Node, dict[str, object]], None]


@dataclass(frozen=True)
class KindSpec:
    """An action kind's config side: its name, traits, defaults (ActionConfig fields) and own keys, with the
    parser of those keys (it writes ActionConfig fields into `values`, errors on the nodes)."""

    name: str
    traits: Traits
    defaults: Mapping[str, object] = field(default_factory=dict)
    keys: tuple[str, ...] = ()
    parse: ParseKind | None = None


_KINDS: dict[str, KindSpec] = {}  # in registration order (kinds/__init__.py imports each kind's module)
NO_TRAITS = Traits()


def register_kind(spec: KindSpec) -> KindSpec:
    """Make a kind known to the config parser (a second kind of the same name is a bug)."""
    if spec.name in _KINDS:
        raise ValueError(f"action kind {spec.name!r} registered twice")
    _KINDS[spec.name] = spec
    return spec


def kind_names() -> tuple[str, ...]:
    """The registered kinds, in registration order."""
    return tuple(_KINDS)


def traits_of(kind: str) -> Traits:
    """The traits of a kind by name (an audit row's type); those of no kind if it is not registered."""
    spec = _KINDS.get(kind)
    return spec.traits if spec is not None else NO_TRAITS


_DURATIONS = (
    "cooldown",
    "drain_timeout",
    "stall_after",
    "stop_timeout",
    "ready_timeout",
    "startup_grace",
    "backoff_initial",
    "backoff_max",
    "crash_loop_window",
)


def long_flag(node: Node, text: str) -> str | None:
    """`text` if it is a long vLLM flag, else None with the error on `node`."""
    if not _FLAG.match(text):
        node.error(f"must be a long vLLM flag such as --max-num-seqs, got {text!r}")
        return None
    return text


def parse_action(name: str, node: Node) -> ActionConfig | None:
    """One entry of `actions:`; its `type` names a registered kind, which parses its own keys."""
    keys = {"type", "dry_run", "max_per_window", "restore_after", "crash_loop_max", *_DURATIONS}
    for registered in _KINDS.values():
        keys |= set(registered.keys)
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
    spec = _KINDS.get(kind)
    if spec is None:
        m["type"].error(f"unknown action type {kind!r} (known: {', '.join(_KINDS)})")
        return None
    values: dict[str, object] = dict(spec.defaults)
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
    for other in _KINDS.values():  # a key another kind owns
        for key in other.keys:
            if key in m and other is not spec:
                m[key].error(f"only applies to type {other.name}")
    if spec.parse is not None:
        spec.parse(m, node, values)
    return ActionConfig(name=name, type=kind, line=node.line, **values)  # type: ignore[arg-type]


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
