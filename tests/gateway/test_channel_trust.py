"""The control channel trusts nothing it did not create (issue 28, finding 3).

Without a runtime directory (cron, sudo, `su -c`) the control socket lives under /tmp, which every local user
shares. Another user who gets there first must not become the daemon's gateway: its directory is refused,
its listener is refused before a byte (the config with its API keys included) is sent, its forged status
never reaches the store, and a pid it names is never signalled. The suite runs as root, so "another user" is
uid 65534: a directory chowned to it, or a fake gateway that drops to it between bind() and listen() (the
kernel records a listener's credentials for SO_PEERCRED at listen()).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.vllm_server import free_port
from vllm_watchdog.gateway.config import GatewayConfig, PriorityConfig
from vllm_watchdog.gateway.control.handle import GatewayControl, GatewayControlOptions
from vllm_watchdog.gateway.control.process import GatewayProcess
from vllm_watchdog.gateway.protocol.channel import ChannelError, ControlClient, ControlServer
from vllm_watchdog.gateway.protocol.codec import encode
from vllm_watchdog.gateway.protocol.snapshot import (
    GateSnapshot,
    GatewaySnapshot,
    HistogramSnapshot,
    ProxySnapshot,
)
from vllm_watchdog.gateway.protocol.spec import GatewaySpec
from vllm_watchdog.gateway.protocol.trust import NotTrusted

pytestmark = pytest.mark.anyio
NOBODY = 65534
as_root = pytest.mark.skipif(os.geteuid() != 0, reason="acting as another user needs root (CI runs as root)")
SECRET = "sk-never-to-a-stranger"

# A gateway impostor: binds the path, drops to `uid` (-1: stays as it is), listens, prints every line it is
# sent, and answers each op from a table ("self" as a pid: its own).
FAKE = r"""
import json, os, socket, sys
path, uid, answers = sys.argv[1], int(sys.argv[2]), json.loads(sys.argv[3])
listener = socket.socket(socket.AF_UNIX)
listener.bind(path)
os.chmod(path, 0o666)
if uid >= 0:
    os.setgroups([])
    os.setgid(uid)
    os.setuid(uid)
listener.listen(8)
print("listening", flush=True)
while True:
    conn, _ = listener.accept()
    with conn, conn.makefile("rb") as lines:
        for line in lines:
            print(line.decode().strip(), flush=True)
            request = json.loads(line)
            result = answers.get(request["op"])
            if isinstance(result, dict) and result.get("pid") == "self":
                result = {**result, "pid": os.getpid()}
            conn.sendall(json.dumps({"id": request["id"], "ok": True, "result": result}).encode() + b"\n")
"""


class Fake:
    """A fake gateway process serving `path`; `received()` is every line it was sent."""

    def __init__(self, path: Path, uid: int, answers: dict[str, Any]) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", FAKE, str(path), str(uid), json.dumps(answers)],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout is not None
        assert self.proc.stdout.readline().strip() == "listening"

    def received(self) -> list[str]:
        """Stop it; the lines it was sent."""
        if self.proc.poll() is None:
            self.proc.kill()
        out, _ = self.proc.communicate(timeout=10)
        return [line for line in out.splitlines() if line]


class Store:
    """The action store, as GatewayControl sees it: records what it is asked to keep."""

    def __init__(self) -> None:
        self.puts: list[tuple[str, Any]] = []

    def drains(self) -> dict[str, float]:
        return {}

    def get(self, key: str) -> Any:
        return None

    def put(self, key: str, value: Any) -> None:
        self.puts.append((key, value))


@pytest.fixture
def fakes() -> Iterator[list[Fake]]:
    started: list[Fake] = []
    yield started
    for fake in started:
        fake.received()


def _config() -> GatewayConfig:
    priority = PriorityConfig(api_keys={SECRET: "interactive"})
    return GatewayConfig(
        target="vllm-0", upstream="http://127.0.0.1:9", listen_port=free_port(), priority=priority
    )


def _answers(config: GatewayConfig, pid: object) -> dict[str, Any]:
    """A gateway's answers that fit `config`, with a forged status that would fire alerts if believed."""
    empty = HistogramSnapshot((1.0,), (0, 0), 0.0, 0)
    gate = GateSnapshot(
        0, 64, 64, {"interactive": 999}, 3600.0, True, {}, {"queue_full": 10**6}, empty, (), {}
    )
    forged = GatewaySnapshot(config.target, gate, ProxySnapshot({"503": 10**6}, {"connect": 10**6}, empty))
    state = {"throttle": {"holds": {}}, "breakers": {"victim": [3600.0, "forged"]}, "offences": {}}
    return {
        "hello": {
            "target": config.target,
            "listen": f"{config.listen_host}:{config.listen_port}",
            "upstream": config.upstream,
            "fresh": False,
            "pid": pid,
            "lapses": 0,
            "in_flight": 0,
        },
        "set_drain": 0,
        "state": state,
        "status": {"pid": pid, "limit": 0, "in_flight": 64, "draining": True},
        "tick": {"snapshot": encode(forged), "state": state, "lapses": 0},
    }


