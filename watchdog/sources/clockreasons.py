"""Names of the bits in NVML's clocks-event reasons (called throttle reasons before driver 535).

dcgm-exporter exports the raw mask as DCGM_FI_DEV_CLOCKS_EVENT_REASONS and nvidia-smi prints it as
`clocks_event_reasons.active`; the names here are nvidia-smi's, so a report reads like `nvidia-smi -q`.
"""

from __future__ import annotations

REASONS: tuple[tuple[int, str], ...] = (
    (0x1, "gpu_idle"),
    (0x2, "applications_clocks_setting"),
    (0x4, "sw_power_cap"),
    (0x8, "hw_slowdown"),
    (0x10, "sync_boost"),
    (0x20, "sw_thermal_slowdown"),
    (0x40, "hw_thermal_slowdown"),
    (0x80, "hw_power_brake_slowdown"),
    (0x100, "display_clock_setting"),
)
KNOWN_MASK = sum(bit for bit, _ in REASONS)


def describe(mask: int) -> list[str]:
    """The names of the bits set in `mask`, lowest first; unknown bits as one hex entry."""
    names = [name for bit, name in REASONS if mask & bit]
    if mask & ~KNOWN_MASK:
        names.append(f"unknown:{mask & ~KNOWN_MASK:#x}")
    return names
