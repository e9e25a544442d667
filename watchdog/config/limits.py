"""What one target may send and keep: Prometheus' scrape limits, in `global:` and overridden per target."""

from __future__ import annotations

from dataclasses import dataclass, fields

from .durations import parse_size
from .yamlnodes import Node

HELD_BODIES = 4  # the label text a target may keep in the store, in bodies of body_size_limit


@dataclass(frozen=True)
class ScrapeLimits:
    """Prometheus' scrape_config limits of one target, and how many series it may keep in the store.

    A scrape over any of them fails as a whole, as in Prometheus: `up` is 0 and nothing of it is stored. A
    label limit of 0 is no limit, as in Prometheus; sample_limit and body_size_limit always apply.
    """

    # Samples in one body, all of them: the watchdog's own filter of the families no rule reads is not metric
    # relabelling, so a target is up or down as a Prometheus without relabelling would see it.
    sample_limit: int = 20_000
    body_size_limit: int = 16 * 1024 * 1024  # bytes of one body
    # A real vLLM 0.32 series has at most 37 labels besides __name__ (vllm:cache_config_info), names of at
    # most 37 bytes and values of at most 21; job, instance, target and a target's own `labels:` come on top.
    label_limit: int = 64  # labels of one series, __name__ and the target's own labels included
    label_name_length_limit: int = 128  # bytes of a label name
    label_value_length_limit: int = 1024  # bytes of a label value (a model path fits)
    # Series of the target the store holds (live, or stale within the retention); None: twice sample_limit.
    # A target that renames its series every scrape would otherwise grow the store until the retention
    # (the longest range a rule reads) drops them.
    series_limit: int | None = None

    @property
    def held_series(self) -> int:
        """The series_limit in effect (0: none)."""
        return 2 * self.sample_limit if self.series_limit is None else self.series_limit

    @property
    def held_label_bytes(self) -> int:
        """How much label text the store may hold of the target's series, with series_limit (0: no limit).

        64 labels of 1 kB are within the label limits, so 40,000 such series would take gigabytes; 4 bodies at
        body_size_limit (64 MiB) is over a thousand times a real vLLM's (51 kB, every family of it kept).
        """
        return HELD_BODIES * self.body_size_limit if self.held_series else 0


LIMIT_KEYS = frozenset(f.name for f in fields(ScrapeLimits))


def parse_limits(m: dict[str, Node]) -> dict[str, int]:
    """The LIMIT_KEYS a `global:` or target mapping sets, checked (a problem recorded, its key left out)."""
    out: dict[str, int | None] = {}
    if "sample_limit" in m:
        out["sample_limit"] = m["sample_limit"].integer(minimum=1)
    if "body_size_limit" in m:
        body = m["body_size_limit"].parsed(parse_size)
        if body == 0:
            m["body_size_limit"].error("must be greater than 0")
            body = None
        out["body_size_limit"] = body
    for key in ("label_limit", "label_name_length_limit", "label_value_length_limit", "series_limit"):
        if key in m:
            out[key] = m[key].integer(minimum=0)
    sample, series = out.get("sample_limit"), out.get("series_limit")
    if sample and series and series < sample:
        m["series_limit"].error(f"must not be less than sample_limit ({sample}), or 0 for no limit")
    return {key: value for key, value in out.items() if value is not None}
