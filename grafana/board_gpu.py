"""The GPU dashboard, on dcgm-exporter's metric names: heat, power against the limit, load, throttling, XIDs.

dcgm-exporter's default counters lack the power limit and the clock-event reasons: run it with
deploy/dcgm-counters.csv (-f), as deploy/compose.yaml does. Thresholds are the bundled rules' (rulefiles.py).
"""

from __future__ import annotations

from panels import (
    Board,
    Json,
    action_annotation,
    dashboard,
    dashed,
    q,
    series,
    stat,
    thresholds,
    timeline,
    values,
    variable,
)
from rulefiles import threshold

G = 'job=~"$job", instance=~"$instance", gpu=~"$gpu"'
LEGEND = "{{instance}} gpu{{gpu}}"
POWER_SHARE = f"DCGM_FI_DEV_POWER_USAGE{{{G}}} / DCGM_FI_DEV_POWER_MGMT_LIMIT{{{G}}}"
# The clock-event (throttle) reason bitmask; DCGM 3.3 renamed the field, so both names are read.
REASONS = f'{{__name__=~"DCGM_FI_DEV_CLOCKS_EVENT_REASONS|DCGM_FI_DEV_CLOCK_THROTTLE_REASONS", {G}}}'
REASON_BITS = (
    (4, "SW power cap"),
    (8, "HW slowdown"),
    (16, "sync boost"),
    (32, "SW thermal"),
    (64, "HW thermal"),
    (128, "HW power brake"),
)
HOT = threshold("VLLMGPUHot", "DCGM_FI_DEV_GPU_TEMP")
CAPPED = threshold("VLLMGPUPowerCapped", "DCGM_FI_DEV_POWER_USAGE")
XIDS = (
    "Last XID error per GPU (0: none). 48: double-bit ECC; 63/64: row remapping; 79: fell off the bus; "
    "94/95: contained/uncontained ECC; 13/31/43: application faults."
)


def _now(b: Board) -> None:
    b.row("Now")
    temp = [q(f"max(DCGM_FI_DEV_GPU_TEMP{{{G}}})")]
    desc = f"Highest GPU temperature; red from VLLMGPUHot's threshold ({HOT:g} °C)."
    b.add(stat("Hottest GPU", desc, temp, "celsius", thresholds=thresholds((HOT, "red"))), 6, 4)
    power = [q(f"max({POWER_SHARE})")]
    desc = f"Highest power draw over the power limit; red from VLLMGPUPowerCapped's {CAPPED:.0%}."
    b.add(
        stat(
            "Closest to its power limit", desc, power, "percentunit", thresholds=thresholds((CAPPED, "red"))
        ),
        6,
        4,
    )
    util = [q(f"avg(DCGM_FI_DEV_GPU_UTIL{{{G}}})")]
    b.add(stat("Mean utilization", "Mean GPU utilization.", util, "percent"), 6, 4)
    xid = [q(f"count(DCGM_FI_DEV_XID_ERRORS{{{G}}} > 0) or vector(0)")]
    desc = "GPUs whose last XID error is non-zero."
    b.add(stat("GPUs with an XID", desc, xid, thresholds=thresholds((1, "red"))), 6, 4)


