"""Benchmark: wall time of the commands users wait on, next to promtool's equivalent, measured in one run.

Usage: python bench/startup.py [-n RUNS] [--promtool PATH]

Each command runs as a fresh process (the console script beside this interpreter, else `python -m
vllm_watchdog`) RUNS times; prints the median wall time of ours and of promtool's equivalent, and their ratio:

  --version                            vs  promtool --version
  check --config deploy/watchdog.yml   vs  promtool check rules rules/*.rules.yml
  test-rules rules/tests/X.test.yml    vs  promtool test rules rules/tests/X.test.yml (each file)

and, for scale, `python -c "import vllm_watchdog.cli"` against `python -c pass`. Nothing is asserted: CI loops
over `test-rules` per file, so the number to watch is the first column; the goal is under 0.3 s each.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CONFIG = ROOT / "deploy" / "watchdog.yml"


def ours() -> list[str]:
    """How a user starts vllm-watchdog: the console script if installed beside this interpreter."""
    script = Path(sys.executable).parent / "vllm-watchdog"
    return [str(script)] if script.exists() else [sys.executable, "-m", "vllm_watchdog"]


def median_seconds(cmd: list[str], runs: int, env: dict[str, str]) -> float:
    """Median wall time of `cmd` over `runs` runs; exits if it fails (a failing command measures nothing)."""
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        out = subprocess.run(cmd, check=False, cwd=ROOT, env=env, capture_output=True, text=True)
        times.append(time.perf_counter() - start)
        if out.returncode != 0:
            sys.exit(f"{' '.join(cmd)}: exit {out.returncode}\n{out.stdout}{out.stderr}")
    return statistics.median(times)


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
    # deploy/watchdog.yml reads its API token from the environment; any value validates.
    env = {**os.environ, "VLLM_WATCHDOG_TOKEN": os.environ.get("VLLM_WATCHDOG_TOKEN", "bench")}
    print(f"median of {args.runs} runs; promtool: {args.promtool or 'not found'}")
    print(f"{'command':34s} {'ours':>9s} {'promtool':>9s} {'ratio':>7s}")
    for label, mine, theirs in pairs(args.promtool):
        t_ours = median_seconds(mine, args.runs, env)
        t_theirs = median_seconds(theirs, args.runs, env) if theirs else None
        ref = f"{t_theirs * 1000:7.0f}ms {t_ours / t_theirs:6.1f}x" if t_theirs else f"{'-':>9s} {'-':>7s}"
        print(f"{label:34s} {t_ours * 1000:7.0f}ms {ref}")
    t_import = median_seconds([sys.executable, "-c", "import vllm_watchdog.cli"], args.runs, env)
    t_bare = median_seconds([sys.executable, "-c", "pass"], args.runs, env)
    print(
        f"{'import vllm_watchdog.cli':34s} {t_import * 1000:7.0f}ms (python -c pass: {t_bare * 1000:.0f}ms)"
    )


if __name__ == "__main__":
    main()
