"""Checks the watchdog's NVML code on a real GPU against the driver's own tool, nvidia-smi.

Usage: python3 scripts/gpu_check.py [--rounds N] [--set-power-limit] [--step W]

Runs from a checkout with only the standard library and the `pynvml` module (nvidia-ml-py) importable: the
package is loaded from `watchdog/` as `vllm_watchdog`, so nothing else needs installing on the GPU host.
It opens NVML through `sources/nvml.py` exactly as the daemon does and checks, per GPU:

- every series the source reads against `nvidia-smi --query-gpu` read right after it (N rounds; a field
  passes when one round agrees within its tolerance: power and clocks move between two reads);
- the clocks-event (throttle) reasons, decoded by name, against nvidia-smi's mask;
- the XID event path: events registered, drained without error, and the `NVRM: Xid` lines the kernel log
  holds (what an incident bundle would keep);
- the power-limit range through `runtimes/power.py`, and with --set-power-limit (root) a real change: the
  limit lowered by --step watts, read back by NVML and by nvidia-smi, then restored (also on failure);
- the GPU part of an incident bundle as the watchdog collects it before a restart: the NVML snapshot of
  `sources/nvmlsnapshot.py` (clocks and reasons, power, temperature, ECC, retired pages, remapped rows; a
  field the GPU does not support is named, any other refusal fails the check), its volatile ECC counts
  against nvidia-smi's, and the driver's kernel log lines read by `actions/incidents/gpu.py`.

Prints a report and exits 0 when every check passed, 1 when one failed, 2 when NVML cannot be opened.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
SMI_FIELDS = (
    "index",
    "temperature.gpu",
    "power.draw",
    "power.limit",
    "enforced.power.limit",
    "utilization.gpu",
    "memory.used",
    "memory.free",
    "clocks.sm",
    "clocks_event_reasons.active",
)
LEGACY_REASONS = "clocks_throttle_reasons.active"  # the same field before driver 535
# NVML series -> (nvidia-smi field, absolute tolerance, relative tolerance)
COMPARED = {
    "DCGM_FI_DEV_GPU_TEMP": ("temperature.gpu", 3.0, 0.0),
    "DCGM_FI_DEV_POWER_USAGE": ("power.draw", 30.0, 0.15),
    "DCGM_FI_DEV_POWER_MGMT_LIMIT": ("power.limit", 0.5, 0.0),
    "DCGM_FI_DEV_ENFORCED_POWER_LIMIT": ("enforced.power.limit", 0.5, 0.0),
    "DCGM_FI_DEV_GPU_UTIL": ("utilization.gpu", 20.0, 0.0),
    "DCGM_FI_DEV_FB_USED": ("memory.used", 64.0, 0.0),
    "DCGM_FI_DEV_FB_FREE": ("memory.free", 64.0, 0.0),
    "DCGM_FI_DEV_SM_CLOCK": ("clocks.sm", 100.0, 0.15),
    "DCGM_FI_DEV_CLOCKS_EVENT_REASONS": ("clocks_event_reasons.active", 0.0, 0.0),
}
Runner = Callable[[Sequence[str]], str]


def load_package() -> None:
    """Import watchdog/ as vllm_watchdog without installing it (a no-op where it is installed)."""
    if "vllm_watchdog" in sys.modules:
        return
    package = ROOT / "watchdog"
    spec = importlib.util.spec_from_file_location(
        "vllm_watchdog", package / "__init__.py", submodule_search_locations=[str(package)]
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["vllm_watchdog"] = module
    spec.loader.exec_module(module)


def run_command(argv: Sequence[str]) -> str:
    """Run a command, return its stdout; raise with its stderr when it fails."""
    done = subprocess.run(list(argv), capture_output=True, text=True, timeout=30, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{argv[0]} exited {done.returncode}: {done.stderr.strip()[:300]}")
    return done.stdout


def smi_rows(run: Runner) -> dict[int, dict[str, str]]:
    """nvidia-smi's readings of SMI_FIELDS per GPU index (the legacy reasons field on older drivers)."""
    fields = list(SMI_FIELDS)
    try:
        text = run(["nvidia-smi", f"--query-gpu={','.join(fields)}", "--format=csv,noheader,nounits"])
    except RuntimeError:
        fields[-1] = LEGACY_REASONS
        text = run(["nvidia-smi", f"--query-gpu={','.join(fields)}", "--format=csv,noheader,nounits"])
    rows: dict[int, dict[str, str]] = {}
    for line in text.strip().splitlines():
        values = [v.strip() for v in line.split(",")]
        row = dict(zip(SMI_FIELDS, values, strict=True))
        rows[int(row["index"])] = row
    return rows


