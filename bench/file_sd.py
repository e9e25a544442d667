"""Micro-benchmark: reading file_sd files (vllm_watchdog.discovery) against json.loads of the same text.

Usage: python bench/file_sd.py [-n RUNS]

Prints the median time to turn a file into targets for a typical file (64 servers, one group each with a
name, a container and two labels) in JSON and in YAML, for a file of the largest size accepted (1 MiB of
addresses in one group, refused as over max_targets), and for an unchanged look (a stat of each file), each
with its ratio to json.loads of the same text, the anchor measured in the same run.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from vllm_watchdog.discovery.config import FileSdConfig
from vllm_watchdog.discovery.files import FileDiscovery
from vllm_watchdog.discovery.targetgroups import MAX_FILE_BYTES, parse_groups

SD = FileSdConfig(name="file_sd_configs[0]", files=("/bench/*.json",), runtimes=frozenset({"docker"}))


def typical(n: int = 64) -> list[dict[str, object]]:
    """n servers on one host, as a deployment tool would list them."""
    return [
        {
            "targets": [f"127.0.0.1:{8000 + i}"],
            "labels": {
                "__watchdog_target__": f"gpu-{i}",
                "__watchdog_container__": f"vllm-{i}",
                "model": "m",
            },
        }
        for i in range(n)
    ]


def yaml_text(groups: list[dict[str, object]]) -> str:
    return "".join(f"- {json.dumps(g)}\n" for g in groups)


def largest() -> str:
    addresses = [f"127.0.0.1:{10000 + i % 50000}" for i in range(MAX_FILE_BYTES // 20)]
    while len(json.dumps([{"targets": addresses}])) > MAX_FILE_BYTES:
        addresses = addresses[:-1000]
    return json.dumps([{"targets": addresses}])


def median(fn: Callable[[], object], runs: int) -> float:
    times = []
    for _ in range(runs):
        began = time.perf_counter()
        fn()
        times.append(time.perf_counter() - began)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", "--runs", type=int, default=7)
    runs = parser.parse_args().runs
    big = largest()
    cases = {  # the text, its path, and the JSON the anchor reads (the same groups)
        "typical JSON (64 targets)": (json.dumps(typical()), "/bench/a.json", json.dumps(typical())),
        "typical YAML (64 targets)": (yaml_text(typical()), "/bench/a.yml", json.dumps(typical())),
        "largest JSON (1 MiB, refused)": (big, "/bench/b.json", big),
        "largest YAML (1 MiB, refused)": ("- " + big[1:-1], "/bench/b.yml", big),
    }
    print(f"{'case':34} {'bytes':>9} {'json.loads':>12} {'file_sd':>12} {'ratio':>7}")
    for name, (text, path, same) in cases.items():
        anchor = median(lambda same=same: json.loads(same), runs)  # type: ignore[misc]
        ours = median(lambda text=text, path=path: parse_groups(text, path, SD), runs)  # type: ignore[misc]
        print(
            f"{name:34} {len(text):>9} {anchor * 1e3:>10.2f}ms {ours * 1e3:>10.2f}ms {ours / anchor:>6.0f}x"
        )
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(8):
            (Path(tmp) / f"{i}.json").write_text(json.dumps(typical(8)))
        looker = FileDiscovery(replace(SD, files=(f"{tmp}/*.json",)), time.time)
        time.sleep(2.1)  # past the racy window: the next looks only stat
        looker.refresh()
        unchanged = median(looker.refresh, runs)
        anchor = median(lambda: json.loads((Path(tmp) / "0.json").read_text()), runs)
        print(f"{'unchanged look (8 files)':34} {'':>9} {anchor * 1e3:>10.2f}ms {unchanged * 1e3:>10.2f}ms")


if __name__ == "__main__":
    main()
