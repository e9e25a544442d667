"""Small modules and short functions (STYLE.md): no module over 400 lines, no function over 60."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent / "watchdog"
MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 60


def _modules() -> list[Path]:
    return sorted(ROOT.rglob("*.py"))


def test_no_module_is_over_400_lines() -> None:
    long = {
        str(p.relative_to(ROOT)): n for p in _modules() if (n := p.read_text().count("\n")) > MAX_MODULE_LINES
    }
    assert long == {}


def test_no_function_is_over_60_lines() -> None:
    long: dict[str, int] = {}
    for path in _modules():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                lines = (node.end_lineno or node.lineno) - node.lineno + 1
                if lines > MAX_FUNCTION_LINES:
                    long[f"{path.relative_to(ROOT)}:{node.lineno} {node.name}"] = lines
    assert long == {}