@pytest.fixture
def tmp_path() -> Iterator[Path]:
    """A short directory under /tmp instead of pytest's: a Unix socket's path holds at most 107 bytes, and
    under xdist `tmp_path` with `shared/vllm-watchdog-0/sub/gateway.sock` below it came to 111."""
    path = Path(tempfile.mkdtemp(prefix="trust-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _private(tmp_path: Path, mode: int = 0o700) -> Path:
    directory = tmp_path / "run"
    directory.mkdir()
    directory.chmod(mode)
    return directory


async def _handler(op: str, args: Any) -> Any:
    return None


# --- the directory ----------------------------------------------------------------------------------------


@as_root
async def test_a_directory_another_user_made_first_is_refused_by_both_sides(
    tmp_path: Path, fakes: list[Fake]
) -> None:
    directory = _private(tmp_path)
    os.chown(directory, NOBODY, NOBODY)
    sock = directory / "gateway.sock"
    with pytest.raises(NotTrusted) as refused:
        await ControlServer(str(sock), _handler).start()
    assert f"{directory} belongs to uid {NOBODY}, expected uid 0" in str(refused.value)
    # The daemon's side, with a listener (of root, even) that got there first: not a byte goes out.
    fakes.append(fake := Fake(sock, -1, _answers(_config(), "self")))
    client = ControlClient(str(sock))
    with pytest.raises(ChannelError, match=f"belongs to uid {NOBODY}"):
        await client.request("hello")
    assert fake.received() == []


async def test_a_directory_others_may_write_to_is_refused_not_adopted(
    tmp_path: Path, fakes: list[Fake]
) -> None:
    directory = _private(tmp_path, 0o777)
    sock = directory / "gateway.sock"
    with pytest.raises(NotTrusted, match="mode 0777"):
        await ControlServer(str(sock), _handler).start()
    assert (directory.stat().st_mode & 0o777) == 0o777  # refused, not quietly chmod-ed and used
    fakes.append(fake := Fake(sock, -1, _answers(_config(), "self")))
    with pytest.raises(ChannelError, match="mode 0777"):
        await ControlClient(str(sock)).request("hello")
    assert fake.received() == []


async def test_the_gateway_process_will_not_serve_in_such_a_directory_and_says_why(tmp_path: Path) -> None:
    """The real gateway process, started by the daemon: it exits 4, and the daemon's error names the socket."""
    sock = _private(tmp_path, 0o777) / "gateway.sock"
    link = GatewayProcess(GatewaySpec(_config(), str(sock), 60.0), supervise=True)
    with pytest.raises(OSError, match=f"gateway cannot serve its control socket {sock}"):
        await link.attach()
    assert link.starts == 1 and not sock.exists()


async def test_a_writable_directory_on_the_way_is_refused_and_a_sticky_one_is_not(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)  # not sticky: anyone could rename our directory away and put theirs in its place
    with pytest.raises(
        NotTrusted, match=f"directory {shared}, on the way to the control socket, has mode 0777"
    ):
        await ControlServer(str(shared / "run" / "gateway.sock"), _handler).start()
    shared.chmod(0o1777)  # sticky, like /tmp: only the owner may rename or remove an entry
    server = ControlServer(str(shared / "run" / "gateway.sock"), _handler)
    await server.start()
    assert ((shared / "run").stat().st_mode & 0o777) == 0o700
    await server.close()


@as_root
async def test_a_symlink_of_another_user_on_the_way_is_refused(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)
    elsewhere = _private(tmp_path)
    link = shared / "vllm-watchdog-0"
    link.symlink_to(elsewhere)
    os.lchown(link, NOBODY, NOBODY)  # planted by another user in a sticky, world-writable directory
    with pytest.raises(NotTrusted, match=f"symlink {link} belongs to uid {NOBODY}"):
        await ControlServer(str(link / "sub" / "gateway.sock"), _handler).start()
    os.lchown(link, 0, 0)  # ours: followed, and what it leads to is checked in turn
    server = ControlServer(str(link / "sub" / "gateway.sock"), _handler)
    await server.start()
    assert (elsewhere / "sub" / "gateway.sock").exists()
    await server.close()


# --- the listener -----------------------------------------------------------------------------------------


@as_root
async def test_a_listener_of_another_user_gets_nothing_not_even_the_config(
    tmp_path: Path, fakes: list[Fake]
) -> None:
    sock = _private(tmp_path) / "gateway.sock"
    config = _config()
    fakes.append(fake := Fake(sock, NOBODY, _answers(config, "self")))
    client = ControlClient(str(sock))
    with pytest.raises(ChannelError, match=f"served by uid {NOBODY} .*expected uid 0"):
        await client.request("apply", {"config": encode(config)})
    assert client.peer is None
    assert fake.received() == []


@as_root
async def test_a_forged_status_never_reaches_the_store_nor_the_api_keys_the_impostor(
    tmp_path: Path, fakes: list[Fake], caplog: pytest.LogCaptureFixture
) -> None:
    """As under `run --external-gateway`: the daemon attaches to whatever answers on the socket."""
    sock = _private(tmp_path) / "gateway.sock"
    config = _config()
    fakes.append(fake := Fake(sock, NOBODY, _answers(config, "self")))
    store = Store()
    link = GatewayProcess(GatewaySpec(config, str(sock), 60.0), supervise=False)
    control = GatewayControl(config, GatewayControlOptions(link, store))
    with caplog.at_level(logging.ERROR, "vllm_watchdog.gateway.channel"):
        await control.start()
        assert await control.tick() is None
        with pytest.raises(ChannelError):
            await control.apply(config)
    assert (control.snapshot, control.reachable, store.puts) == (None, False, [])
    assert fake.received() == []
    refusals = [r for r in caplog.records if r.getMessage() == "refusing the gateway's control socket"]
    assert len(refusals) == 1  # said once, not once a second
    assert f"{sock} is served by uid {NOBODY}" in refusals[0].__dict__["error"]


# --- signals ----------------------------------------------------------------------------------------------


@pytest.fixture
def victim() -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen(["sleep", "60"])
    yield proc
    proc.kill()
    proc.wait(10)


async def test_a_pid_the_gateway_names_is_never_signalled_unless_it_holds_the_socket(
    tmp_path: Path, fakes: list[Fake], victim: subprocess.Popen[bytes]
) -> None:
    sock = _private(tmp_path) / "gateway.sock"
    config = _config()
    fakes.append(Fake(sock, -1, _answers(config, victim.pid)))
    link = GatewayProcess(GatewaySpec(config, str(sock), 60.0), supervise=True, python="/bin/false")
    hello = await link.attach()  # adopted, as it answers for our config: but not ours to signal
    assert hello["pid"] == victim.pid and link.pid is None
    await link.stop(0.0)
    assert victim.poll() is None

    # One that serves another config is "stale", and would be stopped if it were the process it says.
    moved = GatewayConfig(target="vllm-0", upstream="http://127.0.0.1:10", listen_port=config.listen_port)
    link = GatewayProcess(GatewaySpec(moved, str(sock), 60.0), supervise=True, python="/bin/false")
    with pytest.raises(OSError, match="it is not the process it claims to be, so it is not stopped"):
        await link.attach()
    assert victim.poll() is None


async def test_a_gateway_that_holds_its_socket_is_pinned_and_stopped(
    tmp_path: Path, fakes: list[Fake]
) -> None:
    sock = _private(tmp_path) / "gateway.sock"
    config = _config()
    fakes.append(fake := Fake(sock, -1, _answers(config, "self")))
    link = GatewayProcess(GatewaySpec(config, str(sock), 60.0), supervise=True, python="/bin/false")
    await link.attach()
    assert link.pid == fake.proc.pid and link.alive()
    await link.stop(0.0)
    assert fake.proc.wait(10) == -signal.SIGTERM
    assert not link.alive()