def smi_number(text: str) -> float | None:
    """A reading as a number: hex masks too; None for [N/A] and the like."""
    try:
        return float(int(text, 16)) if text.lower().startswith("0x") else float(text)
    except ValueError:
        return None


@dataclass(frozen=True)
class Finding:
    """One compared reading."""

    gpu: int
    series: str
    nvml: float
    smi: float | None
    ok: bool

    def line(self) -> str:
        """The report line."""
        smi = "n/a" if self.smi is None else f"{self.smi:g}"
        verdict = "ok" if self.ok else "DIFF"
        return f"  gpu {self.gpu} {self.series:34} nvml {self.nvml:<10g} smi {smi:<10} {verdict}"


def agrees(nvml: float, smi: float | None, absolute: float, relative: float) -> bool:
    """Within tolerance; a reading nvidia-smi does not have (n/a) cannot be compared and passes."""
    return smi is None or abs(nvml - smi) <= max(absolute, relative * max(abs(nvml), abs(smi)))


def compare(
    samples: Sequence[tuple[str, dict[str, str], float]], rows: dict[int, dict[str, str]]
) -> list[Finding]:
    """Each compared NVML series against nvidia-smi's reading of the same GPU."""
    found = []
    for name, labels, value in samples:
        if name not in COMPARED:
            continue
        field, absolute, relative = COMPARED[name]
        gpu = int(labels["gpu"])
        smi = smi_number(rows.get(gpu, {}).get(field, ""))
        found.append(Finding(gpu, name, value, smi, agrees(value, smi, absolute, relative)))
    return found


def readings(source: Any, run: Runner, rounds: int, sleep: Callable[[float], None]) -> tuple[list[str], bool]:
    """N rounds of NVML then nvidia-smi; each (gpu, series) must agree in at least one round."""
    lines: list[str] = []
    best: dict[tuple[int, str], Finding] = {}
    for n in range(rounds):
        samples = source.collect()
        findings = compare(samples, smi_rows(run))
        lines.append(f"round {n + 1}: {len(samples)} series from NVML")
        lines.extend(f.line() for f in findings)
        for f in findings:
            if (f.gpu, f.series) not in best or f.ok:
                best[(f.gpu, f.series)] = f
        if not samples:
            return [*lines, "FAIL: an empty sample"], False
        if n + 1 < rounds:
            sleep(1.0)
    failed = [f for f in best.values() if not f.ok]
    lines.extend(f"FAIL: {f.series} on gpu {f.gpu} never agreed with nvidia-smi" for f in failed)
    return lines, not failed


def reasons_report(samples: Sequence[tuple[str, dict[str, str], float]]) -> list[str]:
    """The clocks-event reasons of each GPU, by name."""
    from vllm_watchdog.sources.clockreasons import describe  # noqa: PLC0415 - after load_package

    lines = []
    for name, labels, value in samples:
        if name == "DCGM_FI_DEV_CLOCKS_EVENT_REASONS":
            names = ", ".join(describe(int(value))) or "none"
            lines.append(f"gpu {labels['gpu']}: clocks-event reasons {int(value):#x} = {names}")
    return lines


