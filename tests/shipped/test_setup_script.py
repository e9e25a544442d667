"""scripts/setup.sh, run again on a machine it has already set up, changes nothing."""

from __future__ import annotations

import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_a_second_setup_installs_nothing() -> None:
    # The suite itself ran setup.sh first (scripts/test.sh), so everything is in place: each check must see
    # that. The pip check once failed on every run (it imported setuptools after pip) and upgraded pip again.
    done = subprocess.run(
        ["bash", str(ROOT / "scripts" / "setup.sh")], capture_output=True, text=True, timeout=600, check=True
    )
    assert done.stderr.strip().splitlines() == ["setup: done"], done.stderr
