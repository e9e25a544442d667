"""A fake NVML: the pynvml functions vllm_watchdog uses, over settable per-GPU state.

It reuses pynvml's real exception classes, constants and ctypes structures, so code under test
meets the same error types and return shapes as on a real GPU. Units are NVML's: mW, bytes,
MHz, degrees C. Every call is recorded in ``calls`` as ``(function name, args)``.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

import pynvml

GIB = 1024**3


@dataclass(frozen=True)
class FakeHandle:
    """An opaque device handle; only the fake looks inside."""

    index: int


@dataclass
class FakeEventSet:
    """An event set: the GPUs and event types registered on it and its pending events."""

    registered: dict[int, int] = field(default_factory=dict)  # gpu index -> event type mask
    pending: deque[tuple[int, int, int]] = field(default_factory=deque)  # (gpu, type, data)
    freed: bool = False


@dataclass
class FakeGpu:
    """Settable state of one fake GPU."""

    index: int
    uuid: str
    name: str = "NVIDIA H100 80GB HBM3"
    temperature_c: int = 40
    memory_temp_c: int | None = 45  # None: NVML_FI_DEV_MEMORY_TEMP is not supported
    power_mw: int = 250_000
    power_limit_mw: int = 700_000
    enforced_limit_mw: int = 700_000
    min_limit_mw: int = 200_000
    max_limit_mw: int = 700_000
    default_limit_mw: int = 700_000
    util_gpu: int = 0
    util_memory: int = 0
    sm_clock_mhz: int = 1980
    mem_clock_mhz: int = 2619
    clock_reasons: int = 0
    fb_total_bytes: int = 80 * GIB
    fb_used_bytes: int = 1 * GIB  # what programs hold: the v2 call's `used`
    fb_reserved_bytes: int = 0  # the driver's own; the v1 call counts it as used (an idle H200: 615 MiB)
    xid_supported: bool = True  # False: registering XID events raises NotSupported
    pstate: int = 0
    ecc_volatile: tuple[int, int] = (0, 0)  # (corrected, uncorrected) since the driver loaded
    ecc_aggregate: tuple[int, int] = (0, 0)  # over the GPU's life
    retired_pages: tuple[int, int, bool] | None = (
        0,
        0,
        False,
    )  # (single, double, pending); None: NotSupported
    remapped_rows: tuple[int, int, bool, bool] | None = (0, 0, False, False)  # None: NotSupported
    lost: bool = False  # True: every call on this GPU raises NVMLError_GpuIsLost


class FakeNvml:
    """A module-like stand-in for pynvml with per-GPU state, failure switches and a call log."""

    NVMLError = pynvml.NVMLError
    NVMLError_Uninitialized = pynvml.NVMLError_Uninitialized
    NVMLError_InvalidArgument = pynvml.NVMLError_InvalidArgument
    NVMLError_NotSupported = pynvml.NVMLError_NotSupported
    NVMLError_NoPermission = pynvml.NVMLError_NoPermission
    NVMLError_DriverNotLoaded = pynvml.NVMLError_DriverNotLoaded
    NVMLError_Timeout = pynvml.NVMLError_Timeout
    NVMLError_LibraryNotFound = pynvml.NVMLError_LibraryNotFound
    NVMLError_FunctionNotFound = pynvml.NVMLError_FunctionNotFound
    NVMLError_GpuIsLost = pynvml.NVMLError_GpuIsLost
    NVMLError_ResetRequired = pynvml.NVMLError_ResetRequired
    NVMLError_LibRmVersionMismatch = pynvml.NVMLError_LibRmVersionMismatch
    NVMLError_Unknown = pynvml.NVMLError_Unknown

    NVML_SUCCESS = pynvml.NVML_SUCCESS
    NVML_ERROR_UNINITIALIZED = pynvml.NVML_ERROR_UNINITIALIZED
    NVML_ERROR_INVALID_ARGUMENT = pynvml.NVML_ERROR_INVALID_ARGUMENT
    NVML_ERROR_NOT_SUPPORTED = pynvml.NVML_ERROR_NOT_SUPPORTED
    NVML_ERROR_NO_PERMISSION = pynvml.NVML_ERROR_NO_PERMISSION
    NVML_ERROR_DRIVER_NOT_LOADED = pynvml.NVML_ERROR_DRIVER_NOT_LOADED
    NVML_ERROR_TIMEOUT = pynvml.NVML_ERROR_TIMEOUT
    NVML_ERROR_LIBRARY_NOT_FOUND = pynvml.NVML_ERROR_LIBRARY_NOT_FOUND
    NVML_ERROR_FUNCTION_NOT_FOUND = pynvml.NVML_ERROR_FUNCTION_NOT_FOUND
    NVML_ERROR_GPU_IS_LOST = pynvml.NVML_ERROR_GPU_IS_LOST
    NVML_ERROR_RESET_REQUIRED = pynvml.NVML_ERROR_RESET_REQUIRED
    NVML_ERROR_LIB_RM_VERSION_MISMATCH = pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH
    NVML_ERROR_UNKNOWN = pynvml.NVML_ERROR_UNKNOWN

    NVML_TEMPERATURE_GPU = pynvml.NVML_TEMPERATURE_GPU
    NVML_CLOCK_GRAPHICS = pynvml.NVML_CLOCK_GRAPHICS
    NVML_CLOCK_SM = pynvml.NVML_CLOCK_SM
    NVML_CLOCK_MEM = pynvml.NVML_CLOCK_MEM
    NVML_FI_DEV_MEMORY_TEMP = pynvml.NVML_FI_DEV_MEMORY_TEMP
    NVML_MEMORY_ERROR_TYPE_CORRECTED = pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED
    NVML_MEMORY_ERROR_TYPE_UNCORRECTED = pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED
    NVML_VOLATILE_ECC = pynvml.NVML_VOLATILE_ECC
    NVML_AGGREGATE_ECC = pynvml.NVML_AGGREGATE_ECC
    NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS = (
        pynvml.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS
    )
    NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR = pynvml.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR
    NVML_VALUE_TYPE_UNSIGNED_INT = pynvml.NVML_VALUE_TYPE_UNSIGNED_INT
    nvmlEventTypeXidCriticalError = pynvml.nvmlEventTypeXidCriticalError
    nvmlMemory_v2 = pynvml.nvmlMemory_v2

    def __init__(self, gpus: int = 2, *, legacy_driver: bool = False) -> None:
        self.gpus = [FakeGpu(i, f"GPU-{i:08x}-0000-4000-8000-{i:012x}") for i in range(gpus)]
        self.legacy_driver = legacy_driver  # True: no ...CurrentClocksEventReasons, no ...MemoryInfo_v2
        self.calls: list[tuple[str, tuple[Any, ...]]] = []
        self.event_sets: list[FakeEventSet] = []
        self.refcount = 0  # nvmlInit minus nvmlShutdown, as NVML counts it
        self._failures: dict[tuple[str, int | None], Exception] = {}

    # -- switches and inspection ----------------------------------------------------------

    def fail(self, function: str, error: Exception, gpu: int | None = None) -> None:
        """Make `function` raise `error` (on GPU `gpu` only, or on any call) until cleared."""
        self._failures[(function, gpu)] = error

    def clear_failures(self) -> None:
        """Remove every failure switch."""
        self._failures.clear()

    def queue_xid(self, gpu: int, *xids: int) -> None:
        """Raise XID errors on a GPU: every live event set registered for XIDs gets them."""
        for event_set in self.event_sets:
            mask = event_set.registered.get(gpu, 0)
            if not event_set.freed and mask & self.nvmlEventTypeXidCriticalError:
                for xid in xids:
                    event_set.pending.append((gpu, self.nvmlEventTypeXidCriticalError, xid))

    def count(self, function: str) -> int:
        """How many times `function` was called."""
        return sum(1 for name, _ in self.calls if name == function)

    @property
    def live_event_sets(self) -> list[FakeEventSet]:
        """Event sets created and not yet freed."""
        return [s for s in self.event_sets if not s.freed]

    # -- plumbing -------------------------------------------------------------------------

    def _enter(self, name: str, *args: Any, index: int | None = None, init: bool = True) -> None:
        self.calls.append((name, args))
        for key in ((name, index), (name, None)):
            if key in self._failures:
                raise self._failures[key]
        if init and self.refcount == 0:
            raise pynvml.NVMLError_Uninitialized()

    def _gpu(self, name: str, handle: Any, *args: Any) -> FakeGpu:
        """Record and vet a call on a device handle; return that GPU's state."""
        index = handle.index if isinstance(handle, FakeHandle) else None
        self._enter(name, handle, *args, index=index)
        if index is None or not 0 <= index < len(self.gpus):
            raise pynvml.NVMLError_InvalidArgument()
        gpu = self.gpus[index]
        if gpu.lost:
            raise pynvml.NVMLError_GpuIsLost()
        return gpu

    # -- library --------------------------------------------------------------------------

    def nvmlInit(self) -> None:
        """Initialise (reference-counted, like NVML)."""
        self._enter("nvmlInit", init=False)
        self.refcount += 1

    def nvmlShutdown(self) -> None:
        """Drop one initialisation; Uninitialized if there is none."""
        self._enter("nvmlShutdown")
        self.refcount -= 1

    def nvmlSystemGetDriverVersion(self) -> str:
        """The driver's version string."""
        self._enter("nvmlSystemGetDriverVersion")
        return "580.159.04"

    def nvmlDeviceGetCount(self) -> int:
        """Number of fake GPUs."""
        self._enter("nvmlDeviceGetCount")
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> FakeHandle:
        """The handle of GPU `index`."""
        self._enter("nvmlDeviceGetHandleByIndex", index, index=index)
        if not 0 <= index < len(self.gpus):
            raise pynvml.NVMLError_InvalidArgument()
        return FakeHandle(index)

    # -- device queries -------------------------------------------------------------------

    def nvmlDeviceGetUUID(self, handle: FakeHandle) -> str:
        """The GPU's UUID."""
        return self._gpu("nvmlDeviceGetUUID", handle).uuid

    def nvmlDeviceGetName(self, handle: FakeHandle) -> str:
        """The GPU's product name."""
        return self._gpu("nvmlDeviceGetName", handle).name

    def nvmlDeviceGetTemperature(self, handle: FakeHandle, sensor: int) -> int:
        """Die temperature, degrees C."""
        gpu = self._gpu("nvmlDeviceGetTemperature", handle, sensor)
        if sensor != self.NVML_TEMPERATURE_GPU:
            raise pynvml.NVMLError_InvalidArgument()
        return gpu.temperature_c

    def nvmlDeviceGetFieldValues(self, handle: FakeHandle, field_ids: list[Any]) -> Any:
        """Field values as real c_nvmlFieldValue_t structs; per-field status in nvmlReturn."""
        gpu = self._gpu("nvmlDeviceGetFieldValues", handle, list(field_ids))
        values = (pynvml.c_nvmlFieldValue_t * len(field_ids))()
        for value, field_id in zip(values, field_ids, strict=True):
            value.fieldId = field_id[0] if isinstance(field_id, tuple) else field_id
            if value.fieldId == self.NVML_FI_DEV_MEMORY_TEMP and gpu.memory_temp_c is not None:
                value.nvmlReturn = self.NVML_SUCCESS
                value.valueType = self.NVML_VALUE_TYPE_UNSIGNED_INT
                value.value.uiVal = gpu.memory_temp_c
            else:
                value.nvmlReturn = self.NVML_ERROR_NOT_SUPPORTED
        return values

    def nvmlDeviceGetPowerUsage(self, handle: FakeHandle) -> int:
        """Power draw, mW."""
        return self._gpu("nvmlDeviceGetPowerUsage", handle).power_mw

    def nvmlDeviceGetPowerManagementLimit(self, handle: FakeHandle) -> int:
        """Configured power limit, mW."""
        return self._gpu("nvmlDeviceGetPowerManagementLimit", handle).power_limit_mw

    def nvmlDeviceGetEnforcedPowerLimit(self, handle: FakeHandle) -> int:
        """Power limit the driver enforces, mW."""
        return self._gpu("nvmlDeviceGetEnforcedPowerLimit", handle).enforced_limit_mw

    def nvmlDeviceGetPowerManagementLimitConstraints(self, handle: FakeHandle) -> list[int]:
        """[min, max] settable power limit, mW (a list, as pynvml returns it)."""
        gpu = self._gpu("nvmlDeviceGetPowerManagementLimitConstraints", handle)
        return [gpu.min_limit_mw, gpu.max_limit_mw]

    def nvmlDeviceGetPowerManagementDefaultLimit(self, handle: FakeHandle) -> int:
        """The power limit the GPU boots with, mW."""
        return self._gpu("nvmlDeviceGetPowerManagementDefaultLimit", handle).default_limit_mw

    def nvmlDeviceSetPowerManagementLimit(self, handle: FakeHandle, limit: int) -> None:
        """Set the power limit, mW; InvalidArgument outside the constraints."""
        gpu = self._gpu("nvmlDeviceSetPowerManagementLimit", handle, limit)
        if not gpu.min_limit_mw <= limit <= gpu.max_limit_mw:
            raise pynvml.NVMLError_InvalidArgument()
        gpu.power_limit_mw = limit
        gpu.enforced_limit_mw = limit

    def nvmlDeviceGetUtilizationRates(self, handle: FakeHandle) -> Any:
        """GPU and memory utilisation, % (a real c_nvmlUtilization_t)."""
        gpu = self._gpu("nvmlDeviceGetUtilizationRates", handle)
        return pynvml.c_nvmlUtilization_t(gpu=gpu.util_gpu, memory=gpu.util_memory)

    def nvmlDeviceGetMemoryInfo(self, handle: FakeHandle, version: Any = None) -> Any:
        """Framebuffer memory, bytes: a real c_nvmlMemory_t, or with `version` a c_nvmlMemory_v2_t (which
        counts the driver's reserved memory apart; a legacy driver lacks that call)."""
        gpu = self._gpu("nvmlDeviceGetMemoryInfo", handle, *([version] if version else []))
        free = gpu.fb_total_bytes - gpu.fb_used_bytes - gpu.fb_reserved_bytes
        if not version:
            used = gpu.fb_used_bytes + gpu.fb_reserved_bytes
            return pynvml.c_nvmlMemory_t(total=gpu.fb_total_bytes, free=free, used=used)
        if self.legacy_driver:
            raise pynvml.NVMLError_FunctionNotFound()
        return pynvml.c_nvmlMemory_v2_t(
            version=version,
            total=gpu.fb_total_bytes,
            reserved=gpu.fb_reserved_bytes,
            free=free,
            used=gpu.fb_used_bytes,
        )

    def nvmlDeviceGetClockInfo(self, handle: FakeHandle, clock_type: int) -> int:
        """Current clock, MHz."""
        gpu = self._gpu("nvmlDeviceGetClockInfo", handle, clock_type)
        if clock_type in (self.NVML_CLOCK_SM, self.NVML_CLOCK_GRAPHICS):
            return gpu.sm_clock_mhz
        if clock_type == self.NVML_CLOCK_MEM:
            return gpu.mem_clock_mhz
        raise pynvml.NVMLError_InvalidArgument()

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: FakeHandle) -> int:
        """Clock event reasons bitmask; FunctionNotFound when `legacy_driver`."""
        gpu = self._gpu("nvmlDeviceGetCurrentClocksEventReasons", handle)
        if self.legacy_driver:
            raise pynvml.NVMLError_FunctionNotFound()
        return gpu.clock_reasons

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, handle: FakeHandle) -> int:
        """The same bitmask under its pre-rename name."""
        return self._gpu("nvmlDeviceGetCurrentClocksThrottleReasons", handle).clock_reasons

    def nvmlDeviceGetPerformanceState(self, handle: FakeHandle) -> int:
        """The performance state, 0 (P0, fastest) to 15."""
        return self._gpu("nvmlDeviceGetPerformanceState", handle).pstate

    def nvmlDeviceGetTotalEccErrors(self, handle: FakeHandle, error_type: int, counter_type: int) -> int:
        """ECC errors of one type (corrected, uncorrected) on one counter (volatile, aggregate)."""
        gpu = self._gpu("nvmlDeviceGetTotalEccErrors", handle, error_type, counter_type)
        counts = gpu.ecc_volatile if counter_type == self.NVML_VOLATILE_ECC else gpu.ecc_aggregate
        return counts[0] if error_type == self.NVML_MEMORY_ERROR_TYPE_CORRECTED else counts[1]

    def nvmlDeviceGetRetiredPages(self, handle: FakeHandle, cause: int) -> list[int]:
        """Addresses of the pages retired for `cause`; NotSupported where the GPU remaps rows instead."""
        gpu = self._gpu("nvmlDeviceGetRetiredPages", handle, cause)
        if gpu.retired_pages is None:
            raise pynvml.NVMLError_NotSupported()
        single = cause == self.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS
        return [0x1000 * (i + 1) for i in range(gpu.retired_pages[0 if single else 1])]

    def nvmlDeviceGetRetiredPagesPendingStatus(self, handle: FakeHandle) -> int:
        """1 if a retirement waits for the next reboot."""
        gpu = self._gpu("nvmlDeviceGetRetiredPagesPendingStatus", handle)
        if gpu.retired_pages is None:
            raise pynvml.NVMLError_NotSupported()
        return int(gpu.retired_pages[2])

    def nvmlDeviceGetRemappedRows(self, handle: FakeHandle) -> tuple[int, int, int, int]:
        """(corrected, uncorrected, pending, failure) as pynvml returns them."""
        gpu = self._gpu("nvmlDeviceGetRemappedRows", handle)
        if gpu.remapped_rows is None:
            raise pynvml.NVMLError_NotSupported()
        corrected, uncorrected, pending, failure = gpu.remapped_rows
        return corrected, uncorrected, int(pending), int(failure)

    # -- events ---------------------------------------------------------------------------

    def nvmlEventSetCreate(self) -> FakeEventSet:
        """A new, empty event set."""
        self._enter("nvmlEventSetCreate")
        event_set = FakeEventSet()
        self.event_sets.append(event_set)
        return event_set

    def nvmlDeviceRegisterEvents(self, handle: FakeHandle, event_types: int, event_set: FakeEventSet) -> None:
        """Register event types of a GPU on a set; NotSupported if the GPU has no XIDs."""
        gpu = self._gpu("nvmlDeviceRegisterEvents", handle, event_types, event_set)
        if event_set.freed:
            raise pynvml.NVMLError_InvalidArgument()
        if event_types & self.nvmlEventTypeXidCriticalError and not gpu.xid_supported:
            raise pynvml.NVMLError_NotSupported()
        event_set.registered[gpu.index] = event_set.registered.get(gpu.index, 0) | event_types

    def nvmlEventSetWait_v2(self, event_set: FakeEventSet, timeoutms: int) -> Any:
        """Pop one pending event (a real c_nvmlEventData_t), or raise Timeout at once."""
        only = list(event_set.registered)  # a per-GPU set: fail(..., gpu=N) applies to it
        index = only[0] if len(only) == 1 else None
        self._enter("nvmlEventSetWait_v2", event_set, timeoutms, index=index)
        if event_set.freed:
            raise pynvml.NVMLError_InvalidArgument()
        if not event_set.pending:
            raise pynvml.NVMLError_Timeout()
        gpu, event_type, data = event_set.pending.popleft()
        if self.gpus[gpu].lost:
            raise pynvml.NVMLError_GpuIsLost()
        return pynvml.c_nvmlEventData_t(eventType=event_type, eventData=data)

    def nvmlEventSetFree(self, event_set: FakeEventSet) -> None:
        """Free an event set; InvalidArgument on a double free."""
        self._enter("nvmlEventSetFree", event_set)
        if event_set.freed:
            raise pynvml.NVMLError_InvalidArgument()
        event_set.freed = True