def xid_report(source: Any, samples: Sequence[tuple[str, dict[str, str], float]], run: Runner) -> list[str]:
    """Whether XID events are registered per GPU, what was drained, and the kernel log's Xid lines."""
    lines = [f"XID events registered: {source.xid_supported}"]
    lines += [
        f"gpu {labels['gpu']}: last XID {value:g} (events drained without error)"
        for name, labels, value in samples
        if name == "DCGM_FI_DEV_XID_ERRORS"
    ]
    try:
        xids = [line for line in run(["dmesg"]).splitlines() if "NVRM: Xid" in line]
        lines.append(
            f"kernel log: {len(xids)} 'NVRM: Xid' lines" + (f", last: {xids[-1].strip()}" if xids else "")
        )
    except (RuntimeError, OSError) as exc:
        lines.append(f"kernel log not readable: {exc}")
    return lines


def power_report(limiter: Any, run: Runner, index: int, change: bool, step: float) -> tuple[list[str], bool]:
    """The limit and its range; with `change`, lower it by `step` W, read it back twice, restore it."""
    original = limiter.current(index)
    low, high = limiter.constraints(index)
    default = limiter.default(index)
    lines = [f"gpu {index}: power limit {original:g} W (default {default:g} W, allowed {low:g}-{high:g} W)"]
    if not change:
        return lines, True
    target = max(low, original - step)
    if target >= original:
        return [*lines, f"gpu {index}: already at its lowest limit, nothing to lower"], True
    ok = True
    try:
        applied = limiter.set_limit(index, target)
        nvml_now = limiter.current(index)
        smi_now = smi_number(smi_rows(run).get(index, {}).get("power.limit", ""))
        ok = abs(nvml_now - applied) < 0.5 and smi_now is not None and abs(smi_now - applied) < 0.5
        lines.append(
            f"gpu {index}: lowered to {applied:g} W; NVML reads {nvml_now:g} W, nvidia-smi {smi_now} W"
        )
    finally:
        restored = limiter.restore(index, original)
        back = limiter.current(index)
        lines.append(f"gpu {index}: restored to {restored:g} W; NVML reads {back:g} W")
    ok = ok and abs(back - original) < 0.5
    return lines + ([] if ok else [f"FAIL: gpu {index}: the power limit did not read back as set"]), ok


SMI_ECC = ("index", "ecc.errors.corrected.volatile.total", "ecc.errors.uncorrected.volatile.total")
SNAPSHOT_SHOWN = ("name", "pstate", "temperature_c", "power_w", "clocks_mhz", "clock_event_reasons", "ecc")
SNAPSHOT_SHOWN += ("retired_pages", "remapped_rows")


