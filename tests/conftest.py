"""Shared fixtures: loopback fault servers, the shared real vLLM server, fixture payloads."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import runshare
from tests.support.faultserver import FaultServer
from tests.support.longest_first import LongestFirst
from tests.support.tlsfiles import Pki, make_pki

FIXTURES = Path(__file__).parent / "fixtures"

pytest_plugins = [
    "tests.support.vllm_server",
    "tests.support.docker_engine",
    "tests.support.watchdogproc",
    "tests.support.etcd_cluster",
]

# Every process a test starts inherits this mark, so that gateway processes left behind can be found. A gateway
# outlives a daemon killed with SIGKILL by design (the data plane keeps serving); a test's cleanup kills the
# daemon that way, and the orphan would otherwise hold its port and memory until the session ends.
SESSION_MARK = f"VLLM_WATCHDOG_TEST_SESSION={uuid.uuid4().hex}"
os.environ["VLLM_WATCHDOG_TEST_SESSION"] = SESSION_MARK.split("=", 1)[1]


def pytest_configure(config: pytest.Config) -> None:
    """The run-wide directory that xdist workers share (a no-op on the workers themselves)."""
    runshare.begin(config)


def pytest_unconfigure(config: pytest.Config) -> None:
    """Stop the daemons that workers left for the whole run (dockerd), after the last worker is done."""
    runshare.end(config)


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook reads the groups into the test ids
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Tests that share the session's vLLM run on one worker; every other module runs whole on one."""
    runshare.assign_groups(items)


def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> LongestFirst | None:
    """`--dist loadgroup` hands out the longest groups first (tests/support/longest_first.py)."""
    return LongestFirst(config, log) if config.getvalue("dist") == "loadgroup" else None


def pytest_collection_finish(session: pytest.Session) -> None:
    """Refuse to run when xdist failed to group the tests."""
    runshare.check_groups(session)


def orphaned_gateways(everyone: bool = False) -> list[int]:
    """Gateway processes of this test session whose parent is gone (all of them with `everyone`)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if b"vllm_watchdog.gateway" not in (entry / "cmdline").read_bytes():
                continue
            if SESSION_MARK.encode() not in (entry / "environ").read_bytes().split(b"\0"):
                continue
            ppid = next(
                line for line in (entry / "status").read_text().splitlines() if line.startswith("PPid:")
            )
        except (OSError, StopIteration):
            continue
        if everyone or int(ppid.split()[1]) == 1 or not Path(f"/proc/{ppid.split()[1]}").exists():
            found.append(int(entry.name))
    return found


@pytest.fixture(autouse=True, scope="session")
def _no_gateway_outlives_the_session() -> Iterator[None]:
    """At the end: none is left holding a port, or the output pipe a CI runner waits on."""
    yield
    for pid in orphaned_gateways(everyone=True):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


@pytest.fixture(autouse=True, scope="module")
def _no_orphaned_gateways() -> Iterator[None]:
    """After each test module: gateway processes it left behind (their daemon killed) are stopped."""
    yield
    for pid in orphaned_gateways():
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


@pytest.fixture(autouse=True)
def _logging_as_it_was() -> Iterator[None]:
    """A test that runs a command in-process (`cli.main`) sets up logging for the whole process
    (`logs.setup`): its handler writes to a stream pytest closes after the test, and its level (`--log-level
    error`, say) hid the next test's warnings from caplog. Each test ends with the root logger as it began."""
    root = logging.getLogger()
    level, handlers = root.level, list(root.handlers)
    yield
    root.setLevel(level)
    root.handlers[:] = handlers


@pytest.fixture
def fault() -> Iterator[FaultServer]:
    """A programmable HTTP server on 127.0.0.1."""
    server = FaultServer()
    yield server
    server.close()


@pytest.fixture(scope="session")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    """A CA, server and client certificates signed by it, and a CA that signed none of them (openssl)."""
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="session")
def vllm_payload() -> str:
    """A real /metrics body captured from vLLM 0.32 under load."""
    return (FIXTURES / "vllm-0.32.0-metrics.txt").read_text()


@pytest.fixture
def anyio_backend() -> str:
    """Run async tests on asyncio only (the daemon is asyncio)."""
    return "asyncio"
