"""What the service loads before it runs: the config and every rule file it names, checked together.

Apart from the daemon so that `vllm-watchdog check` (and query, targets, replay) load exactly what the
daemon would, without importing the daemon and everything it wires.
"""

from __future__ import annotations

from collections.abc import Mapping

from ..config.model import Config, load_config
from ..errors import ConfigError
from ..ruler.files import RuleGroup, load_rule_files
from ..ruler.overrides import apply_overrides


def load_all(path: str | None, env: Mapping[str, str]) -> tuple[Config, tuple[RuleGroup, ...]]:
    """Load config and every rule file it names; one ConfigError carries all problems."""
    try:
        config = load_config(path, env)
    except ConfigError as exc:
        try:
            load_rule_files(exc.rule_files)
        except ConfigError as rules_exc:
            raise ConfigError(exc.problems + rules_exc.problems) from exc
        raise
    return config, apply_overrides(load_rule_files(config.rule_files), config.rule_overrides)
