"""One NVML reading of a GPU's health for an incident bundle: clocks and why they are held down, power,
temperature, ECC counters, retired pages and remapped rows.

NVML answers some of these on some GPUs only (an H200 answers ECC and remapped rows; retired pages, the older
mechanism, are NotSupported there), so every field is read on its own and a refusal is kept as the reason in
`errors`, never raised. Blocking C calls: run `snapshot` in a worker thread. Needs only the standard library
and an NVML module (pynvml or the fake), so scripts/gpu_check.py can run it on a bare GPU host.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Sequence
from typing import Any

from .clockreasons import describe

MAX_GPUS = 64
_MIB = 1024 * 1024


def snapshot(nv: Any, indices: Sequence[int] = ()) -> dict[str, Any]:
    """{"driver": ..., "gpus": [...]} for the GPUs `indices` (none: every GPU), or {"error": why}."""
    try:
        nv.nvmlInit()
    except Exception as exc:  # NVMLError, or a library that cannot load: the reason is the evidence
        return {"error": f"NVML unavailable: {exc}"}
    try:
        out: dict[str, Any] = {}
        _field(out, {}, "driver", nv.nvmlSystemGetDriverVersion)
        count = int(nv.nvmlDeviceGetCount())
        wanted = [i for i in (indices or range(count)) if 0 <= i < count][:MAX_GPUS]
        out["gpus"] = [_gpu(nv, index) for index in wanted]
        missing = sorted(set(indices) - set(wanted))
        if missing:
            out["error"] = f"no GPU with index {', '.join(map(str, missing))} ({count} GPUs)"
        return out
    except Exception as exc:
        return {"error": f"NVML failed: {exc}"}
    finally:
        with contextlib.suppress(Exception):  # the reading is taken; a failed shutdown tells nothing more
            nv.nvmlShutdown()


def _field(out: dict[str, Any], errors: dict[str, str], key: str, read: Callable[[], Any]) -> None:
    try:
        out[key] = read()
    except Exception as exc:  # each field on its own: a refusal is recorded, the others are still read
        errors[key] = str(exc) or type(exc).__name__


def _gpu(nv: Any, index: int) -> dict[str, Any]:
    out: dict[str, Any] = {"index": index}
    errors: dict[str, str] = {}
    try:
        h = nv.nvmlDeviceGetHandleByIndex(index)
    except Exception as exc:
        return {"index": index, "errors": {"handle": str(exc)}}

    def read(key: str, fn: Callable[..., Any], *args: Any) -> None:
        _field(out, errors, key, lambda: fn(h, *args))

    read("uuid", nv.nvmlDeviceGetUUID)
    read("name", nv.nvmlDeviceGetName)
    read("pstate", nv.nvmlDeviceGetPerformanceState)
    read("temperature_c", nv.nvmlDeviceGetTemperature, nv.NVML_TEMPERATURE_GPU)
    _field(out, errors, "power_w", lambda: nv.nvmlDeviceGetPowerUsage(h) / 1000.0)
    _field(out, errors, "power_limit_w", lambda: nv.nvmlDeviceGetPowerManagementLimit(h) / 1000.0)
    _field(out, errors, "enforced_power_limit_w", lambda: nv.nvmlDeviceGetEnforcedPowerLimit(h) / 1000.0)
    clocks: dict[str, Any] = {}
    for name, kind in (
        ("sm", "NVML_CLOCK_SM"),
        ("memory", "NVML_CLOCK_MEM"),
        ("graphics", "NVML_CLOCK_GRAPHICS"),
    ):
        _field(
            clocks,
            errors,
            f"clock_{name}",
            functools.partial(nv.nvmlDeviceGetClockInfo, h, getattr(nv, kind)),
        )
    clocks = {key.removeprefix("clock_"): value for key, value in clocks.items()}
    if clocks:
        out["clocks_mhz"] = clocks
    _field(out, errors, "clock_event_reasons", lambda: _reasons(nv, h))
    _field(out, errors, "memory_mib", lambda: _memory(nv, h))
    ecc: dict[str, Any] = {}
    for counter, counter_type in (("volatile", "NVML_VOLATILE_ECC"), ("aggregate", "NVML_AGGREGATE_ECC")):
        _field(ecc, errors, f"ecc_{counter}", functools.partial(_ecc, nv, h, getattr(nv, counter_type)))
    if ecc:
        out["ecc"] = {key.removeprefix("ecc_"): value for key, value in ecc.items()}
    _field(out, errors, "retired_pages", lambda: _retired(nv, h))
    _field(out, errors, "remapped_rows", lambda: _remapped(nv, h))
    if errors:
        out["errors"] = errors
    return out


def _reasons(nv: Any, h: Any) -> dict[str, Any]:
    """The clocks-event (throttle) reasons mask and its names; the pre-535 function name on older drivers."""
    try:
        mask = int(nv.nvmlDeviceGetCurrentClocksEventReasons(h))
    except (AttributeError, nv.NVMLError) as exc:
        code = getattr(exc, "value", None)
        if not isinstance(exc, AttributeError) and code not in (
            nv.NVML_ERROR_FUNCTION_NOT_FOUND,
            nv.NVML_ERROR_NOT_SUPPORTED,
        ):
            raise
        mask = int(nv.nvmlDeviceGetCurrentClocksThrottleReasons(h))
    return {"mask": f"{mask:#x}", "names": describe(mask)}


def _memory(nv: Any, h: Any) -> dict[str, int]:
    mem = nv.nvmlDeviceGetMemoryInfo(h)
    return {"used": int(mem.used) // _MIB, "total": int(mem.total) // _MIB}


def _ecc(nv: Any, h: Any, counter: int) -> dict[str, int]:
    return {
        "corrected": int(nv.nvmlDeviceGetTotalEccErrors(h, nv.NVML_MEMORY_ERROR_TYPE_CORRECTED, counter)),
        "uncorrected": int(nv.nvmlDeviceGetTotalEccErrors(h, nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, counter)),
    }


def _retired(nv: Any, h: Any) -> dict[str, Any]:
    single = nv.nvmlDeviceGetRetiredPages(h, nv.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS)
    double = nv.nvmlDeviceGetRetiredPages(h, nv.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR)
    pending = nv.nvmlDeviceGetRetiredPagesPendingStatus(h)
    return {"single_bit_ecc": len(single), "double_bit_ecc": len(double), "pending": bool(pending)}


def _remapped(nv: Any, h: Any) -> dict[str, Any]:
    corrected, uncorrected, pending, failed = nv.nvmlDeviceGetRemappedRows(h)
    return {
        "corrected": int(corrected),
        "uncorrected": int(uncorrected),
        "pending": bool(pending),
        "failure": bool(failed),
    }
