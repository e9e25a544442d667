#!/usr/bin/env python3
"""Write tests/durations.json from a suite run's `--durations=0` output: seconds per xdist group, and per test
of a second or more (a test of a `spread` module is a group of its own).

Usage: ./scripts/test.sh --durations=0 | tee run.log; .venv/bin/python scripts/test-durations.py run.log

The file only orders the groups, longest first (tests/support/longest_first.py): run this again when the
suite's slow tests change, so that the longest still start first.
"""

from __future__ import annotations

import json
import re
import sys
from collections import Counter
from pathlib import Path

LINE = re.compile(r"^(\d+(?:\.\d+)?)s (?:setup|call|teardown)\s+(\S+)@(\S+)$", re.MULTILINE)
OUT = Path(__file__).resolve().parent.parent / "tests" / "durations.json"


def main() -> int:
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    text = Path(sys.argv[1]).read_text(errors="replace")
    seconds: Counter[str] = Counter()
    per_test: Counter[str] = Counter()
    for value, nodeid, group in LINE.findall(text):
        seconds[group] += float(value)
        per_test[nodeid] += float(value)
    if not seconds:
        print(
            f"{sys.argv[1]}: no '--durations=0' lines with an xdist group (run it with -n)", file=sys.stderr
        )
        return 1
    groups, tests = longest(seconds), longest(per_test)
    doc = {
        "from": Path(sys.argv[1]).name,
        "note": "seconds per xdist group and per test; they order the groups, never asserted",
        "groups": groups,
        "tests": tests,
    }
    OUT.write_text(json.dumps(doc, indent=1) + "\n")
    total = sum(seconds.values())
    print(f"{OUT}: {len(groups)} groups and {len(tests)} tests of 1 s or more, {total:.0f} s in all")
    return 0


def longest(seconds: Counter[str]) -> dict[str, float]:
    """Those of 1 s or more, longest first, to a tenth of a second."""
    return {k: round(v, 1) for k, v in sorted(seconds.items(), key=lambda kv: (-kv[1], kv[0])) if v >= 1.0}


if __name__ == "__main__":
    sys.exit(main())
