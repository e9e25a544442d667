"""Every bundled rule file passes `promtool check rules`, and its unit tests under rules/tests/ pass with both
`promtool test rules` and `vllm-watchdog test-rules`."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from promtool import PROMTOOL

RULES = Path(__file__).resolve().parent.parent / "rules"


@pytest.mark.parametrize("path", sorted(RULES.glob("*.yml")), ids=lambda p: p.name)
def test_promtool_accepts_the_bundled_rule_file(path: Path) -> None:
    out = subprocess.run([PROMTOOL, "check", "rules", str(path)], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr


@pytest.mark.parametrize("path", sorted((RULES / "tests").glob("*.yml")), ids=lambda p: p.name)
def test_rule_unit_tests_pass_with_promtool_and_with_us(path: Path) -> None:
    ours = subprocess.run(
        [sys.executable, "-m", "vllm_watchdog", "test-rules", str(path)], capture_output=True, text=True
    )
    theirs = subprocess.run([PROMTOOL, "test", "rules", str(path)], capture_output=True, text=True)
    assert theirs.returncode == 0, theirs.stdout + theirs.stderr
    assert ours.returncode == 0, ours.stdout + ours.stderr
