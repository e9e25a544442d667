"""Bundles on disk: private (0700 directory, 0600 files and members), whole or absent, kept by count and by
size with the newest always kept, and read back bounded and only by a valid id: a hostile bundle (a manifest
nested 200k deep, zero-filled members, a huge extended header) is a BundleError for itself alone, at the cost
of at most the read limits."""

from __future__ import annotations

import json
import os
import stat
import tarfile
from pathlib import Path

import pytest

from tests.support.incidents import hostile_bundle
from vllm_watchdog.actions.incidents.bundle import (
    BundleError,
    Bundles,
    ReadLimits,
    load_json,
    new_id,
    valid_id,
)


def _write(bundles: Bundles, incident_id: str, size: int = 10, mtime: float = 1.0) -> None:
    files = {"manifest.json": json.dumps({"id": incident_id}).encode(), "log.txt": os.urandom(size)}
    bundles.write(incident_id, files, mtime)
    os.utime(os.path.join(bundles.dir, incident_id + ".tar.gz"), (mtime, mtime))


def test_a_bundle_is_private_and_reads_back(tmp_path: Path) -> None:
    bundles = Bundles(str(tmp_path))
    files = {"log.txt": b"tail\n", "manifest.json": b'{"id": "x"}', "stacks.json": b"[]"}
    info = bundles.write("20240101T000000Z-vllm-0-7", files, 1_700_000_000)
    assert stat.S_IMODE(os.stat(bundles.dir).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(info.path).st_mode) == 0o600
    with tarfile.open(info.path) as tar:
        members = tar.getmembers()
    assert [m.name for m in members] == [
        "20240101T000000Z-vllm-0-7",
        "20240101T000000Z-vllm-0-7/manifest.json",  # first: a list reads only the head of each bundle
        "20240101T000000Z-vllm-0-7/stacks.json",  # then smallest first: the metrics come last
        "20240101T000000Z-vllm-0-7/log.txt",
    ]
    assert [stat.S_IMODE(m.mode) for m in members] == [0o700, 0o600, 0o600, 0o600]
    assert bundles.read("20240101T000000Z-vllm-0-7") == files
    assert bundles.manifest("20240101T000000Z-vllm-0-7") == {"id": "x"}
    assert [os.path.basename(p) for p in os.listdir(bundles.dir)] == ["20240101T000000Z-vllm-0-7.tar.gz"]


def test_an_existing_open_directory_is_closed_to_others(tmp_path: Path) -> None:
    (tmp_path / "incidents").mkdir(mode=0o755)
    os.chmod(tmp_path / "incidents", 0o755)
    _write(Bundles(str(tmp_path)), "a-1")
    assert stat.S_IMODE(os.stat(tmp_path / "incidents").st_mode) == 0o700


def test_retention_keeps_the_newest_by_count_and_by_size(tmp_path: Path) -> None:
    bundles = Bundles(str(tmp_path), keep=3, max_bytes=10**9)
    for i in range(5):
        _write(bundles, f"b-{i}", mtime=100.0 + i)
    bundles.prune()
    assert [b.id for b in bundles.list()] == ["b-4", "b-3", "b-2"]
    small = Bundles(str(tmp_path), keep=10, max_bytes=3000)
    _write(small, "big", size=5000, mtime=200.0)  # larger than the whole allowance: kept, as the newest
    small.prune()
    assert [b.id for b in small.list()] == ["big"]
    _write(small, "next", size=100, mtime=300.0)
    small.prune()
    assert [b.id for b in small.list()] == ["next"]


def test_ids_are_checked_before_any_path_is_built(tmp_path: Path) -> None:
    bundles = Bundles(str(tmp_path))
    assert new_id(1_700_000_000.5, "vllm/0 x", 12) == "20231114T221320Z-vllm_0_x-12"
    assert valid_id("20231114T221320Z-vllm-0-12")
    for bad in ("", "../x", "a/b", ".hidden", "-a", "a" * 129, "é"):
        assert not valid_id(bad), bad
        with pytest.raises(BundleError):
            bundles.read(bad)
    with pytest.raises(ValueError):
        bundles.write("../escape", {}, 0)
    os.makedirs(bundles.dir, exist_ok=True)
    (tmp_path / "elsewhere.tar.gz").write_bytes(b"x")
    os.symlink(tmp_path / "elsewhere.tar.gz", os.path.join(bundles.dir, "link.tar.gz"))
    assert bundles.list() == []  # a symlink is not a bundle
    with pytest.raises(BundleError, match="no incident 'link'"):
        bundles.read("link")
    Path(bundles.dir, "broken.tar.gz").write_bytes(b"not gzip")
    with pytest.raises(BundleError, match="cannot read"):
        bundles.read("broken")


