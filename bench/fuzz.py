"""Run the fuzz harnesses (tests/*/test_fuzz_*.py) for longer than the suite does.

Usage: python bench/fuzz.py [--minutes N | --examples N] [--harness NAME ...] [--logs DIR]

Each harness is its pytest module, run with VLLM_WATCHDOG_FUZZ_EXAMPLES set (tests/support/fuzzing.py turns it
into each test's example count). `--examples N` runs every harness once with that base count.
`--minutes N` gives every harness N minutes of wall time: a short calibration round, then rounds sized
from the measured rate until the time is spent, each with fresh random seeds (hypothesis' database under
.hypothesis/ replays any failing example first). A harness that fails stops there: its next round would
only replay the same failure.

Prints per harness: rounds, examples run (hypothesis' passing + failing test cases, every phase), time
spent, examples per minute, and the failures found, with the log of the failing round (pytest's full output,
where the falsifying example and its @reproduce_failure blob are).
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
HARNESSES = ("exposition", "loaders", "promql", "gateway")
ENV = "VLLM_WATCHDOG_FUZZ_EXAMPLES"
CALIBRATION = 100  # the base example count of a --minutes run's first round
_CASES = re.compile(r"- (\d+) passing, (\d+) failing, and (\d+) invalid test cases")
_FAILED = re.compile(r"^FAILED (\S+)", re.M)


@dataclass
class Round:
    """One pytest run of one harness."""

    base: int
    seconds: float
    examples: int
    failed: list[str]
    log: Path


@dataclass
class Tally:
    """Everything one harness did."""

    name: str
    rounds: list[Round] = field(default_factory=list)

    @property
    def examples(self) -> int:
        return sum(r.examples for r in self.rounds)

    @property
    def seconds(self) -> float:
        return sum(r.seconds for r in self.rounds)

    @property
    def failures(self) -> list[tuple[str, Path]]:
        return [(test, r.log) for r in self.rounds for test in r.failed]


def run_round(name: str, base: int, logs: Path, index: int) -> Round:
    """Run the harness' module once with the base example count; count what hypothesis ran."""
    log = logs / f"{name}-{index}.log"
    (module,) = ROOT.glob(f"tests/*/test_fuzz_{name}.py")
    command = [sys.executable, "-m", "pytest", str(module.relative_to(ROOT)), "-q", "-p", "no:cacheprovider"]
    command += ["--hypothesis-show-statistics", "--tb=short"]
    env = dict(os.environ, **{ENV: str(base)})
    start = time.monotonic()
    proc = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, check=False)
    seconds = time.monotonic() - start
    output = proc.stdout + proc.stderr
    log.write_text(output)
    examples = sum(int(m.group(1)) + int(m.group(2)) for m in _CASES.finditer(output))
    failed = _FAILED.findall(output)
    if proc.returncode not in (0, 1):
        failed.append(f"pytest exited {proc.returncode}")
    return Round(base, seconds, examples, failed, log)


def run_for(name: str, minutes: float, logs: Path) -> Tally:
    """Rounds of one harness until `minutes` are spent (or it fails)."""
    tally = Tally(name)
    budget = minutes * 60
    base = CALIBRATION
    while True:
        done = run_round(name, base, logs, len(tally.rounds))
        tally.rounds.append(done)
        n = len(tally.rounds)
        report(f"  {name} round {n}: base {base}, {done.examples} examples in {done.seconds:.0f}s")
        left = budget - tally.seconds
        if done.failed or left < 30:
            return tally
        # pytest's start-up and the module's fixtures are part of every round: size by the whole round.
        per_base = done.seconds / base
        base = max(CALIBRATION, int(left / per_base * 0.9))


def report(line: str) -> None:
    """One line of progress or result."""
    print(line, flush=True)


def main() -> int:
    """Run the harnesses; exit 1 if any failed."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    amount = parser.add_mutually_exclusive_group(required=True)
    amount.add_argument("--minutes", type=float, help="wall time per harness")
    amount.add_argument("--examples", type=int, help="base example count per harness (one round)")
    parser.add_argument("--harness", nargs="+", choices=HARNESSES, default=list(HARNESSES))
    parser.add_argument("--logs", type=Path, default=Path("/tmp/vllm-watchdog-fuzz"))
    args = parser.parse_args()
    args.logs.mkdir(parents=True, exist_ok=True)
    tallies = []
    for name in args.harness:
        if args.minutes is not None:
            tally = run_for(name, args.minutes, args.logs)
        else:
            tally = Tally(name, [run_round(name, args.examples, args.logs, 0)])
        tallies.append(tally)
    report("")
    report(f"{'harness':<12} {'rounds':>6} {'examples':>9} {'minutes':>8} {'examples/min':>13}  failures")
    for t in tallies:
        rate = t.examples / (t.seconds / 60) if t.seconds else 0.0
        found = ", ".join(f"{test} (log {log})" for test, log in t.failures) or "none"
        minutes = t.seconds / 60
        report(f"{t.name:<12} {len(t.rounds):>6} {t.examples:>9} {minutes:>8.1f} {rate:>13.0f}  {found}")
    total = sum(t.seconds for t in tallies) / 60
    report(f"{'total':<12} {'':>6} {sum(t.examples for t in tallies):>9} {total:>8.1f}")
    return 1 if any(t.failures for t in tallies) else 0


if __name__ == "__main__":
    sys.exit(main())
