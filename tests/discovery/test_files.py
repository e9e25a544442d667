"""file_sd's polling: files matched by a glob, read again when they change, dropped when they go, and a bad
version that keeps the last good targets (real files in a temporary directory, the clock injected)."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import pytest

from tests.support.clock import Clock
from vllm_watchdog.discovery.config import FileSdConfig
from vllm_watchdog.discovery.files import RACY, FileDiscovery, check_files


def write(path: Path, *ports: int, mtime: float | None = None, **labels: str) -> None:
    """A file_sd file listing 127.0.0.1:<port> for each port; `mtime` set afterwards (seconds)."""
    doc = [{"targets": [f"127.0.0.1:{p}" for p in ports], "labels": labels}]
    path.write_text("\n".join(_yaml(doc)) if path.suffix in (".yml", ".yaml") else json.dumps(doc))
    if mtime is not None:
        os.utime(path, (mtime, mtime))


def _yaml(doc: list[dict[str, object]]) -> list[str]:
    return [f"- {json.dumps(group)}" for group in doc]


def names(fd: FileDiscovery) -> list[str]:
    return sorted(t.name for t in fd.refresh().targets)


@pytest.fixture
def clock() -> Clock:
    return Clock()


def discovery(tmp_path: Path, clock: Clock, *patterns: str) -> FileDiscovery:
    files = tuple(str(tmp_path / p) for p in patterns or ("*.json", "*.yml"))
    return FileDiscovery(FileSdConfig(name="file_sd_configs[0]", files=files), clock)


def test_files_matched_by_the_globs_are_read_and_their_changes_seen(tmp_path: Path, clock: Clock) -> None:
    fd = discovery(tmp_path, clock)
    assert names(fd) == []
    write(tmp_path / "a.json", 8001, mtime=clock.now - 60)
    write(tmp_path / "b.yml", 8002, mtime=clock.now - 60)
    (tmp_path / "c.txt").write_text("[]")  # not matched
    assert names(fd) == ["127.0.0.1_8001", "127.0.0.1_8002"]
    write(tmp_path / "a.json", 8001, 8003, mtime=clock.now - 30)  # edited: read again
    assert names(fd) == ["127.0.0.1_8001", "127.0.0.1_8002", "127.0.0.1_8003"]
    (tmp_path / "b.yml").unlink()  # gone: its targets go with it
    assert names(fd) == ["127.0.0.1_8001", "127.0.0.1_8003"]
    assert fd.mtimes() == {str(tmp_path / "a.json"): clock.now - 30}


def test_an_edit_that_keeps_size_and_mtime_is_seen(tmp_path: Path, clock: Clock) -> None:
    path = tmp_path / "a.json"
    write(path, 8001, mtime=clock.now - 60)
    fd = discovery(tmp_path, clock)
    assert names(fd) == ["127.0.0.1_8001"]
    write(path, 8002, mtime=clock.now - 60)  # same size, same mtime: the change time still moved
    assert names(fd) == ["127.0.0.1_8002"]
    replacement = tmp_path / "new.tmp"  # an atomic rename over the file: another inode
    write(replacement, 8003, mtime=clock.now - 60)
    replacement.rename(path)
    assert names(fd) == ["127.0.0.1_8003"]


def test_a_file_modified_close_to_its_read_is_read_again(tmp_path: Path, clock: Clock) -> None:
    path = tmp_path / "a.json"
    write(path, 8001, mtime=clock.now - RACY / 4)  # a writer may still be at it within the fs granularity
    fd = discovery(tmp_path, clock)
    assert names(fd) == ["127.0.0.1_8001"]
    assert fd.files[str(path)].racy
    clock.advance(RACY)
    assert names(fd) == ["127.0.0.1_8001"]  # read again, now well after its mtime
    assert not fd.files[str(path)].racy


def test_a_bad_version_keeps_the_last_good_targets_and_is_counted_once(
    tmp_path: Path, clock: Clock, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "a.json"
    write(path, 8001, mtime=clock.now - 60)
    fd = discovery(tmp_path, clock)
    assert names(fd) == ["127.0.0.1_8001"]
    path.write_text('[{"targets": ["127.0.0.1:8002"], "labels": {"instance": "x"}}]')
    with caplog.at_level(logging.ERROR):
        first = fd.refresh()
        second = fd.refresh()  # unchanged: not read, logged or counted again
    assert [t.name for t in first.targets] == ["127.0.0.1_8001"]  # the last good version stands
    assert (
        first.problems == second.problems
        and "a.json:1: [0].labels: must not set 'instance'" in first.problems[0]
    )
    assert fd.read_errors == 1
    refused = [r for r in caplog.records if "file refused" in r.getMessage()]
    assert len(refused) == 1 and str(path) in refused[0].__dict__["problem"]
    write(path, 8003, mtime=clock.now - 60)  # fixed
    fixed = fd.refresh()
    assert [t.name for t in fixed.targets] == ["127.0.0.1_8003"] and fixed.problems == ()


def test_a_file_that_was_never_good_lists_nothing(tmp_path: Path, clock: Clock) -> None:
    (tmp_path / "a.json").write_text("not json")
    fd = discovery(tmp_path, clock)
    found = fd.refresh()
    assert found.targets == () and "(json)" in found.problems[0] and fd.read_errors == 1


def test_check_reports_each_matched_file(tmp_path: Path, clock: Clock) -> None:
    write(tmp_path / "a.json", 8001, 8002)
    (tmp_path / "b.json").write_text("[{]")
    sd = FileSdConfig(name="file_sd_configs[0]", files=(str(tmp_path / "*.json"), str(tmp_path / "none.yml")))
    (a, count, ok), (b, _, bad) = check_files(sd)
    assert (a, count, ok) == (str(tmp_path / "a.json"), 2, [])
    assert b == str(tmp_path / "b.json") and bad[0].field == "(json)"
