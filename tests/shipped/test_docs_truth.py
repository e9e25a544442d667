"""What the docs state about the shipped code, checked against it: a newcomer follows the docs word for word."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]


def _requirement_name(spec: str) -> str:
    return re.split(r"[<>=!~;\[ ]", spec, maxsplit=1)[0].strip().lower()


def test_the_readme_names_every_dependency_pip_installs() -> None:
    block = (ROOT / "pyproject.toml").read_text().split("\ndependencies = [", 1)[1].split("\n]", 1)[0]
    deps = re.findall(r'^\s*"([^"]+)"', block, flags=re.M)
    assert len(deps) >= 10
    text = (ROOT / "README.md").read_text()
    sentence = text[text.index("vLLM is never a dependency of the sidecar") :].split("\n\n", 1)[0]
    missing = [d for d in map(_requirement_name, deps) if d not in sentence.replace("\n", " ")]
    assert missing == []


def test_the_manual_run_example_names_a_bundled_action() -> None:
    bundled = yaml.safe_load((ROOT / "watchdog" / "defaults" / "watchdog.yml").read_text())["actions"]
    docs = (ROOT / "docs" / "actions.md").read_text()
    runs = re.findall(r"/api/v1/actions/([\w-]+)/run", docs)
    assert runs and all(name in bundled for name in runs), runs


def test_troubleshooting_does_not_say_an_unwritable_state_dir_stops_the_watchdog() -> None:
    """It keeps monitoring and refuses what it could not record (actions.md; tests/actions cover it)."""
    text = (ROOT / "docs" / "troubleshooting.md").read_text()
    section = text[text.index("## state_dir not writable") :].split("\n## ", 1)[0]
    assert "exits with status 1" not in section and "state_unwritable" in section
    assert "no redaction of secrets" not in text
    assert "`instance` is the\ntarget's name" not in text
