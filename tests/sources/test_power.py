"""Tests of GPU power limiting against the fake NVML (no GPU here)."""

from __future__ import annotations

import pynvml
import pytest

from tests.support.fake_nvml import FakeNvml
from vllm_watchdog.actions.runtimes.power import PowerLimiter
from vllm_watchdog.errors import ActionError


def test_reads_limit_range_and_default_in_watts() -> None:
    fake = FakeNvml(gpus=2)
    fake.gpus[1].power_limit_mw = 450_000
    fake.gpus[1].default_limit_mw = 600_000
    power = PowerLimiter(fake)
    assert power.current(1) == 450.0
    assert power.constraints(1) == (200.0, 700.0)
    assert power.default(1) == 600.0
    assert power.current(0) == 700.0
    assert fake.refcount == 1  # initialised once, lazily
    power.close()
    assert fake.refcount == 0
    power.close()  # idempotent
    assert fake.refcount == 0


def test_set_limit_clamps_to_what_the_gpu_accepts() -> None:
    fake = FakeNvml(gpus=1)
    power = PowerLimiter(fake)
    assert power.set_limit(0, 350.5) == 350.5
    assert fake.gpus[0].power_limit_mw == 350_500  # NVML speaks milliwatts
    assert power.set_limit(0, 50.0) == 200.0  # below the minimum: the minimum
    assert fake.gpus[0].power_limit_mw == 200_000
    assert power.set_limit(0, 5000.0) == 700.0  # above the maximum: the maximum
    assert fake.gpus[0].power_limit_mw == 700_000
    fake.gpus[0].min_limit_mw = 300_000
    assert power.set_limit(0, 250.0) == 300.0
    for nonsense in (0.0, -1.0, float("nan"), float("inf")):
        with pytest.raises(ActionError, match="not a power limit"):
            power.set_limit(0, nonsense)
    assert fake.gpus[0].power_limit_mw == 300_000


def test_no_permission_is_an_action_error_that_says_why() -> None:
    fake = FakeNvml(gpus=1)
    fake.fail("nvmlDeviceSetPowerManagementLimit", pynvml.NVMLError_NoPermission())
    power = PowerLimiter(fake)
    with pytest.raises(ActionError, match=r"GPU 0: cannot set the power limit to 400 W: .*needs root"):
        power.set_limit(0, 400.0)
    assert fake.gpus[0].power_limit_mw == 700_000  # untouched
    assert power.current(0) == 700.0  # reading still works


@pytest.mark.parametrize(
    ("function", "error", "message"),
    [
        ("nvmlDeviceGetPowerManagementLimitConstraints", pynvml.NVMLError_NotSupported(), "does not support"),
        ("nvmlDeviceGetPowerManagementDefaultLimit", pynvml.NVMLError_GpuIsLost(), "fell off the bus"),
        ("nvmlInit", pynvml.NVMLError_DriverNotLoaded(), "NVML init failed"),
    ],
)
def test_nvml_errors_are_action_errors(function: str, error: Exception, message: str) -> None:
    fake = FakeNvml(gpus=1)
    fake.fail(function, error)
    power = PowerLimiter(fake)
    with pytest.raises(ActionError, match=message):
        power.restore(0)


def test_unknown_gpu_is_an_action_error() -> None:
    power = PowerLimiter(FakeNvml(gpus=1))
    with pytest.raises(ActionError, match="GPU 3: cannot read the power limit"):
        power.current(3)


def test_restore_puts_back_the_saved_limit_or_the_default() -> None:
    fake = FakeNvml(gpus=1)
    fake.gpus[0].power_limit_mw = 650_000
    fake.gpus[0].default_limit_mw = 700_000
    power = PowerLimiter(fake)
    before = power.current(0)
    power.set_limit(0, 300.0)
    assert power.restore(0, before) == 650.0
    assert fake.gpus[0].power_limit_mw == 650_000
    power.set_limit(0, 300.0)
    assert power.restore(0) == 700.0
    assert fake.gpus[0].power_limit_mw == 700_000
    assert fake.count("nvmlDeviceSetPowerManagementLimit") == 4
