"""Checks the watchdog's NVML code on a real GPU: what it reads, what the driver refuses, the power limits.

Usage: python3 scripts/gpu_check.py [--samples N] [--set-power-limit]

Runs from a checkout with only the standard library and the `pynvml` module (nvidia-ml-py) importable: the
package is loaded from `watchdog/` as `vllm_watchdog`, so nothing else needs installing on the GPU host. It
opens NVML through `sources/nvml.py` exactly as the daemon does, collects N samples a second apart (every
DCGM-named series, XID event support), reads the power-limit constraints through `actions/power.py`, and,
only with --set-power-limit (root), sets the current limit again (a no-op change) to show the call works.
Prints a report; exits 1 if NVML cannot be opened or a sample is empty.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def load_package() -> None:
    """Import watchdog/ as vllm_watchdog without installing it."""
    package = ROOT / "watchdog"
    spec = importlib.util.spec_from_file_location(
        "vllm_watchdog", package / "__init__.py", submodule_search_locations=[str(package)]
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["vllm_watchdog"] = module
    spec.loader.exec_module(module)


def main() -> int:
    """Open, sample, report."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--samples", type=int, default=3)
    ap.add_argument("--set-power-limit", action="store_true")
    args = ap.parse_args()
    load_package()
    import pynvml  # noqa: PLC0415 - only here: the message below says where to get it

    from vllm_watchdog.actions.power import PowerLimiter  # noqa: PLC0415
    from vllm_watchdog.sources.nvml import NvmlSource  # noqa: PLC0415

    print(f"pynvml {getattr(pynvml, '__version__', '?')} from {pynvml.__file__}")
    source = NvmlSource(pynvml, hostname="gpu-check")
    try:
        source.open()
    except Exception as exc:  # the report is the point: say what failed
        print(f"FAIL: NVML could not be opened: {exc}")
        return 1
    count = pynvml.nvmlDeviceGetCount()
    print(f"driver {pynvml.nvmlSystemGetDriverVersion()}, {count} GPU(s)")
    print(f"XID events supported: {json.dumps(source.xid_supported)}")
    ok = True
    for n in range(args.samples):
        samples = source.collect()
        print(f"sample {n + 1}: {len(samples)} series")
        for name, labels, value in samples:
            print(f"  {name}{{gpu={labels.get('gpu')},modelName={labels.get('modelName')!r}}} {value:g}")
        ok = ok and bool(samples)
        time.sleep(1.0)
    print(f"fields the driver refused (counted, not fatal): {source.field_errors}")
    source.close()
    limiter = PowerLimiter(pynvml)
    for index in range(count):
        try:
            low, high = limiter.constraints(index)
            print(
                f"gpu {index}: power limit {limiter.current(index):g} W "
                f"(default {limiter.default(index):g} W, allowed {low:g}-{high:g} W)"
            )
            if args.set_power_limit:
                print(f"gpu {index}: set again to {limiter.set_limit(index, limiter.current(index)):g} W")
        except Exception as exc:  # a refused call is part of the report
            print(f"gpu {index}: power limit: {exc}")
    limiter.close()
    print("PASS" if ok else "FAIL: an empty sample")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
