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


def test_every_data_file_of_the_tree_is_package_data() -> None:
    """A file the package reads at run time (defaults/*.yml, the served runbooks) must match a package-data glob,
    or the wheel leaves it out and the installed watchdog fails where the checkout works."""
    globs = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    patterns = globs["vllm_watchdog"]
    data = [
        p.relative_to(ROOT / "watchdog")
        for p in (ROOT / "watchdog").rglob("*")
        if p.is_file() and p.suffix not in (".py", ".pyc") and "__pycache__" not in p.parts
    ]
    assert Path("defaults/runbooks.html") in data
    missed = [str(p) for p in data if not any(p.match(g) for g in patterns)]
    assert missed == [], "add these to [tool.setuptools.package-data] vllm_watchdog"