def incident_report(nvml: Any, run: Runner, dmesg: Sequence[str] = ("dmesg",)) -> tuple[list[str], bool]:
    """The GPU evidence an incident bundle keeps, collected by the watchdog's own code, and checked."""
    from vllm_watchdog.actions.incidents.gpu import XID_MARK, driver_lines  # noqa: PLC0415
    from vllm_watchdog.sources.nvmlsnapshot import snapshot  # noqa: PLC0415

    snap = snapshot(nvml)
    if "gpus" not in snap:
        return [f"FAIL: incident snapshot: {snap.get('error')}"], False
    lines, ok = [f"incident snapshot: driver {snap.get('driver')}, {len(snap['gpus'])} GPU(s)"], True
    try:
        text = run(["nvidia-smi", f"--query-gpu={','.join(SMI_ECC)}", "--format=csv,noheader,nounits"])
        smi = {int(r[0]): r[1:] for r in (line.split(", ") for line in text.strip().splitlines())}
    except (RuntimeError, ValueError, IndexError) as exc:
        smi = {}
        lines.append(f"nvidia-smi gives no ECC counts to compare: {exc}")
    for gpu in snap["gpus"]:
        index, refused = gpu["index"], gpu.get("errors") or {}
        shown = {key: gpu[key] for key in SNAPSHOT_SHOWN if key in gpu}
        lines.append(f"gpu {index}: {json.dumps(shown, sort_keys=True)}")
        lines.append(f"gpu {index}: not supported here: {', '.join(sorted(refused)) or 'nothing'}")
        hard = {k: v for k, v in refused.items() if "Not Supported" not in v}
        if hard:
            lines.append(f"FAIL: gpu {index}: NVML refused {hard}")
            ok = False
        volatile = (gpu.get("ecc") or {}).get("volatile")
        said = [smi_number(v) for v in smi.get(index, [])]
        if volatile and len(said) == 2 and None not in said:
            agrees = [volatile["corrected"], volatile["uncorrected"]] == said
            verdict = "ok" if agrees else "DIFF"
            lines.append(f"gpu {index}: ECC volatile {volatile} vs nvidia-smi {said}: {verdict}")
            ok = ok and agrees
    try:
        kernel = asyncio.run(driver_lines(list(dmesg)))
        xids = [line for line in kernel if XID_MARK in line]
        lines.append(f"incident kernel lines: {len(kernel)} NVIDIA driver lines, {len(xids)} Xid")
    except (OSError, RuntimeError) as exc:
        lines.append(f"incident kernel lines not readable (recorded as such in a bundle): {exc}")
    return lines, ok


def check(
    nvml: Any,
    run: Runner,
    rounds: int,
    change_power: bool,
    step: float,
    sleep: Callable[[float], None],
    dmesg: Sequence[str] = ("dmesg",),
) -> int:
    """The whole check, printed; the exit status."""
    from vllm_watchdog.actions.runtimes.power import PowerLimiter  # noqa: PLC0415 - after load_package
    from vllm_watchdog.sources.nvml import NvmlSource  # noqa: PLC0415

    source = NvmlSource(nvml, hostname="gpu-check")
    try:
        source.open()
    except Exception as exc:  # the report is the point: say what failed
        print(f"FAIL: NVML could not be opened: {exc}")
        return 2
    count = nvml.nvmlDeviceGetCount()
    print(f"driver {nvml.nvmlSystemGetDriverVersion()}, {count} GPU(s)")
    lines, ok = readings(source, run, rounds, sleep)
    samples = source.collect()
    lines += reasons_report(samples) + xid_report(source, samples, run)
    lines.append(f"fields the driver refused (counted, not fatal): {source.field_errors}")
    source.close()
    incident_lines, incident_ok = incident_report(nvml, run, dmesg)
    lines += incident_lines
    ok = ok and incident_ok
    limiter = PowerLimiter(nvml)
    try:
        for index in range(count):
            power_lines, power_ok = power_report(limiter, run, index, change_power, step)
            lines += power_lines
            ok = ok and power_ok
    except Exception as exc:  # a refused call is a failed check, reported
        lines.append(f"FAIL: power limit: {exc}")
        ok = False
    finally:
        limiter.close()
    print("\n".join([*lines, "PASS" if ok else "FAIL"]))
    return 0 if ok else 1


def main() -> int:
    """Parse the arguments, load the package and pynvml, check."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument(
        "--set-power-limit", action="store_true", help="lower each limit by --step W, then restore"
    )
    ap.add_argument("--step", type=float, default=50.0)
    args = ap.parse_args()
    if shutil.which("nvidia-smi") is None:
        print("FAIL: nvidia-smi is not on PATH (the check compares against it)")
        return 2
    load_package()
    import pynvml  # noqa: PLC0415 - only here: gpu-check.sh says where to get it

    print(f"pynvml {getattr(pynvml, '__version__', '?')} from {pynvml.__file__}")
    return check(pynvml, run_command, max(1, args.rounds), args.set_power_limit, args.step, time.sleep)


if __name__ == "__main__":
    sys.exit(main())