def _heat_power_load(b: Board) -> None:
    b.row("Heat and power")
    temps = [
        q(f"DCGM_FI_DEV_GPU_TEMP{{{G}}}", "GPU " + LEGEND),
        q(f"DCGM_FI_DEV_MEMORY_TEMP{{{G}}}", "memory " + LEGEND),
    ]
    desc = f"GPU and memory (HBM) temperature. Red line: VLLMGPUHot's threshold ({HOT:g} °C, on the GPU's)."
    b.add(series("Temperature", desc, temps, "celsius", line=HOT), 8)
    watts = [
        q(f"DCGM_FI_DEV_POWER_USAGE{{{G}}}", "draw " + LEGEND),
        q(f"DCGM_FI_DEV_POWER_MGMT_LIMIT{{{G}}}", "limit " + LEGEND),
    ]
    desc = "Power draw and the power-management limit (dashed), which the gpu_power_limit action moves."
    b.add(series("Power draw against the limit", desc, watts, "watt", overrides=[dashed("^limit .*")]), 8)
    share = [q(POWER_SHARE, LEGEND)]
    desc = f"Power draw over the power-management limit. Red line: VLLMGPUPowerCapped's {CAPPED:.0%}."
    b.add(series("Share of the power limit", desc, share, "percentunit", min=0, line=CAPPED), 8)
    b.row("Load")
    busy = [
        q(f"DCGM_FI_DEV_GPU_UTIL{{{G}}}", "GPU " + LEGEND),
        q(f"DCGM_FI_DEV_MEM_COPY_UTIL{{{G}}}", "memory copy " + LEGEND),
    ]
    desc = "Time the GPU and its memory interface were busy."
    b.add(series("Utilization", desc, busy, "percent", min=0, max=100), 8)
    fb = [
        q(f"DCGM_FI_DEV_FB_USED{{{G}}} / (DCGM_FI_DEV_FB_USED{{{G}}} + DCGM_FI_DEV_FB_FREE{{{G}}})", LEGEND)
    ]
    desc = "Device memory in use (vLLM reserves most of it for the KV cache)."
    b.add(series("Framebuffer used", desc, fb, "percentunit", min=0, max=1), 8)
    clock = [q(f"DCGM_FI_DEV_SM_CLOCK{{{G}}} * 1000000", LEGEND)]
    desc = "Streaming-multiprocessor clock; it drops while the GPU throttles."
    b.add(series("SM clock", desc, clock, "hertz"), 8)


def _throttling(b: Board) -> None:
    b.row("Throttling and errors")
    reasons = [q(f"floor({REASONS} / {bit}) % 2", f"{name} {LEGEND}") for bit, name in REASON_BITS]
    desc = "Why clocks are held down, from the bits of the clock-event reason mask."
    lanes = values((0, "-", "transparent"), (1, "active", "orange"))
    b.add(timeline("Clock-event (throttle) reasons", desc, reasons, lanes), 16, 10)
    last = [q(f"max by (instance, gpu) (DCGM_FI_DEV_XID_ERRORS{{{G}}})", LEGEND)]
    none = values((0, "none", "green"))
    b.add(stat("Last XID error", XIDS, last, thresholds=thresholds((1, "red")), mappings=none), 8, 10)
    rows = [
        q(f"max by (instance, gpu) (DCGM_FI_DEV_{field}{{{G}}})", f"{name} {LEGEND}")
        for field, name in (
            ("UNCORRECTABLE_REMAPPED_ROWS", "uncorrectable"),
            ("CORRECTABLE_REMAPPED_ROWS", "correctable"),
            ("ROW_REMAP_FAILURE", "remap failed"),
        )
    ]
    desc = (
        "Memory rows remapped for ECC errors since the GPU was made (kept in its InfoROM), and whether "
        "remapping failed. Growth of the uncorrectable count, or a failure, fires VLLMGPUMemoryErrors: data "
        "in memory, weights too, may be wrong until a reset."
    )
    b.add(series("Remapped memory rows", desc, rows, min=0), 24)


def gpu() -> Json:
    """The whole dashboard."""
    b = Board()
    _now(b)
    _heat_power_load(b)
    _throttling(b)
    variables = [
        variable("job", "DCGM_FI_DEV_GPU_TEMP", "job"),
        variable("instance", "DCGM_FI_DEV_GPU_TEMP", "instance", 'job=~"$job"'),
        variable("gpu", "DCGM_FI_DEV_GPU_TEMP", "gpu", 'job=~"$job", instance=~"$instance"'),
    ]
    desc = (
        "GPUs from dcgm-exporter: temperature, power against the limit, utilization, throttle reasons, XIDs, "
        "remapped memory rows."
    )
    return dashboard("vllm-watchdog-gpu", "GPU (dcgm-exporter)", desc, b, variables, [action_annotation("")])
