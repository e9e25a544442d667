"""The `rule_overrides:` section: change or switch off one loaded rule by name, without copying its file.

    rule_overrides:
      VLLMQueueSaturated: {for: 5m, labels: {severity: critical}}
      VLLMPrefixCacheThrash: {enabled: false}
      VLLMKVCachePressure:
        expr: vllm:kv_cache_usage_perc > 0.97

An override names an alerting rule (`alert:`) or a recording rule (`record:`) of any loaded rule file, the
bundled ones included; every rule of that name takes it. `expr`, `for` and `keep_firing_for` replace the
rule's; `labels` and `annotations` are merged over the rule's (an empty value removes one). Checked with the
rules (`ruler/overrides.py`): a name no rule has, or an expression that does not parse, is an error at the
override's line.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from ..config.durations import parse_duration
from ..config.yamlnodes import Node

_KEYS = {"enabled", "expr", "for", "keep_firing_for", "labels", "annotations"}


@dataclass(frozen=True)
class RuleOverride:
    """What changes in the rules of one name; None: left as the rule file has it."""

    name: str
    file: str
    line: int
    enabled: bool = True
    expr: str | None = None
    for_: float | None = None
    keep_firing_for: float | None = None
    labels: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)


def parse_rule_overrides(node: Node) -> tuple[RuleOverride, ...]:
    """The `rule_overrides:` mapping of rule name -> override."""
    m = node.mapping()
    out = []
    for name, child in (m or {}).items():
        override = _override(name, child)
        if override is not None:
            out.append(override)
    return tuple(out)


def _override(name: str, node: Node) -> RuleOverride | None:
    m = node.mapping(_KEYS)
    if m is None:
        return None
    if not m and not node.node.value:  # `{}`: nothing to change (unknown keys are said so already)
        node.error("an override needs enabled, expr, for, keep_firing_for, labels or annotations")
    enabled = m["enabled"].boolean() if "enabled" in m else True
    return RuleOverride(
        name=name,
        file=node.problems.file,
        line=node.line,
        enabled=True if enabled is None else enabled,
        expr=m["expr"].string() if "expr" in m else None,
        for_=m["for"].parsed(parse_duration) if "for" in m else None,
        keep_firing_for=m["keep_firing_for"].parsed(parse_duration) if "keep_firing_for" in m else None,
        labels=(m["labels"].string_map() or {}) if "labels" in m else {},
        annotations=(m["annotations"].string_map() or {}) if "annotations" in m else {},
    )