def test_a_failed_write_leaves_nothing_behind(tmp_path: Path) -> None:
    bundles = Bundles(str(tmp_path))

    class Exploding(bytes):
        def __len__(self) -> int:
            raise OSError(28, "No space left on device")

    with pytest.raises(OSError, match="No space left"):
        bundles.write("c-1", {"log.txt": Exploding(b"x")}, 0)
    assert os.listdir(bundles.dir) == []


def test_a_manifest_nested_200k_deep_is_refused_and_the_good_bundle_beside_it_reads(tmp_path: Path) -> None:
    bundles = Bundles(str(tmp_path))
    _write(bundles, "good-1")
    deep = hostile_bundle(tmp_path, "deep-1", {"manifest.json": b"[" * 200_000 + b"]" * 200_000})
    assert deep.stat().st_size < 600  # 400 kB of brackets, gzipped
    assert {b.id for b in bundles.list()} == {"good-1", "deep-1"}
    with pytest.raises(BundleError, match="nested deeper than 32 levels"):
        bundles.manifest("deep-1")  # was a RecursionError out of json.loads
    assert bundles.manifest("good-1") == {"id": "good-1"}
    assert load_json(b"[" * 32 + b"]" * 32) is not None  # 32 levels are fine
    with pytest.raises(ValueError, match="nested deeper"):
        load_json(b'{"a":' * 33 + b"1" + b"}" * 33)


def test_zero_filled_members_cost_only_what_is_asked_for_and_at_most_the_caps(tmp_path: Path) -> None:
    bundles = Bundles(str(tmp_path))
    members: dict[str, bytes | int] = {
        "manifest.json": b"{}",
        "metrics.om": 32 << 20,
        "log.txt": (8 << 20) + 1,
    }
    hostile_bundle(tmp_path, "zeros-1", members)
    assert bundles.manifest("zeros-1") == {}  # the manifest only: nothing behind it is decompressed
    hostile_bundle(tmp_path, "zeros-0", {"a.txt": 64 << 20, "manifest.json": b"{}"})
    with pytest.raises(BundleError, match=f"more than {(1 << 20) + 16 * 1024} bytes uncompressed"):
        bundles.manifest("zeros-0")  # a list reads every manifest: nothing may come before it
    with pytest.raises(BundleError, match="holds 8388609 bytes, more than the 8388608 read"):
        bundles.read("zeros-1", ("log.txt",))  # was read whole, as were up to 32 members of 64 MiB each
    hostile_bundle(tmp_path, "zeros-2", {"manifest.json": b"{}", "a.txt": 1 << 20, "log.txt": b"kept"})
    small = Bundles(str(tmp_path), limits=ReadLimits(unpacked_bytes=1 << 20))
    with pytest.raises(BundleError, match="more than 1048576 bytes uncompressed"):
        small.read("zeros-2", ("log.txt",))  # skipping a member decompresses it: that counts too
    contents = Bundles(str(tmp_path)).contents("zeros-2", ("log.txt",))
    assert contents.files == {"log.txt": b"kept"}
    assert contents.sizes == {"manifest.json": 2, "a.txt": 1 << 20, "log.txt": 4}


def test_an_extended_header_longer_than_a_few_kib_is_refused(tmp_path: Path) -> None:
    hostile_bundle(tmp_path, "pax-1", {"manifest.json": b"{}"}, pax={"comment": "x" * (1 << 20)})
    with pytest.raises(BundleError, match=r"extended tar header of 1048\d+ bytes"):
        Bundles(str(tmp_path)).manifest("pax-1")  # tarfile would read the whole header into memory
    hostile_bundle(tmp_path, "pax-2", {"manifest.json": b"{}"}, pax={"comment": "short"})
    assert Bundles(str(tmp_path)).manifest("pax-2") == {}
