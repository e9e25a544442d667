"""What an action kind is on the actions side: its config spec (traits, defaults, keys), its plan and its
execution. Each kind's module builds one Kind and registers it; nothing else names a kind."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..config import ActionConfig, KindSpec, Traits, register_kind

if TYPE_CHECKING:  # the config parser imports this package: it loads no flow or store with it
    from ...config.targets import TargetConfig
    from ..pipeline.flows import FlowContext, Outcome
    from ..pipeline.gatewayactions import Gateway
    from ..pipeline.plans import Plan
    from ..runtimes.runtime import Runtime
    from ..store.actionstore import ActionStore


@dataclass(frozen=True)
class Act:
    """One action on one target, with what its plan and execution may use."""

    action: ActionConfig
    target: TargetConfig
    labels: Mapping[str, str]
    runtime: Runtime | None
    gateway: Gateway | None
    store: ActionStore
    power: Any | None
    restore: bool = False
    needed_at: float | None = None  # when the alert behind it began (wall clock); None: a manual run


Planner = Callable[[Act], Awaitable["Plan"]]
Executor = Callable[[Act, "Plan", "FlowContext", int], Awaitable["Outcome"]]


@dataclass(frozen=True)
class Kind:
    """A registered action kind: its spec, how it plans (a skip says why not) and how it runs a plan."""

    spec: KindSpec
    plan: Planner
    execute: Executor

    @property
    def name(self) -> str:
        """The kind's name, the `type:` of its actions."""
        return self.spec.name

    @property
    def traits(self) -> Traits:
        """What the kind does."""
        return self.spec.traits


_BEHAVIOURS: dict[str, Kind] = {}


def register(kind: Kind) -> Kind:
    """Register a kind: its spec with the config parser, its plan and execution with the remediator."""
    register_kind(kind.spec)
    _BEHAVIOURS[kind.name] = kind
    return kind


def kind_of(name: str) -> Kind:
    """The registered kind of an action's `type` (KeyError for one the config parser would have refused)."""
    return _BEHAVIOURS[name]
