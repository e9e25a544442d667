"""scripts/gpu_check.py, the check an operator runs on a GPU host, against the fake NVML and a fake nvidia-smi.

The real run is on a GPU (the closing notes hold its output); here the check must be able to fail: readings
that disagree, a power limit that does not stick, and it must restore the limit whatever happened.
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from types import ModuleType

import pytest

from tests.support.fake_nvml import FakeNvml

ROOT = Path(__file__).resolve().parents[2]


def load_script() -> ModuleType:
    """scripts/gpu_check.py as a module (scripts/ is not a package)."""
    spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "scripts" / "gpu_check.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("gpu_check", module)
    spec.loader.exec_module(module)
    return module


gpu_check = load_script()


def fake_smi(
    nvml: FakeNvml, *, legacy: bool = False, skew_temp: int = 0, xid_lines: int = 0, ecc_skew: int = 0
) -> Callable[[Sequence[str]], str]:
    """What nvidia-smi would print for the fake GPUs (csv, no header, no units), and a dmesg."""

    def run(argv: Sequence[str]) -> str:
        if argv[0] == "dmesg":
            return "".join(
                "[ 1.0] NVRM: Xid (PCI:0000:00:06): 79, GPU has fallen off the bus\n"
                for _ in range(xid_lines)
            )
        query = argv[1].removeprefix("--query-gpu=").split(",")
        if legacy and "clocks_event_reasons.active" in query:
            raise RuntimeError(
                'nvidia-smi exited 2: Field "clocks_event_reasons.active" is not a valid field'
            )
        rows = []
        for g in nvml.gpus:
            values = {
                "index": g.index,
                "temperature.gpu": g.temperature_c + skew_temp,
                "power.draw": f"{g.power_mw / 1000:.2f}",
                "power.limit": f"{g.power_limit_mw / 1000:.2f}",
                "enforced.power.limit": f"{g.enforced_limit_mw / 1000:.2f}",
                "utilization.gpu": g.util_gpu,
                "memory.used": g.fb_used_bytes // 2**20,
                "memory.free": (g.fb_total_bytes - g.fb_used_bytes) // 2**20,
                "clocks.sm": g.sm_clock_mhz,
                "clocks_event_reasons.active": f"0x{g.clock_reasons:016x}",
                "clocks_throttle_reasons.active": f"0x{g.clock_reasons:016x}",
                "ecc.errors.corrected.volatile.total": g.ecc_volatile[0] + ecc_skew,
                "ecc.errors.uncorrected.volatile.total": g.ecc_volatile[1],
            }
            rows.append(", ".join(str(values[f]) for f in query))
        return "\n".join(rows) + "\n"

    return run


def test_agreeing_readings_and_a_power_change_pass(capsys: pytest.CaptureFixture[str]) -> None:
    nvml = FakeNvml(gpus=2)
    nvml.gpus[1].clock_reasons = 0x4 | 0x1
    status = gpu_check.check(nvml, fake_smi(nvml, xid_lines=2), 2, True, 50.0, lambda _s: None)
    out = capsys.readouterr().out
    assert status == 0, out
    assert "gpu 1: clocks-event reasons 0x5 = gpu_idle, sw_power_cap" in out
    assert "gpu 0: lowered to 650 W; NVML reads 650 W, nvidia-smi 650.0 W" in out
    assert "kernel log: 2 'NVRM: Xid' lines, last: [ 1.0] NVRM: Xid (PCI:0000:00:06): 79" in out
    assert [g.power_limit_mw for g in nvml.gpus] == [700_000, 700_000]  # restored
    assert out.rstrip().endswith("PASS")


def fake_dmesg(tmp_path: Path, lines: int) -> list[str]:
    """A dmesg with `lines` Xid lines among others (what actions/incidents/gpu.py runs)."""
    script = tmp_path / "dmesg"
    xid = "[ 2.0] NVRM: Xid (PCI:0000:00:06): 79, GPU has fallen off the bus."
    script.write_text(
        "#!/bin/sh\necho '[ 1.0] NVRM: loading NVIDIA UNIX driver'\n" + f"echo '{xid}'\n" * lines
    )
    script.chmod(0o755)
    return [str(script)]


def test_the_incident_snapshot_names_what_an_h200_does_not_support_and_checks_ecc(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    nvml = FakeNvml(gpus=2)
    nvml.gpus[1].name, nvml.gpus[1].retired_pages, nvml.gpus[1].ecc_volatile = "NVIDIA H200", None, (4, 1)
    smi = fake_smi(nvml)
    assert gpu_check.check(nvml, smi, 1, False, 50.0, lambda _s: None, fake_dmesg(tmp_path, 2)) == 0
    out = capsys.readouterr().out
    assert "incident snapshot: driver 580.159.04, 2 GPU(s)" in out
    assert "gpu 1: not supported here: retired_pages" in out and "gpu 0: not supported here: nothing" in out
    assert "gpu 1: ECC volatile {'corrected': 4, 'uncorrected': 1} vs nvidia-smi [4.0, 1.0]: ok" in out
    assert "incident kernel lines: 3 NVIDIA driver lines, 2 Xid" in out
    assert out.rstrip().endswith("PASS")


def test_an_incident_snapshot_that_disagrees_or_is_refused_fails(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    nvml = FakeNvml(gpus=1)
    assert gpu_check.check(nvml, fake_smi(nvml, ecc_skew=1), 1, False, 50.0, lambda _s: None) == 1
    assert "gpu 0: ECC volatile" in capsys.readouterr().out
    nvml.fail("nvmlDeviceGetRemappedRows", nvml.NVMLError_NoPermission())
    dmesg = [str(tmp_path / "no-dmesg")]
    assert gpu_check.check(nvml, fake_smi(nvml), 1, False, 50.0, lambda _s: None, dmesg) == 1
    out = capsys.readouterr().out
    assert "FAIL: gpu 0: NVML refused {'remapped_rows': 'Insufficient Permissions'}" in out
    assert "incident kernel lines not readable (recorded as such in a bundle)" in out


def test_a_reading_that_never_agrees_fails(capsys: pytest.CaptureFixture[str]) -> None:
    nvml = FakeNvml(gpus=1)
    status = gpu_check.check(nvml, fake_smi(nvml, skew_temp=10), 3, False, 50.0, lambda _s: None)
    out = capsys.readouterr().out
    assert status == 1
    assert "FAIL: DCGM_FI_DEV_GPU_TEMP on gpu 0 never agreed with nvidia-smi" in out


def test_an_older_driver_is_asked_for_the_legacy_reasons_field(capsys: pytest.CaptureFixture[str]) -> None:
    nvml = FakeNvml(gpus=1)
    assert gpu_check.check(nvml, fake_smi(nvml, legacy=True), 1, False, 50.0, lambda _s: None) == 0, (
        capsys.readouterr().out
    )


def test_a_limit_that_does_not_stick_fails_and_is_restored(capsys: pytest.CaptureFixture[str]) -> None:
    nvml = FakeNvml(gpus=1)
    real_set = nvml.nvmlDeviceSetPowerManagementLimit
    calls: list[int] = []

    def half_set(handle: object, limit: int) -> None:
        calls.append(limit)
        if len(calls) == 1:
            nvml.gpus[0].power_limit_mw = limit  # NVML says it took, the driver enforces something else
            return
        real_set(handle, limit)  # type: ignore[arg-type]

    nvml.nvmlDeviceSetPowerManagementLimit = half_set  # type: ignore[method-assign]
    smi = fake_smi(nvml)

    def smi_lagging(argv: Sequence[str]) -> str:
        text = smi(argv)
        return text.replace("650.00", "700.00") if argv[0] == "nvidia-smi" else text

    status = gpu_check.check(nvml, smi_lagging, 1, True, 50.0, lambda _s: None)
    out = capsys.readouterr().out
    assert status == 1
    assert "FAIL: gpu 0: the power limit did not read back as set" in out
    assert calls == [650_000, 700_000] and nvml.gpus[0].power_limit_mw == 700_000


def test_nvml_that_cannot_open_is_its_own_exit_status(capsys: pytest.CaptureFixture[str]) -> None:
    nvml = FakeNvml(gpus=1)
    nvml.fail("nvmlInit", nvml.NVMLError_DriverNotLoaded())
    assert gpu_check.check(nvml, fake_smi(nvml), 1, False, 50.0, lambda _s: None) == 2
    assert "FAIL: NVML could not be opened" in capsys.readouterr().out
