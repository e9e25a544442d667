"""Benchmark: wall time of the commands users wait on, next to promtool's equivalent, measured in one run.

Usage: python bench/startup.py [-n RUNS] [--promtool PATH]

Each command runs as a fresh process (the console script beside this interpreter, else `python -m
vllm_watchdog`) RUNS times after one warm-up run; prints the median wall time (and CPU time, user + system,
which a loaded machine inflates less) of ours and of promtool's equivalent, and the ratio of the wall times:

  --version                            vs  promtool --version
  check --config deploy/watchdog.yml   vs  promtool check rules rules/*.rules.yml
  test-rules rules/tests/X.test.yml    vs  promtool test rules rules/tests/X.test.yml (each file)

and, for scale, `python -c "import vllm_watchdog.cli"` against `python -c pass`. Bytecode is cached (under a
temporary PYTHONPYCACHEPREFIX, even where PYTHONDONTWRITEBYTECODE is set) as an installed package has it,
so no run pays for compiling the package. Nothing is asserted. The goal: `--version` and `check` under 0.3 s,
`test-rules` (CI runs it once per file) no slower than promtool.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CONFIG = ROOT / "deploy" / "watchdog.yml"


def ours() -> list[str]:
    """How a user starts vllm-watchdog: the console script if installed beside this interpreter."""
    script = Path(sys.executable).parent / "vllm-watchdog"
    return [str(script)] if script.exists() else [sys.executable, "-m", "vllm_watchdog"]


def median_seconds(cmd: list[str], runs: int, env: dict[str, str]) -> tuple[float, float]:
    """Median wall and CPU seconds of `cmd` over `runs` runs after a warm-up; exits if it fails."""
    walls, cpus = [], []
    for i in range(runs + 1):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        start = time.perf_counter()
        out = subprocess.run(cmd, check=False, cwd=ROOT, env=env, capture_output=True, text=True)
        wall = time.perf_counter() - start
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        if out.returncode != 0:  # a failing command measures nothing
            sys.exit(f"{' '.join(cmd)}: exit {out.returncode}\n{out.stdout}{out.stderr}")
        if i > 0:
            walls.append(wall)
            cpus.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
    return statistics.median(walls), statistics.median(cpus)


def pairs(promtool: str | None) -> list[tuple[str, list[str], list[str] | None]]:
    """(label, our command, promtool's equivalent or None without promtool) for each measured command."""
    me = ours()
    rule_files = [str(p.relative_to(ROOT)) for p in sorted((ROOT / "rules").glob("*.rules.yml"))]
    rows = [("--version", [*me, "--version"], ["--version"])]
    rows.append(
        ("check", [*me, "check", "--config", str(CONFIG.relative_to(ROOT))], ["check", "rules", *rule_files])
    )
    for test in sorted((ROOT / "rules" / "tests").glob("*.test.yml")):
        rel = str(test.relative_to(ROOT))
        rows.append((f"test-rules {test.name}", [*me, "test-rules", rel], ["test", "rules", rel]))
    return [(label, mine, [promtool, *theirs] if promtool else None) for label, mine, theirs in rows]


def main() -> None:
    """Parse arguments and measure."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-n", "--runs", type=int, default=10)
    ap.add_argument("--promtool", default=shutil.which("promtool"), help="promtool binary (default: on PATH)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="startup-pycache-") as pycache:
        env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
        env["PYTHONPYCACHEPREFIX"] = pycache
        # deploy/watchdog.yml reads its API token from the environment; any value validates.
        env.setdefault("VLLM_WATCHDOG_TOKEN", "bench")
        print(f"median of {args.runs} runs; promtool: {args.promtool or 'not found'}; load {os.getloadavg()}")
        print(f"{'command':34s} {'ours':>9s} {'(cpu)':>9s} {'promtool':>9s} {'(cpu)':>9s} {'ratio':>7s}")
        for label, mine, theirs in pairs(args.promtool):
            wall, cpu = median_seconds(mine, args.runs, env)
            row = f"{label:34s} {wall * 1000:7.0f}ms {cpu * 1000:7.0f}ms"
            if theirs:
                ref_wall, ref_cpu = median_seconds(theirs, args.runs, env)
                row += f" {ref_wall * 1000:7.0f}ms {ref_cpu * 1000:7.0f}ms {wall / ref_wall:6.1f}x"
            print(row, flush=True)
        for label, code in (
            ("import vllm_watchdog.cli", "import vllm_watchdog.cli"),
            ("python -c pass", "pass"),
        ):
            wall, cpu = median_seconds([sys.executable, "-c", code], args.runs, env)
            print(f"{label:34s} {wall * 1000:7.0f}ms {cpu * 1000:7.0f}ms")


if __name__ == "__main__":
    main()
