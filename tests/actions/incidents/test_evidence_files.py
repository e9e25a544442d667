"""The bundle's data files: the target's series as OpenMetrics that the real promtool imports, the NVML
snapshot against the fake NVML (an H200's answers among them), the last XIDs and the driver's kernel lines."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from tests.support.fake_nvml import FakeNvml
from tests.support.incidents import promtool_import
from vllm_watchdog.actions.incidents import gpu, openmetrics
from vllm_watchdog.redact import MASK, Redactor
from vllm_watchdog.sources.nvmlsnapshot import snapshot
from vllm_watchdog.store import STALE_NAN, SampleStore, make_labels

pytestmark = pytest.mark.anyio
T0 = 1_700_000_000_000  # ms


def _store() -> SampleStore:
    store = SampleStore(3600)
    ours = {"job": "vllm", "instance": "127.0.0.1:8000", "target": "vllm-0"}
    for i in range(60):
        t = T0 + i * 1000
        store.append(make_labels("vllm:num_requests_running", ours), t, float(i % 3))
        store.append(make_labels("vllm:request_success_total", {**ours, "note": 'a "b"\\c\nd'}), t, float(i))
        store.append(make_labels("vllm:num_requests_running", {**ours, "target": "other"}), t, 9.0)
        store.append(make_labels("DCGM_FI_DEV_GPU_TEMP", {"gpu": "1", "job": "nvml"}), t, 50.0)
        store.append(make_labels("DCGM_FI_DEV_GPU_TEMP", {"gpu": "0", "job": "nvml"}), t, 40.0)
    store.append(make_labels("vllm:kv_cache_usage_perc", ours), T0, math.nan)
    store.append(make_labels("vllm:kv_cache_usage_perc", ours), T0 + 1000, math.inf)
    store.append(make_labels("vllm:kv_cache_usage_perc", ours), T0 + 2000, STALE_NAN)
    store.append(make_labels("vllm:secret", {**ours, "url": "http://u:hunter2hunter2@h/"}), T0, 1.0)
    return store


def test_the_target_and_its_gpus_series_import_into_promtool(tmp_path: Path) -> None:
    series, cut = openmetrics.target_series(_store(), "vllm-0", [1], T0 - 1, T0 + 59_000)
    assert not cut
    names = sorted(
        {(s.name, dict(s.labels).get("target", ""), dict(s.labels).get("gpu", "")) for s in series}
    )
    assert names == [
        ("DCGM_FI_DEV_GPU_TEMP", "", "1"),
        ("vllm:kv_cache_usage_perc", "vllm-0", ""),
        ("vllm:num_requests_running", "vllm-0", ""),
        ("vllm:request_success_total", "vllm-0", ""),
        ("vllm:secret", "vllm-0", ""),
    ]
    text = openmetrics.openmetrics(series, Redactor().text)
    lines = text.decode().splitlines()
    assert lines[-1] == "# EOF"
    assert 'note="a \\"b\\"\\\\c\\nd"' in lines[-60]  # escaped as OpenMetrics wants
    assert any(line.endswith(" NaN 1700000000.000") for line in lines)
    assert any(line.endswith(" +Inf 1700000001.000") for line in lines)
    assert not any("1700000002.000" in line and "kv_cache" in line for line in lines)  # the stale marker
    assert f'url="http://u:{MASK}@h/"' in text.decode()
    out = promtool_import(text, tmp_path / "import")
    assert "NUM SAMPLES" in out and " 183 " in out  # 60 x 3 series, NaN, +Inf and the one secret sample


def test_the_window_and_the_bounds_limit_what_is_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    series, _ = openmetrics.target_series(_store(), "vllm-0", [], T0 + 49_000, T0 + 59_000)
    assert {len(s.ts) for s in series if s.name == "vllm:num_requests_running"} == {10}
    assert "DCGM_FI_DEV_GPU_TEMP" not in {s.name for s in series}  # no GPUs named: none taken
    monkeypatch.setattr(openmetrics, "MAX_SAMPLES", 25)
    series, cut = openmetrics.target_series(_store(), "vllm-0", [], T0 - 1, T0 + 59_000)
    assert cut and sum(len(s.ts) for s in series) == 25


def test_an_h200_answers_ecc_and_remapped_rows_and_refuses_retired_pages() -> None:
    nv = FakeNvml(gpus=2)
    h200 = nv.gpus[1]
    h200.name, h200.retired_pages, h200.remapped_rows = "NVIDIA H200", None, (2, 1, True, False)
    h200.ecc_volatile, h200.ecc_aggregate, h200.clock_reasons = (3, 1), (10, 2), 0x4 | 0x40
    nv.gpus[0].retired_pages = (2, 1, True)
    snap = snapshot(nv, [1, 0])
    assert snap["driver"] == "580.159.04" and [g["index"] for g in snap["gpus"]] == [1, 0]
    one, zero = snap["gpus"]
    assert one["name"] == "NVIDIA H200" and one["temperature_c"] == 40 and one["power_w"] == 250.0
    assert one["clock_event_reasons"] == {"mask": "0x44", "names": ["sw_power_cap", "hw_thermal_slowdown"]}
    assert one["clocks_mhz"] == {"sm": 1980, "memory": 2619, "graphics": 1980}
    assert one["ecc"] == {
        "volatile": {"corrected": 3, "uncorrected": 1},
        "aggregate": {"corrected": 10, "uncorrected": 2},
    }
    assert one["remapped_rows"] == {"corrected": 2, "uncorrected": 1, "pending": True, "failure": False}
    assert "retired_pages" not in one and one["errors"] == {"retired_pages": "Not Supported"}
    assert zero["retired_pages"] == {"single_bit_ecc": 2, "double_bit_ecc": 1, "pending": True}
    assert nv.refcount == 0  # NVML shut down again


def test_a_lost_gpu_a_legacy_driver_and_no_nvml_are_recorded_not_raised() -> None:
    nv = FakeNvml(gpus=2, legacy_driver=True)
    nv.gpus[0].lost = True
    snap = snapshot(nv, [0, 1, 5])
    lost, legacy = snap["gpus"]
    assert set(lost) == {"index", "errors"} and set(lost["errors"].values()) == {"GPU is lost"}
    assert legacy["clock_event_reasons"] == {"mask": "0x0", "names": []}  # through the pre-535 name
    assert snap["error"] == "no GPU with index 5 (2 GPUs)"
    nv.fail("nvmlInit", nv.NVMLError_LibraryNotFound())
    assert snapshot(nv) == {"error": "NVML unavailable: NVML Shared Library Not Found"}


def test_the_last_xid_per_gpu_comes_from_the_store() -> None:
    store = SampleStore(3600)
    for gpu_index, values in (("0", [13.0, 79.0]), ("1", [31.0, STALE_NAN]), ("2", [48.0])):
        for i, v in enumerate(values):
            store.append(make_labels(gpu.XID_SERIES, {"gpu": gpu_index}), T0 + i, v)
    assert gpu.last_xids(store, []) == {"0": 79, "2": 48}
    assert gpu.last_xids(store, [2]) == {"2": 48}


async def test_the_driver_lines_of_the_kernel_log_are_kept_bounded(tmp_path: Path) -> None:
    dmesg = tmp_path / "dmesg"
    dmesg.write_text(
        "#!/bin/sh\nfor i in $(seq 1 500); do\n"
        '  echo "[ $i.0] NVRM: Xid (PCI:0000:00:06): 79, pid=$i, GPU has fallen off the bus."\n'
        '  echo "[ $i.1] eth0: link up"\ndone\n'
    )
    dmesg.chmod(0o755)
    lines = await gpu.driver_lines([str(dmesg)], last=3)
    assert [line.split("pid=")[1].split(",")[0] for line in lines] == ["498", "499", "500"]
    refused = tmp_path / "refused"
    refused.write_text(
        "#!/bin/sh\necho 'dmesg: read kernel buffer failed: Operation not permitted' >&2\nexit 1\n"
    )
    refused.chmod(0o755)
    with pytest.raises(RuntimeError, match="Operation not permitted"):
        await gpu.driver_lines([str(refused)])
    assert json.loads(json.dumps(lines)) == lines
