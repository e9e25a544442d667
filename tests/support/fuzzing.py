"""Shared hypothesis settings for the fuzz harnesses (tests/*/test_fuzz_*.py) and bench/fuzz.py.

Each harness test is decorated with `fuzz(weight)`. Its example count is `weight` times the base count, which
is VLLM_WATCHDOG_FUZZ_EXAMPLES (read when the test module is imported, not by the package) or, without it,
DEFAULT_EXAMPLES: brief enough that the four harnesses together stay near a minute of the suite on two slow
cores. bench/fuzz.py sets the variable to run the same tests for longer. Deadlines are off: a promtool call
or a gateway round trip on a loaded machine says nothing about the code under test.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TypeVar

from hypothesis import HealthCheck, Phase, settings

ENV = "VLLM_WATCHDOG_FUZZ_EXAMPLES"
DEFAULT_EXAMPLES = 80
PROFILE = "vllm-watchdog-fuzz"

settings.register_profile(
    PROFILE,
    deadline=None,
    # No explain phase: on the slow harnesses it costs more than the rest of a failing run put together.
    phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.target, Phase.shrink],
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
    print_blob=True,  # a failure prints the @reproduce_failure blob, so a long bench run's find can be replayed
)

F = TypeVar("F", bound=Callable[..., object])


def base_examples() -> int:
    """The base example count: the environment's, else DEFAULT_EXAMPLES."""
    text = os.environ.get(ENV, "").strip()
    return max(1, int(text)) if text else DEFAULT_EXAMPLES


def fuzz(weight: float = 1.0) -> Callable[[F], F]:
    """Hypothesis settings for one harness test: `weight` times the base example count, no deadline."""
    examples = max(1, round(base_examples() * weight))
    return settings(settings.get_profile(PROFILE), max_examples=examples)  # type: ignore[return-value]
