"""What the GPUs said: an NVML snapshot (sources/nvmlsnapshot.py), the last XID the store holds for each GPU,
and the NVIDIA driver's lines in the kernel log (`NVRM:`, the `NVRM: Xid` ones among them)."""

from __future__ import annotations

import asyncio
from collections.abc import Collection, Sequence
from typing import Any

from ...sources.nvmlsnapshot import snapshot
from ...store import SampleStore, is_stale
from .bounded import matching_lines

DRIVER_MARK = "NVRM:"
XID_MARK = "NVRM: Xid"
MAX_KERNEL_LINES = 200
XID_SERIES = "DCGM_FI_DEV_XID_ERRORS"  # the last XID per GPU, from the NVML source or a dcgm-exporter


async def nvml_snapshot(nvml: Any, gpus: Sequence[int]) -> dict[str, Any]:
    """The NVML snapshot of `gpus` (none: all), read in a worker thread: NVML calls block."""
    return await asyncio.to_thread(snapshot, nvml, gpus)


def last_xids(store: SampleStore, gpus: Collection[int]) -> dict[str, int]:
    """The newest XID value stored for each GPU (`gpu` label; only `gpus` when given)."""
    wanted = {str(g) for g in gpus}
    out: dict[str, int] = {}
    for series in store.select(XID_SERIES):
        gpu = dict(series.labels).get("gpu", "")
        if (wanted and gpu not in wanted) or not series.vals:
            continue
        value = series.vals[-1]
        if not is_stale(value) and value == value:  # noqa: PLR0124 (NaN)
            out[gpu] = int(value)
    return out


async def driver_lines(dmesg: Sequence[str], last: int = MAX_KERNEL_LINES) -> list[str]:
    """The last `last` NVIDIA driver lines of the kernel log; OSError or RuntimeError if it is unreadable."""
    lines, out = await matching_lines(dmesg, lambda line: DRIVER_MARK in line, last)
    if out.code != 0:
        raise RuntimeError(out.problem(dmesg[0]))
    return lines
