"""scripts/audit-deps.py in offline mode (forced, so no network is touched): the real venv passes, a venv
with a known vulnerable version fails, the ignore list needs reasons and says when an entry is stale."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "audit-deps.py"


def audit(*args: str) -> subprocess.CompletedProcess[str]:
    """Run the script offline with these arguments."""
    return subprocess.run(
        [sys.executable, str(SCRIPT), "--offline", *args], capture_output=True, text=True, timeout=120
    )


def test_the_real_venv_has_no_known_vulnerable_package() -> None:
    done = audit("--python", sys.executable)
    assert done.returncode == 0, done.stdout + done.stderr
    first = done.stdout.splitlines()[0]
    assert first.startswith("mode: offline (--offline): ") and "advisories.toml (updated " in first
    assert "VULNERABLE" not in done.stdout
    last = re.fullmatch(
        r"0 known vulnerable, (\d+) ignored, (\d+) packages audited", done.stdout.splitlines()[-1]
    )
    assert last is not None, done.stdout
    assert int(last.group(2)) > 30  # the venv's whole set was read, not an empty one
    assert "note: ignore entry" not in done.stdout  # every ignore entry still applies to something installed


def test_a_known_vulnerable_version_fails(tmp_path: Path) -> None:
    installed = tmp_path / "installed.txt"
    installed.write_text(
        "aiohttp==3.9.1\nh11==0.14.0\nStarlette==0.46.0\nurllib3==2.0.5\nurllib3-extra==1.0\n"
        "PyYAML==6.0.3\nidna==3.7\n"
    )
    done = audit("--installed", str(installed), "--ignore", str(tmp_path / "none.txt"))
    assert done.returncode == 1, done.stdout + done.stderr
    vulnerable = {
        tuple(line.split()[1:4]) for line in done.stdout.splitlines() if line.startswith("VULNERABLE")
    }
    assert {
        ("aiohttp", "3.9.1", "CVE-2024-23334"),
        ("aiohttp", "3.9.1", "CVE-2024-30251"),
        ("h11", "0.14.0", "CVE-2025-43859"),
        ("starlette", "0.46.0", "CVE-2025-54121"),  # names compared as PyPI does (Starlette == starlette)
        ("urllib3", "2.0.5", "CVE-2023-43804"),  # the second of two ranges (`<1.26.17 || >=2.0.0,<2.0.6`)
    } <= vulnerable
    assert not [v for v in vulnerable if v[0] in ("pyyaml", "idna", "urllib3-extra")]  # fixed versions pass
    assert ("aiohttp", "3.9.1", "CVE-2023-49081") not in vulnerable  # fixed in 3.9.0


def test_ignores_need_a_reason_and_stale_ones_are_named(tmp_path: Path) -> None:
    installed = tmp_path / "installed.txt"
    installed.write_text("h11==0.14.0\n")
    ignore = tmp_path / "ignore.txt"
    ignore.write_text("# comment\nCVE-2025-43859 h11 only the client parses responses from our own vLLM\n")
    done = audit("--installed", str(installed), "--ignore", str(ignore))
    assert done.returncode == 0, done.stdout
    assert "ignored: h11 0.14.0 CVE-2025-43859 (snapshot): only the client parses" in done.stdout
    installed.write_text("h11==0.16.0\n")
    done = audit("--installed", str(installed), "--ignore", str(ignore))
    assert (
        done.returncode == 0
        and "note: ignore entry CVE-2025-43859 h11 matches nothing installed" in done.stdout
    )
    ignore.write_text("CVE-2025-43859 h11\n")
    done = audit("--installed", str(installed), "--ignore", str(ignore))
    assert done.returncode == 2 and "the reason is required" in done.stderr
