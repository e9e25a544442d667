"""GPU signals read through NVML and named like dcgm-exporter's counters.

One rule set then serves both this source and a dcgm-exporter scrape. Every sample carries the
labels dcgm-exporter puts on its GPU series: ``gpu`` (the index), ``UUID``, ``device``
(``nvidia<index>``, as dcgm-exporter spells it), ``modelName`` and ``Hostname``.

NVML calls are blocking C calls: run :meth:`NvmlSource.collect` in a worker thread.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..errors import SourceError

GpuSample = tuple[str, dict[str, str], float]
"""(metric name, labels, value)."""

XID_TOTAL = "vllm_watchdog_gpu_xid_errors_total"
_MIB = 1024 * 1024
_MAX_EVENTS_PER_COLLECT = 1024  # bound the drain so an XID storm cannot pin the thread
# NVML errors after which nothing read from NVML (or that GPU) can be trusted.
_FATAL_ERRORS = (
    "NVML_ERROR_UNINITIALIZED",
    "NVML_ERROR_DRIVER_NOT_LOADED",
    "NVML_ERROR_LIBRARY_NOT_FOUND",
    "NVML_ERROR_GPU_IS_LOST",
    "NVML_ERROR_RESET_REQUIRED",
    "NVML_ERROR_LIB_RM_VERSION_MISMATCH",
)
_INIT_HINTS = {
    "NVML_ERROR_LIBRARY_NOT_FOUND": "libnvidia-ml.so.1 not found; is the NVIDIA driver installed "
    "and, in a container, is the NVIDIA container runtime in use?",
    "NVML_ERROR_DRIVER_NOT_LOADED": "the NVIDIA kernel driver is not loaded",
    "NVML_ERROR_NO_PERMISSION": "no permission to open the NVIDIA device nodes",
    "NVML_ERROR_LIB_RM_VERSION_MISMATCH": "libnvidia-ml and the kernel driver versions differ "
    "(driver upgraded without a reboot?)",
}
_VALUE_FIELDS = ("dVal", "uiVal", "ulVal", "ullVal", "sllVal", "siVal", "usVal")  # by NVML type


class NvmlError(SourceError):
    """NVML could not be initialised or queried."""


@dataclass
class _Gpu:
    handle: Any
    labels: dict[str, str]
    event_set: Any = None
    last_xid: int = 0
    xid_counts: dict[int, int] = field(default_factory=dict)
    unsupported: set[str] = field(default_factory=set)
    legacy_clocks: bool = False


class NvmlSource:
    """Reads GPU signals through NVML and names them like dcgm-exporter."""

    def __init__(self, nvml: Any | None = None, hostname: str | None = None) -> None:
        self._nvml: Any = nvml
        self._hostname = hostname if hostname is not None else socket.gethostname()
        self._gpus: list[_Gpu] = []
        self._initialised = False
        self._field_errors = 0
        self._lock = threading.Lock()

    @property
    def field_errors(self) -> int:
        """Count of field reads skipped because NVML refused them."""
        return self._field_errors

    @property
    def xid_supported(self) -> dict[str, bool]:
        """Whether XID events could be registered, by ``gpu`` label."""
        return {g.labels["gpu"]: g.event_set is not None for g in self._gpus}

    def open(self) -> None:
        """Initialise NVML, read each GPU's labels and register for XID events."""
        with self._lock:
            if self._initialised:
                return
            nv = self._load()
            try:
                nv.nvmlInit()
            except nv.NVMLError as exc:
                raise NvmlError(f"NVML init failed: {self._describe(exc)}") from exc
            self._initialised = True
            try:
                for index in range(nv.nvmlDeviceGetCount()):
                    self._gpus.append(self._open_gpu(index))
            except nv.NVMLError as exc:
                self._shutdown()
                raise NvmlError(f"NVML device enumeration failed: {self._describe(exc)}") from exc

    def collect(self) -> list[GpuSample]:
        """Read every GPU once; a refused field is skipped and counted, a lost NVML raises."""
        with self._lock:
            if not self._initialised:
                raise NvmlError("NVML source is not open")
            out: list[GpuSample] = []
            for gpu in self._gpus:
                self._collect_gpu(gpu, out)
            return out

    def close(self) -> None:
        """Free the event sets and shut NVML down; idempotent."""
        with self._lock:
            self._shutdown()

    # -- internals -------------------------------------------------------------------------

    def _load(self) -> Any:
        if self._nvml is None:
            try:
                import pynvml  # noqa: PLC0415 - lazy: the package works without a GPU stack
            except ImportError as exc:
                raise NvmlError("nvidia-ml-py is not installed (pip install nvidia-ml-py)") from exc
            self._nvml = pynvml
        return self._nvml

    def _describe(self, exc: BaseException) -> str:
        code = getattr(exc, "value", None)
        for name, hint in _INIT_HINTS.items():
            if code is not None and code == getattr(self._nvml, name, object()):
                return f"{exc} ({hint})"
        return str(exc)

    def _is_fatal(self, code: object) -> bool:
        return any(code == getattr(self._nvml, name, object()) for name in _FATAL_ERRORS)

    def _open_gpu(self, index: int) -> _Gpu:
        nv = self._nvml
        handle = nv.nvmlDeviceGetHandleByIndex(index)
        labels = {
            "gpu": str(index),
            "UUID": str(nv.nvmlDeviceGetUUID(handle)),
            "device": f"nvidia{index}",
            "modelName": str(nv.nvmlDeviceGetName(handle)),
            "Hostname": self._hostname,
        }
        gpu = _Gpu(handle=handle, labels=labels)
        event_set = None
        try:
            event_set = nv.nvmlEventSetCreate()
            nv.nvmlDeviceRegisterEvents(handle, nv.nvmlEventTypeXidCriticalError, event_set)
        except nv.NVMLError as exc:
            if self._is_fatal(exc.value):
                raise
            # NotSupported (and e.g. NoPermission): carry on without XIDs for this GPU.
            if event_set is not None:
                self._free_event_set(event_set)
            event_set = None
        gpu.event_set = event_set
        return gpu

    def _free_event_set(self, event_set: Any) -> None:
        with contextlib.suppress(self._nvml.NVMLError):  # nothing to do about it at teardown
            self._nvml.nvmlEventSetFree(event_set)

    def _shutdown(self) -> None:
        if not self._initialised:
            return
        for gpu in self._gpus:
            if gpu.event_set is not None:
                self._free_event_set(gpu.event_set)
                gpu.event_set = None
        self._gpus = []
        self._initialised = False
        with contextlib.suppress(self._nvml.NVMLError):
            self._nvml.nvmlShutdown()

    def _refused(self, gpu: _Gpu, key: str, exc: Any) -> None:
        """Account for one refused field read, or raise if NVML itself is gone."""
        if self._is_fatal(exc.value):
            raise NvmlError(f"NVML failed on GPU {gpu.labels['gpu']}: {exc}") from exc
        self._field_errors += 1
        nv = self._nvml
        if exc.value in (nv.NVML_ERROR_NOT_SUPPORTED, nv.NVML_ERROR_FUNCTION_NOT_FOUND):
            gpu.unsupported.add(key)  # permanent: counted once, not asked again

    def _read(self, gpu: _Gpu, key: str, fn: Callable[..., Any], *args: Any) -> Any:
        if key in gpu.unsupported:
            return None
        try:
            return fn(gpu.handle, *args)
        except self._nvml.NVMLError as exc:
            self._refused(gpu, key, exc)
            return None

    def _memory_temp(self, gpu: _Gpu) -> float | None:
        nv = self._nvml
        key = "memory_temp"
        values = self._read(gpu, key, nv.nvmlDeviceGetFieldValues, [nv.NVML_FI_DEV_MEMORY_TEMP])
        if values is None:
            return None
        value = values[0]
        if value.nvmlReturn != nv.NVML_SUCCESS:  # per-field status; the call itself succeeded
            self._refused(gpu, key, nv.NVMLError(value.nvmlReturn))
            return None
        if not 0 <= value.valueType < len(_VALUE_FIELDS):
            self._refused(gpu, key, nv.NVMLError(nv.NVML_ERROR_UNKNOWN))
            return None
        return float(getattr(value.value, _VALUE_FIELDS[value.valueType]))

    def _memory(self, gpu: _Gpu) -> Any:
        """Framebuffer memory as dcgm-exporter and nvidia-smi count it.

        The v2 call keeps the driver's reserved memory out of `used` (an idle H200 reads 0 MiB used and
        615 MiB reserved; the v1 call says 615 used). Drivers before 510 lack it: then `used` includes the
        reserved part.
        """
        nv = self._nvml
        version = getattr(nv, "nvmlMemory_v2", None)
        if version is not None and "memory_v2" not in gpu.unsupported:
            try:
                return nv.nvmlDeviceGetMemoryInfo(gpu.handle, version)
            except nv.NVMLError as exc:
                if exc.value not in (nv.NVML_ERROR_NOT_SUPPORTED, nv.NVML_ERROR_FUNCTION_NOT_FOUND):
                    self._refused(gpu, "memory", exc)
                    return None
                gpu.unsupported.add("memory_v2")  # an older driver: the v1 call from now on, not an error
        return self._read(gpu, "memory", nv.nvmlDeviceGetMemoryInfo)

    def _clock_reasons(self, gpu: _Gpu) -> Any:
        nv = self._nvml
        current = getattr(nv, "nvmlDeviceGetCurrentClocksEventReasons", None)
        if current is not None and not gpu.legacy_clocks:
            try:
                return current(gpu.handle)
            except nv.NVMLError as exc:
                if exc.value not in (nv.NVML_ERROR_FUNCTION_NOT_FOUND, nv.NVML_ERROR_NOT_SUPPORTED):
                    self._refused(gpu, "clock_reasons", exc)
                    return None
                gpu.legacy_clocks = True  # driver older than the rename: use the old name
        return self._read(gpu, "clock_reasons", nv.nvmlDeviceGetCurrentClocksThrottleReasons)

    def _drain_xids(self, gpu: _Gpu) -> None:
        nv = self._nvml
        if "xid" in gpu.unsupported:
            return
        for _ in range(_MAX_EVENTS_PER_COLLECT):
            try:
                data = nv.nvmlEventSetWait_v2(gpu.event_set, 0)
            except nv.NVMLError as exc:
                if exc.value != nv.NVML_ERROR_TIMEOUT:  # Timeout: queue empty
                    self._refused(gpu, "xid", exc)
                return
            if data.eventType & nv.nvmlEventTypeXidCriticalError:
                xid = int(data.eventData)
                gpu.last_xid = xid
                gpu.xid_counts[xid] = gpu.xid_counts.get(xid, 0) + 1

    def _collect_gpu(self, gpu: _Gpu, out: list[GpuSample]) -> None:
        nv = self._nvml

        def emit(name: str, value: float | None, scale: float = 1.0) -> None:
            if value is not None:
                out.append((name, dict(gpu.labels), float(value) / scale))

        temp = self._read(gpu, "temp", nv.nvmlDeviceGetTemperature, nv.NVML_TEMPERATURE_GPU)
        emit("DCGM_FI_DEV_GPU_TEMP", temp)
        emit("DCGM_FI_DEV_MEMORY_TEMP", self._memory_temp(gpu))
        power = self._read(gpu, "power", nv.nvmlDeviceGetPowerUsage)
        emit("DCGM_FI_DEV_POWER_USAGE", power, 1000.0)  # NVML: mW, DCGM: W
        limit = self._read(gpu, "power_limit", nv.nvmlDeviceGetPowerManagementLimit)
        emit("DCGM_FI_DEV_POWER_MGMT_LIMIT", limit, 1000.0)
        enforced = self._read(gpu, "enforced_limit", nv.nvmlDeviceGetEnforcedPowerLimit)
        emit("DCGM_FI_DEV_ENFORCED_POWER_LIMIT", enforced, 1000.0)
        util = self._read(gpu, "util", nv.nvmlDeviceGetUtilizationRates)
        if util is not None:
            emit("DCGM_FI_DEV_GPU_UTIL", util.gpu)
            emit("DCGM_FI_DEV_MEM_COPY_UTIL", util.memory)
        mem = self._memory(gpu)
        if mem is not None:  # NVML: bytes, DCGM: whole MiB
            emit("DCGM_FI_DEV_FB_USED", mem.used // _MIB)
            emit("DCGM_FI_DEV_FB_FREE", mem.free // _MIB)
            reserved = getattr(mem, "reserved", None)  # the v2 call only
            emit("DCGM_FI_DEV_FB_RESERVED", None if reserved is None else reserved // _MIB)
        sm_clock = self._read(gpu, "sm_clock", nv.nvmlDeviceGetClockInfo, nv.NVML_CLOCK_SM)
        emit("DCGM_FI_DEV_SM_CLOCK", sm_clock)
        emit("DCGM_FI_DEV_CLOCKS_EVENT_REASONS", self._clock_reasons(gpu))
        if gpu.event_set is not None:
            self._drain_xids(gpu)
            emit("DCGM_FI_DEV_XID_ERRORS", gpu.last_xid)
            for xid, count in sorted(gpu.xid_counts.items()):
                out.append((XID_TOTAL, {**gpu.labels, "xid": str(xid)}, float(count)))
