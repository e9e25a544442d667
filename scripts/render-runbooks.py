"""Write watchdog/defaults/runbooks.html from docs/runbooks.md: `python scripts/render-runbooks.py`
(`--check`: only compare, exit 1 when stale). The watchdog serves that file at /runbooks;
tests/api/test_runbooks.py fails while it differs from what this writes."""

from __future__ import annotations

import sys
from pathlib import Path

from vllm_watchdog.api.runbooks import rendering

ROOT = Path(__file__).resolve().parents[1]
SOURCE = ROOT / "docs" / "runbooks.md"
OUT = ROOT / "watchdog" / "defaults" / "runbooks.html"


def main(argv: list[str]) -> int:
    """Write the rendering; with --check, only say whether it is current."""
    text = rendering(SOURCE.read_text(encoding="utf-8"))
    current = OUT.exists() and OUT.read_text(encoding="utf-8") == text
    if "--check" in argv:
        print("current" if current else f"stale: run python {Path(__file__).relative_to(ROOT)}")
        return 0 if current else 1
    if not current:
        OUT.write_text(text, encoding="utf-8")
    print(f"written: {OUT.relative_to(ROOT)}" if not current else "current")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
