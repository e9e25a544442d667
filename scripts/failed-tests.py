"""Prints the tests pytest's cache says failed in the last run, one node id a line, for a rerun.

pytest-xdist's `--dist loadgroup` records a grouped test as `path::name@group`, an id that a run without
xdist does not know; the `@group` suffix is dropped here. Prints nothing and exits 1 when the failures are in
more than `--max` test files: that many are not load, and running them again alone would only take time. The
cap counts files, not tests: a module-scoped fixture that fails under load errors every test of its module,
one cause.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def node_id(key: str) -> str:
    """`tests/a.py::test_x[p]@tests/a.py` -> `tests/a.py::test_x[p]`; an `@` inside a parameter id stays."""
    head, at, group = key.rpartition("@")
    if not at or "]" in group or "[" in group:
        return key
    return head


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--cache", default=".pytest_cache/v/cache/lastfailed")
    parser.add_argument("--max", type=int, default=10)
    args = parser.parse_args()
    path = Path(args.cache)
    failed = json.loads(path.read_text()) if path.is_file() else {}
    ids = sorted({node_id(key) for key in failed})
    files = {test.partition("::")[0] for test in ids}
    if len(files) > args.max:
        print(f"tests failed in {len(files)} files, more than {args.max}: not run again", file=sys.stderr)
        return 1
    for test in ids:
        print(test)
    return 0


if __name__ == "__main__":
    sys.exit(main())
