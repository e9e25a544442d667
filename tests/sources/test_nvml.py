"""Tests of the NVML source against the fake NVML in fake_nvml.py."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections import Counter

import pynvml
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.support.fake_nvml import GIB, FakeNvml
from vllm_watchdog.sources.nvml import XID_TOTAL, GpuSample, NvmlError, NvmlSource

GPU_LABELS = {"gpu", "UUID", "device", "modelName", "Hostname"}


def opened(fake: FakeNvml) -> NvmlSource:
    source = NvmlSource(nvml=fake, hostname="node-a")
    source.open()
    return source


def by_gpu(samples: list[GpuSample], name: str) -> dict[str, float]:
    """{gpu label: value} of one metric; fails on a duplicate series."""
    out: dict[str, float] = {}
    for metric, labels, value in samples:
        if metric == name:
            assert labels["gpu"] not in out, f"duplicate {name} for GPU {labels['gpu']}"
            out[labels["gpu"]] = value
    return out


def xid_totals(samples: list[GpuSample], gpu: str) -> dict[int, float]:
    return {
        int(labels["xid"]): value
        for metric, labels, value in samples
        if metric == XID_TOTAL and labels["gpu"] == gpu
    }


def test_two_gpus_names_units_labels_and_values() -> None:
    fake = FakeNvml(gpus=2)
    g0, g1 = fake.gpus
    g0.temperature_c, g1.temperature_c = 41, 77
    g0.memory_temp_c, g1.memory_temp_c = 50, 88
    g0.util_gpu, g0.util_memory, g1.util_gpu, g1.util_memory = 3, 1, 99, 64
    g0.sm_clock_mhz, g1.sm_clock_mhz = 1980, 1410
    g1.clock_reasons = pynvml.nvmlClocksEventReasonSwThermalSlowdown
    g1.fb_used_bytes = 70 * GIB
    g1.name = "NVIDIA H200"
    samples = opened(fake).collect()

    assert by_gpu(samples, "DCGM_FI_DEV_GPU_TEMP") == {"0": 41.0, "1": 77.0}
    assert by_gpu(samples, "DCGM_FI_DEV_MEMORY_TEMP") == {"0": 50.0, "1": 88.0}
    assert by_gpu(samples, "DCGM_FI_DEV_GPU_UTIL") == {"0": 3.0, "1": 99.0}
    assert by_gpu(samples, "DCGM_FI_DEV_MEM_COPY_UTIL") == {"0": 1.0, "1": 64.0}
    assert by_gpu(samples, "DCGM_FI_DEV_SM_CLOCK") == {"0": 1980.0, "1": 1410.0}
    assert by_gpu(samples, "DCGM_FI_DEV_CLOCKS_EVENT_REASONS") == {"0": 0.0, "1": 32.0}
    assert by_gpu(samples, "DCGM_FI_DEV_FB_USED") == {"0": 1024.0, "1": 70 * 1024.0}
    assert by_gpu(samples, "DCGM_FI_DEV_FB_FREE") == {"0": 79 * 1024.0, "1": 10 * 1024.0}
    assert by_gpu(samples, "DCGM_FI_DEV_XID_ERRORS") == {"0": 0.0, "1": 0.0}
    assert not [s for s in samples if s[0] == XID_TOTAL]

    for metric, labels, _ in samples:
        assert set(labels) == GPU_LABELS, metric
        assert isinstance(_, float)
    labels1 = next(labels for _, labels, _ in samples if labels["gpu"] == "1")
    assert labels1 == {
        "gpu": "1",
        "UUID": g1.uuid,
        "device": "nvidia1",
        "modelName": "NVIDIA H200",
        "Hostname": "node-a",
    }
    assert len(samples) == 2 * 13  # 12 series and the reserved framebuffer


def test_power_is_converted_from_milliwatts_to_watts() -> None:
    fake = FakeNvml(gpus=2)
    fake.gpus[0].power_mw = 123_456
    fake.gpus[0].power_limit_mw = 500_000
    fake.gpus[0].enforced_limit_mw = 450_500
    samples = opened(fake).collect()
    assert by_gpu(samples, "DCGM_FI_DEV_POWER_USAGE")["0"] == pytest.approx(123.456)
    assert by_gpu(samples, "DCGM_FI_DEV_POWER_MGMT_LIMIT")["0"] == 500.0
    assert by_gpu(samples, "DCGM_FI_DEV_ENFORCED_POWER_LIMIT")["0"] == 450.5
    assert by_gpu(samples, "DCGM_FI_DEV_POWER_USAGE")["1"] == 250.0


@settings(max_examples=50)
@given(st.integers(min_value=0, max_value=2**32 - 1))
def test_power_conversion_any_reading(milliwatts: int) -> None:
    fake = FakeNvml(gpus=1)
    fake.gpus[0].power_mw = milliwatts
    samples = opened(fake).collect()
    assert by_gpu(samples, "DCGM_FI_DEV_POWER_USAGE") == {"0": milliwatts / 1000}


def test_clock_reasons_fall_back_to_the_legacy_function() -> None:
    fake = FakeNvml(gpus=2, legacy_driver=True)
    fake.gpus[1].clock_reasons = pynvml.nvmlClocksThrottleReasonSwPowerCap
    source = opened(fake)
    for _ in range(2):
        samples = source.collect()
        assert by_gpu(samples, "DCGM_FI_DEV_CLOCKS_EVENT_REASONS") == {"0": 0.0, "1": 4.0}
    assert source.field_errors == 0
    # The new name is tried once per GPU, then the old one is used directly.
    assert fake.count("nvmlDeviceGetCurrentClocksEventReasons") == 2
    assert fake.count("nvmlDeviceGetCurrentClocksThrottleReasons") == 4


def test_framebuffer_memory_keeps_the_drivers_reserved_part_apart() -> None:
    # As nvidia-smi and dcgm-exporter count it: an idle H200 (driver 580) read 0 MiB used, 615 MiB reserved,
    # 143,156 MiB free through nvidia-smi, where NVML's v1 call says 615 MiB used (scripts/gpu_check.py found it).
    fake = FakeNvml(gpus=1)
    gpu = fake.gpus[0]
    gpu.fb_total_bytes, gpu.fb_used_bytes, gpu.fb_reserved_bytes = 143_771 * 2**20, 0, 615 * 2**20
    samples = opened(fake).collect()
    assert by_gpu(samples, "DCGM_FI_DEV_FB_USED") == {"0": 0.0}
    assert by_gpu(samples, "DCGM_FI_DEV_FB_RESERVED") == {"0": 615.0}
    assert by_gpu(samples, "DCGM_FI_DEV_FB_FREE") == {"0": 143_156.0}


def test_framebuffer_memory_on_a_driver_without_the_v2_call() -> None:
    fake = FakeNvml(gpus=1, legacy_driver=True)
    fake.gpus[0].fb_used_bytes, fake.gpus[0].fb_reserved_bytes = 2 * GIB, 1 * GIB
    source = opened(fake)
    for _ in range(2):
        samples = source.collect()
        assert by_gpu(samples, "DCGM_FI_DEV_FB_USED") == {"0": 3 * 1024.0}  # reserved counted as used
        assert by_gpu(samples, "DCGM_FI_DEV_FB_RESERVED") == {}
    assert source.field_errors == 0
    assert fake.count("nvmlDeviceGetMemoryInfo") == 3  # the v2 call once, then the v1 call


def test_clock_reasons_use_the_new_function_when_present() -> None:
    fake = FakeNvml(gpus=1)
    fake.gpus[0].clock_reasons = 0x48
    samples = opened(fake).collect()
    assert by_gpu(samples, "DCGM_FI_DEV_CLOCKS_EVENT_REASONS") == {"0": 72.0}
    assert fake.count("nvmlDeviceGetCurrentClocksThrottleReasons") == 0


def test_unsupported_memory_temperature_omits_the_sample_and_counts_once() -> None:
    fake = FakeNvml(gpus=2)
    fake.gpus[1].memory_temp_c = None
    source = opened(fake)
    samples = source.collect()
    assert by_gpu(samples, "DCGM_FI_DEV_MEMORY_TEMP") == {"0": 45.0}
    assert by_gpu(samples, "DCGM_FI_DEV_GPU_TEMP") == {"0": 40.0, "1": 40.0}
    assert source.field_errors == 1
    # NotSupported is permanent: not asked again, not counted again.
    samples = source.collect()
    assert by_gpu(samples, "DCGM_FI_DEV_MEMORY_TEMP") == {"0": 45.0}
    assert source.field_errors == 1


def test_a_transient_field_error_skips_one_sample_and_is_retried() -> None:
    fake = FakeNvml(gpus=2)
    fake.fail("nvmlDeviceGetPowerUsage", pynvml.NVMLError_Unknown(), gpu=0)
    source = opened(fake)
    samples = source.collect()
    assert by_gpu(samples, "DCGM_FI_DEV_POWER_USAGE") == {"1": 250.0}
    assert by_gpu(samples, "DCGM_FI_DEV_POWER_MGMT_LIMIT") == {"0": 700.0, "1": 700.0}
    assert source.field_errors == 1
    fake.clear_failures()
    samples = source.collect()
    assert by_gpu(samples, "DCGM_FI_DEV_POWER_USAGE") == {"0": 250.0, "1": 250.0}
    assert source.field_errors == 1


def test_xid_events_set_the_last_value_and_accumulate_per_code() -> None:
    fake = FakeNvml(gpus=2)
    source = opened(fake)
    assert source.xid_supported == {"0": True, "1": True}
    fake.queue_xid(1, 79, 13, 79)
    samples = source.collect()
    assert by_gpu(samples, "DCGM_FI_DEV_XID_ERRORS") == {"0": 0.0, "1": 79.0}
    assert xid_totals(samples, "1") == {79: 2.0, 13: 1.0}
    assert xid_totals(samples, "0") == {}
    series = [labels for metric, labels, _ in samples if metric == XID_TOTAL]
    assert all(set(labels) == {*GPU_LABELS, "xid"} for labels in series)

    samples = source.collect()  # nothing new: values hold
    assert by_gpu(samples, "DCGM_FI_DEV_XID_ERRORS") == {"0": 0.0, "1": 79.0}
    assert xid_totals(samples, "1") == {79: 2.0, 13: 1.0}

    fake.queue_xid(1, 48)
    fake.queue_xid(0, 31)
    samples = source.collect()
    assert by_gpu(samples, "DCGM_FI_DEV_XID_ERRORS") == {"0": 31.0, "1": 48.0}
    assert xid_totals(samples, "1") == {79: 2.0, 13: 1.0, 48: 1.0}
    assert xid_totals(samples, "0") == {31: 1.0}
    assert source.field_errors == 0


@settings(max_examples=50)
@given(st.lists(st.lists(st.sampled_from([13, 31, 43, 48, 63, 79, 94, 95]), max_size=6)))
def test_xid_counters_equal_every_event_queued(batches: list[list[int]]) -> None:
    fake = FakeNvml(gpus=1)
    source = opened(fake)
    seen: list[int] = []
    for batch in batches:
        fake.queue_xid(0, *batch)
        seen += batch
        samples = source.collect()
        assert xid_totals(samples, "0") == {k: float(v) for k, v in Counter(seen).items()}
        assert by_gpu(samples, "DCGM_FI_DEV_XID_ERRORS") == {"0": float(seen[-1] if seen else 0)}


def test_xid_registration_not_supported_is_not_fatal() -> None:
    fake = FakeNvml(gpus=2)
    fake.gpus[1].xid_supported = False
    source = opened(fake)
    assert source.xid_supported == {"0": True, "1": False}
    assert len(fake.live_event_sets) == 1  # the refused set was freed
    samples = source.collect()
    assert by_gpu(samples, "DCGM_FI_DEV_XID_ERRORS") == {"0": 0.0}
    assert by_gpu(samples, "DCGM_FI_DEV_GPU_TEMP") == {"0": 40.0, "1": 40.0}
    assert source.field_errors == 0


def test_an_event_wait_error_is_counted_not_raised() -> None:
    fake = FakeNvml(gpus=2)
    source = opened(fake)
    fake.fail("nvmlEventSetWait_v2", pynvml.NVMLError_Unknown(), gpu=1)
    samples = source.collect()
    assert by_gpu(samples, "DCGM_FI_DEV_XID_ERRORS") == {"0": 0.0, "1": 0.0}
    assert source.field_errors == 1


@pytest.mark.parametrize(
    ("error", "needle"),
    [
        (pynvml.NVMLError_LibraryNotFound(), "libnvidia-ml.so"),
        (pynvml.NVMLError_DriverNotLoaded(), "driver is not loaded"),
        (pynvml.NVMLError_NoPermission(), "permission"),
    ],
)
def test_init_failure_raises_nvml_error_with_a_clear_message(error: Exception, needle: str) -> None:
    fake = FakeNvml(gpus=2)
    fake.fail("nvmlInit", error)
    source = NvmlSource(nvml=fake, hostname="h")
    with pytest.raises(NvmlError, match="NVML init failed") as info:
        source.open()
    assert needle in str(info.value)
    assert isinstance(info.value.__cause__, pynvml.NVMLError)
    source.close()
    assert fake.count("nvmlShutdown") == 0
    with pytest.raises(NvmlError, match="not open"):
        source.collect()


def test_enumeration_failure_shuts_nvml_down_again() -> None:
    fake = FakeNvml(gpus=2)
    fake.fail("nvmlDeviceGetUUID", pynvml.NVMLError_Unknown(), gpu=1)
    with pytest.raises(NvmlError, match="enumeration"):
        NvmlSource(nvml=fake, hostname="h").open()
    assert fake.refcount == 0
    assert fake.live_event_sets == []


def test_gpu_lost_during_collect_raises() -> None:
    fake = FakeNvml(gpus=2)
    source = opened(fake)
    source.collect()
    fake.gpus[1].lost = True
    with pytest.raises(NvmlError, match=r"GPU 1.*GPU is lost") as info:
        source.collect()
    assert isinstance(info.value.__cause__, pynvml.NVMLError_GpuIsLost)
    source.close()
    assert fake.refcount == 0


def test_gpu_lost_in_memory_temperature_field_raises() -> None:
    fake = FakeNvml(gpus=1)
    source = opened(fake)
    fake.fail("nvmlDeviceGetFieldValues", pynvml.NVMLError_GpuIsLost())
    with pytest.raises(NvmlError):
        source.collect()


def test_nvml_uninitialized_during_collect_raises() -> None:
    fake = FakeNvml(gpus=2)
    source = opened(fake)
    fake.refcount = 0  # someone else shut NVML down under us
    with pytest.raises(NvmlError, match="Uninitialized"):
        source.collect()


def test_close_is_idempotent_and_frees_everything() -> None:
    fake = FakeNvml(gpus=2)
    source = opened(fake)
    assert fake.refcount == 1
    assert len(fake.live_event_sets) == 2
    source.close()
    source.close()
    assert fake.count("nvmlShutdown") == 1
    assert fake.count("nvmlEventSetFree") == 2
    assert fake.refcount == 0
    assert fake.live_event_sets == []
    with pytest.raises(NvmlError):
        source.collect()
    source.open()  # reopening works
    assert fake.refcount == 1
    assert by_gpu(source.collect(), "DCGM_FI_DEV_GPU_TEMP") == {"0": 40.0, "1": 40.0}


def test_close_before_open_does_nothing() -> None:
    fake = FakeNvml(gpus=1)
    NvmlSource(nvml=fake).close()
    assert fake.calls == []


def test_hostname_defaults_to_this_host() -> None:
    fake = FakeNvml(gpus=1)
    source = NvmlSource(nvml=fake)
    source.open()
    assert {labels["Hostname"] for _, labels, _ in source.collect()} == {socket.gethostname()}


def test_real_pynvml_without_a_driver_raises_nvml_error() -> None:
    source = NvmlSource()
    try:
        source.open()
    except NvmlError as exc:
        assert "NVML" in str(exc)
        return
    source.close()
    pytest.skip("an NVIDIA driver is present here")


def test_fake_power_limit_setter_honours_constraints() -> None:
    fake = FakeNvml(gpus=2)
    fake.nvmlInit()
    handle = fake.nvmlDeviceGetHandleByIndex(1)
    assert fake.nvmlDeviceGetPowerManagementLimitConstraints(handle) == [200_000, 700_000]
    fake.nvmlDeviceSetPowerManagementLimit(handle, 450_000)
    assert fake.nvmlDeviceGetPowerManagementLimit(handle) == 450_000
    assert fake.nvmlDeviceGetEnforcedPowerLimit(handle) == 450_000
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        fake.nvmlDeviceSetPowerManagementLimit(handle, 800_000)
    assert fake.gpus[1].power_limit_mw == 450_000
    assert fake.gpus[0].power_limit_mw == 700_000
    assert fake.count("nvmlDeviceSetPowerManagementLimit") == 2
    fake.fail("nvmlDeviceSetPowerManagementLimit", pynvml.NVMLError_NoPermission())
    with pytest.raises(pynvml.NVMLError_NoPermission):
        fake.nvmlDeviceSetPowerManagementLimit(handle, 300_000)


def test_importing_the_module_does_not_import_pynvml() -> None:
    code = (
        "import sys, vllm_watchdog.sources.nvml as m; m.NvmlSource(hostname='h'); "
        "sys.exit(int('pynvml' in sys.modules))"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    result = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stderr or "pynvml was imported"
