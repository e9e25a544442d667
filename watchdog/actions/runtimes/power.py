"""GPU power limits through NVML: read the limit and its bounds, set a lower one, put it back.

Watts here, milliwatts to NVML. Setting a limit needs root (CAP_SYS_ADMIN); without it NVML answers
NoPermission, which becomes an ActionError saying so. NVML calls block: run these in a worker thread.
"""

from __future__ import annotations

import contextlib
import math
import threading
from typing import Any

from ...errors import ActionError

_HINTS = {
    "NVML_ERROR_NO_PERMISSION": "setting a GPU power limit needs root (CAP_SYS_ADMIN)",
    "NVML_ERROR_NOT_SUPPORTED": "this GPU does not support power management limits",
    "NVML_ERROR_INVALID_ARGUMENT": "no such GPU, or a limit outside its range",
    "NVML_ERROR_GPU_IS_LOST": "the GPU fell off the bus",
}


class PowerLimiter:
    """Reads and sets GPU power-management limits, in watts, on an injected pynvml-like module."""

    def __init__(self, nvml: Any | None = None) -> None:
        self._nvml: Any = nvml
        self._initialised = False
        self._lock = threading.Lock()

    def current(self, index: int) -> float:
        """The configured power limit of GPU `index`, W."""
        return self._watts(index, "read the power limit", "nvmlDeviceGetPowerManagementLimit")

    def constraints(self, index: int) -> tuple[float, float]:
        """The lowest and highest limit GPU `index` accepts, W."""
        low, high = self._call(
            index, "read the power limit range", "nvmlDeviceGetPowerManagementLimitConstraints"
        )
        return low / 1000.0, high / 1000.0

    def default(self, index: int) -> float:
        """GPU `index`'s default power limit (what it boots with), W."""
        return self._watts(index, "read the default power limit", "nvmlDeviceGetPowerManagementDefaultLimit")

    def set_limit(self, index: int, watts: float) -> float:
        """Set GPU `index`'s limit to `watts`, clamped to what the GPU accepts; returns the watts applied."""
        if not math.isfinite(watts) or watts <= 0:
            raise ActionError(f"GPU {index}: {watts} W is not a power limit")
        low, high = self.constraints(index)
        milliwatts = round(min(max(watts, low), high) * 1000.0)
        self._call(
            index,
            f"set the power limit to {milliwatts / 1000.0:g} W",
            "nvmlDeviceSetPowerManagementLimit",
            milliwatts,
        )
        return milliwatts / 1000.0

    def restore(self, index: int, watts: float | None = None) -> float:
        """Put GPU `index`'s limit back to `watts` (what it was before), or to its default if None."""
        return self.set_limit(index, self.default(index) if watts is None else watts)

    def close(self) -> None:
        """Release NVML (reference-counted: a GPU source using it keeps it open)."""
        with self._lock:
            if self._initialised:
                self._initialised = False
                with contextlib.suppress(self._nvml.NVMLError):  # nothing to do about it at teardown
                    self._nvml.nvmlShutdown()

    # -- internals -------------------------------------------------------------------------

    def _watts(self, index: int, what: str, function: str) -> float:
        return float(self._call(index, what, function)) / 1000.0

    def _call(self, index: int, what: str, function: str, *args: Any) -> Any:
        with self._lock:
            nv = self._open()
            try:
                handle = nv.nvmlDeviceGetHandleByIndex(index)
                return getattr(nv, function)(handle, *args)
            except nv.NVMLError as exc:
                raise ActionError(f"GPU {index}: cannot {what}: {self._describe(exc)}") from exc

    def _open(self) -> Any:
        if self._nvml is None:
            try:
                import pynvml  # noqa: PLC0415 - lazy: the package works without a GPU stack
            except ImportError as exc:
                raise ActionError("nvidia-ml-py is not installed (pip install nvidia-ml-py)") from exc
            self._nvml = pynvml
        nv = self._nvml
        if not self._initialised:
            try:
                nv.nvmlInit()
            except nv.NVMLError as exc:
                raise ActionError(f"NVML init failed: {self._describe(exc)}") from exc
            self._initialised = True
        return nv

    def _describe(self, exc: BaseException) -> str:
        code = getattr(exc, "value", None)
        for name, hint in _HINTS.items():
            if code is not None and code == getattr(self._nvml, name, object()):
                return f"{exc} ({hint})"
        return str(exc)
