"""The wheel (and so the sidecar image) holds every package of the tree: pyproject.toml lists them by hand."""

from __future__ import annotations

from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parents[2]


def test_every_package_folder_is_listed_in_pyproject() -> None:
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    tree = {
        ".".join(("vllm_watchdog", *init.parent.relative_to(ROOT / "watchdog").parts))
        for init in (ROOT / "watchdog").rglob("__init__.py")
    }
    assert tree - listed == set(), "add these to [tool.setuptools] packages"
    assert listed - tree == {"vllm_watchdog.rules"}, (
        "listed but not in watchdog/ (rules/ is mapped on its own)"
    )
