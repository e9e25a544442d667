"""Reading incident bundles in tests: their files, the functions in their stacks, and promtool's import of
their metrics; hostile bundles, as anyone who can write state_dir/incidents can leave them; and a sleep that
waits for a test to move time (collection budgets and part timeouts)."""

from __future__ import annotations

import asyncio
import io
import json
import os
import subprocess
import tarfile
from pathlib import Path
from typing import Any

from vllm_watchdog.actions.incidents.bundle import Bundles

PROMTOOL = "/usr/bin/promtool"


def bundle(state_dir: Path | str, incident_id: str) -> dict[str, bytes]:
    """Every file of a bundle by name."""
    return Bundles(str(state_dir)).read(incident_id)


def manifest(files: dict[str, bytes]) -> dict[str, Any]:
    """The bundle's manifest."""
    doc: dict[str, Any] = json.loads(files["manifest.json"])
    return doc


def stack_functions(files: dict[str, bytes]) -> dict[int, set[str]]:
    """The function names in each process's stacks, by pid, each as py-spy names it (`Class.method`) and bare
    (`method`); processes py-spy could not read are left out."""
    out: dict[int, set[str]] = {}
    for entry in json.loads(files["stacks.json"]):
        if "threads" in entry:
            names = {f["name"] for t in entry["threads"] for f in t["frames"]}
            out[entry["pid"]] = names | {name.rpartition(".")[2] for name in names}
    return out


def part_status(files: dict[str, bytes]) -> dict[str, str]:
    """Each part's status from the manifest."""
    return {p["name"]: p["status"] for p in manifest(files)["parts"]}


def promtool_import(metrics: bytes, work: Path) -> str:
    """`promtool tsdb create-blocks-from openmetrics` on the bundle's metrics; its output (AssertionError with
    it if promtool refused the file)."""
    work.mkdir(parents=True, exist_ok=True)
    source = work / "metrics.om"
    source.write_bytes(metrics)
    done = subprocess.run(
        [PROMTOOL, "tsdb", "create-blocks-from", "openmetrics", str(source), str(work / "blocks")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert os.listdir(work / "blocks"), done.stdout
    return done.stdout


class Sleeper:
    """A sleep for code under test that returns only when the test has moved time past its deadline."""

    def __init__(self) -> None:
        self.now = 0.0
        self.waiting: list[tuple[float, asyncio.Future[None]]] = []

    def monotonic(self) -> float:
        """The time the sleeps measure."""
        return self.now

    async def sleep(self, seconds: float) -> None:
        """Wait until `advance` passes now + seconds."""
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.waiting.append((self.now + seconds, future))
        await future

    async def advance(self, seconds: float) -> None:
        """Let what is ready run (and start its sleeps), move time, wake every sleep now due, let them run."""
        for _ in range(20):
            await asyncio.sleep(0)
        self.now += seconds
        for deadline, future in list(self.waiting):
            if deadline <= self.now and not future.done():
                future.set_result(None)
        self.waiting = [(d, f) for d, f in self.waiting if not f.done()]
        for _ in range(20):
            await asyncio.sleep(0)

    @property
    def sleeping(self) -> int:
        """How many sleeps wait now."""
        return sum(1 for _, f in self.waiting if not f.done())


class _Zeros(io.RawIOBase):
    """`size` zero bytes, made as they are read (a hostile member costs the test no memory)."""

    def __init__(self, size: int) -> None:
        super().__init__()
        self.left = size

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        n = min(len(buffer), self.left)
        buffer[:n] = bytes(n)
        self.left -= n
        return n


def hostile_bundle(
    state_dir: Path | str,
    incident_id: str,
    members: dict[str, bytes | int],
    pax: dict[str, str] | None = None,
) -> Path:
    """A bundle as anyone who can write state_dir/incidents can leave it: each member its bytes, or (an int)
    that many zero bytes; `pax` headers on the first member. Gzip at level 9, as an attacker would."""
    directory = Path(state_dir) / "incidents"
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    path = directory / f"{incident_id}.tar.gz"
    with tarfile.open(path, "w:gz", compresslevel=9, format=tarfile.PAX_FORMAT) as tar:
        for n, (name, data) in enumerate(members.items()):
            info = tarfile.TarInfo(f"{incident_id}/{name}")
            info.size = data if isinstance(data, int) else len(data)
            if pax and n == 0:
                info.pax_headers = dict(pax)
            tar.addfile(info, _Zeros(data) if isinstance(data, int) else io.BytesIO(data))
    return path
