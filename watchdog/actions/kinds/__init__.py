"""Action kinds: one module per family of kinds, each declaring its kinds' traits, config keys, plan and
execution and registering them (base.register). Importing this package registers every kind (the package
watchdog.actions imports it, so the config parser sees them); the config parser and the remediator know
kinds only through the registry. Add a kind: add a module, import it here (the order is the one `known:`
lists in the config error for an unknown type)."""

from __future__ import annotations

# isort: off
from . import server  # noqa: F401  (registers restart, disable_draft, enable_draft, reconfigure)
from . import power  # noqa: F401  (gpu_power_limit)
from . import gateway  # noqa: F401  (throttle, throttle_session, drain, undrain)
from . import recover  # noqa: F401  (recover: vLLM's fault-tolerance retry, else restart)
from . import draftschedule  # noqa: F401  (draft_schedule: a draft length per batch size)

# isort: on
from .base import Act, Kind, kind_of

__all__ = ["Act", "Kind", "kind_of"]
