"""Metric-name compatibility: legacy vLLM (0.6-0.11) and dcgm-exporter names mapped to current ones."""

from __future__ import annotations

from collections.abc import Mapping

# Family name -> current family name. Histogram suffixes (_bucket, _sum, _count) follow the family.
FAMILY_ALIASES: Mapping[str, str] = {
    # vLLM V0 / early V1 -> current V1 names
    "vllm:gpu_cache_usage_perc": "vllm:kv_cache_usage_perc",
    "vllm:gpu_prefix_cache_hits_total": "vllm:prefix_cache_hits_total",
    "vllm:gpu_prefix_cache_queries_total": "vllm:prefix_cache_queries_total",
    "vllm:gpu_prefix_cache_hits": "vllm:prefix_cache_hits_total",
    "vllm:gpu_prefix_cache_queries": "vllm:prefix_cache_queries_total",
    "vllm:time_per_output_token_seconds": "vllm:inter_token_latency_seconds",
    "vllm:num_preemptions": "vllm:num_preemptions_total",
    # dcgm-exporter renamed throttle reasons to clock-event reasons (DCGM 3.3)
    "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS": "DCGM_FI_DEV_CLOCKS_EVENT_REASONS",
}
_SUFFIXES = ("_bucket", "_sum", "_count", "_created")


def _expand(families: Mapping[str, str]) -> dict[str, str]:
    out = dict(families)
    for old, new in families.items():
        for suffix in _SUFFIXES:
            out.setdefault(old + suffix, new + suffix)
    return out


SAMPLE_ALIASES: Mapping[str, str] = _expand(FAMILY_ALIASES)
"""Sample name -> current sample name, histogram suffixes included."""


def current_name(name: str) -> str:
    """The current name for a (possibly legacy) sample name."""
    return SAMPLE_ALIASES.get(name, name)
