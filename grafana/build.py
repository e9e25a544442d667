"""Generate the dashboards in grafana/dashboards/: `python grafana/build.py` (`--check`: only compare).

The dashboards are defined in board_*.py from the blocks in panels.py.
tests/shipped/test_grafana_dashboards.py fails while the committed JSON differs from what this writes.
"""

from __future__ import annotations

import sys
from pathlib import Path

from board_gpu import gpu
from board_serving import serving
from board_watchdog import watchdog
from panels import Json, render

OUT = Path(__file__).resolve().parent / "dashboards"


def documents() -> dict[str, Json]:
    """File name -> dashboard, for every dashboard this project ships."""
    return {"vllm-serving.json": serving(), "gpu.json": gpu(), "watchdog.json": watchdog()}


def main(argv: list[str]) -> int:
    """Write every dashboard; with --check, only report which files differ (exit 1 if any)."""
    check = "--check" in argv
    stale = []
    for name, doc in documents().items():
        path, text = OUT / name, render(doc)
        if not path.exists() or path.read_text() != text:
            stale.append(name)
            if not check:
                path.write_text(text)
    print(("stale: " if check else "written: ") + (", ".join(stale) or "none"))
    return 1 if check and stale else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
