"""scripts/failed-tests.py: which tests the suite runs again alone after a parallel run (scripts/test.sh)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "failed-tests.py"


def _run(tmp_path: Path, failed: list[str], cap: int) -> subprocess.CompletedProcess[str]:
    cache = tmp_path / "lastfailed"
    cache.write_text(json.dumps(dict.fromkeys(failed, True)))
    cmd = [sys.executable, str(SCRIPT), "--cache", str(cache), "--max", str(cap)]
    return subprocess.run(cmd, capture_output=True, text=True, check=False)


def test_the_cap_counts_files_and_the_xdist_group_is_dropped(tmp_path: Path) -> None:
    """A module fixture that failed errors all 9 tests of its module: one cause, not 9. Four files fit a cap
    of 4 and are printed without xdist's @group; five do not, and nothing is printed."""
    fixture = [f"tests/shipped/test_q.py::test_panel[{i}]@shared-vllm" for i in range(9)]
    others = [f"tests/t{i}.py::test_x@tests/t{i}.py" for i in range(3)]
    out = _run(tmp_path, fixture + others, 4)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.split()
    assert (
        len(lines) == 12
        and "tests/t0.py::test_x" in lines
        and "tests/shipped/test_q.py::test_panel[0]" in lines
    )
    more = _run(tmp_path, [*fixture, *others, "tests/t9.py::test_y"], 4)
    assert more.returncode == 1 and more.stdout == "" and "5 files, more than 4" in more.stderr
