"""The processes of this host, as the tests look for their own children and servers in /proc."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path


def command_lines() -> Iterator[tuple[int, list[bytes]]]:
    """(pid, argv) of every process whose command line can still be read (one that ends meanwhile is skipped)."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            raw = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        yield int(entry.name), raw.split(b"\0")
