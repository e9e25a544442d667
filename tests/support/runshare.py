"""What the processes of one test run share when pytest-xdist runs it on several workers.

`scripts/test.sh` runs the suite on a few xdist workers: most of it waits on servers, not on the CPU. A few
things must still exist once per run, whatever worker needs them first: the Docker engine (one dockerd per
host), and the session's real vLLM (see `GROUPS`). The process that starts the run (the xdist controller, or
plain pytest) makes a directory and names it in the environment, which its workers inherit; a worker that
starts a daemon there records its PID, and the starting process stops every recorded daemon when the run ends,
after the last worker has finished with it.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import signal
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import longest_first

ENV = "VLLM_WATCHDOG_TEST_RUN_DIR"
STOP_TIMEOUT = 60.0

# Tests that use the session's shared vLLM run one after another on one worker: several read vLLM's own
# counters, or count what is queued in it, and requests from another worker would change both. A test is
# in the group when it asks for the `vllm_server` fixture (directly or through another fixture).
SHARED_VLLM_GROUP = "shared-vllm"


def under_xdist() -> bool:
    """True in an xdist worker (its controller and plain pytest are not)."""
    return bool(os.environ.get("PYTEST_XDIST_WORKER"))


def begin(config: pytest.Config) -> None:
    """In the process that starts the run: make the shared directory (workers inherit its name)."""
    if under_xdist() or os.environ.get(ENV):
        return
    os.environ[ENV] = tempfile.mkdtemp(prefix="vllm-watchdog-run-")
    config.stash[_OWNER] = os.environ[ENV]


def end(config: pytest.Config) -> None:
    """In the process that started the run: stop every daemon a worker recorded, remove the directory."""
    root = config.stash.get(_OWNER, None)
    if root is None:
        return
    for pidfile in sorted(Path(root).glob("*.pid")):
        with contextlib.suppress(ValueError, OSError):
            stop_group(int(pidfile.read_text()))
    shutil.rmtree(root, ignore_errors=True)
    os.environ.pop(ENV, None)


_OWNER = pytest.StashKey[str]()


def run_dir() -> Path:
    """The run's shared directory (made on first use when the run did not go through `begin`)."""
    root = os.environ.get(ENV)
    if not root:
        os.environ[ENV] = root = tempfile.mkdtemp(prefix="vllm-watchdog-run-")
    return Path(root)


@contextlib.contextmanager
def exclusive(name: str) -> Iterator[None]:
    """Hold the run-wide lock `name` (one worker at a time starts a shared daemon)."""
    with (run_dir() / f"{name}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def record(name: str, pid: int) -> None:
    """Leave the daemon `pid` (a process-group leader) for the run's starter to stop at the end."""
    (run_dir() / f"{name}.pid").write_text(str(pid))


def stop_group(pid: int) -> None:
    """SIGTERM a process group, then SIGKILL what is left after STOP_TIMEOUT."""
    try:
        os.killpg(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + STOP_TIMEOUT
    while time.monotonic() < deadline:
        try:
            os.killpg(pid, 0)
        except ProcessLookupError:
            return
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)
        time.sleep(0.2)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGKILL)


def assign_groups(items: list[pytest.Item]) -> None:
    """Mark each test with the xdist group it must share a worker with, and put the long groups first.

    Shared-vLLM tests form one group. Every other test is grouped with its module, so that a module's
    fixtures (a Prometheus, a Docker image, a vLLM of its own) are built once, on one worker; a module marked
    `spread` (its tests share nothing a module builds) lets each test go to any worker. The groups are then
    ordered longest first (tests/support/longest_first.py): the run ends when its last group does.
    """
    groups: dict[str, list[pytest.Item]] = {}
    for item in items:
        groups.setdefault(group_of(item), []).append(item)
    seconds = {
        name: longest_first.expected_seconds(name, len(tests), any(_starts_servers(t) for t in tests))
        for name, tests in groups.items()
    }
    for name, tests in groups.items():
        for item in tests:
            item.add_marker(pytest.mark.xdist_group(name))
    # Stable: a group's tests keep their order, and groups of equal length keep the collection's.
    items[:] = [item for name in sorted(groups, key=lambda g: -seconds[g]) for item in groups[name]]


def group_of(item: pytest.Item) -> str:
    """The xdist group of a test: the shared vLLM's, its own (in a `spread` module), or its module's."""
    if _uses_shared_vllm(item):
        return SHARED_VLLM_GROUP
    if item.get_closest_marker("spread") is not None:
        return item.nodeid
    return item.nodeid.split("::", 1)[0]


def _uses_shared_vllm(item: pytest.Item) -> bool:
    return "vllm_server" in getattr(item, "fixturenames", ())


def _starts_servers(item: pytest.Item) -> bool:
    """A real vLLM, Docker engine or Prometheus of the test's own (the suite's slow minutes)."""
    names = set(getattr(item, "fixturenames", ()))
    return item.get_closest_marker("vllm") is not None or bool(names & _SERVER_FIXTURES)


_SERVER_FIXTURES = {"docker_client", "cleanup", "vllm_runtime"}


def check_groups(session: pytest.Session) -> None:
    """On a worker of `--dist loadgroup`: every test id carries its group, or the run stops at once."""
    if getattr(session.config.option, "loadgroup", False) and any("@" not in i.nodeid for i in session.items):
        raise pytest.UsageError(
            "pytest-xdist did not group the tests (its ids are rewritten in a way pytest 9 ignores; "
            "scripts/setup.sh keeps pytest below 9): shared-vLLM tests would run on several workers at once"
        )
