"""sd_notify over a real unix datagram socket (NOTIFY_SOCKET): STATUS= only on change, RELOADING=1 with
MONOTONIC_USEC=, abstract socket names, a receiver that stops reading, and nothing sent without a socket."""

from __future__ import annotations

import os
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from vllm_watchdog.sdnotify import Notifier
from vllm_watchdog.service.sdstatus import status_line


@pytest.fixture
def listener(tmp_path: Path) -> Iterator[tuple[socket.socket, str]]:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    path = str(tmp_path / "notify.sock")
    sock.bind(path)
    sock.settimeout(5)
    yield sock, path
    sock.close()


def pending(sock: socket.socket) -> list[bytes]:
    sock.setblocking(False)
    out = []
    try:
        while True:
            out.append(sock.recv(4096))
    except BlockingIOError:
        return out
    finally:
        sock.settimeout(5)


def test_status_is_sent_when_it_changes_and_on_one_line(listener: tuple[socket.socket, str]) -> None:
    sock, path = listener
    notifier = Notifier({"NOTIFY_SOCKET": path})
    assert notifier.status("1/1 targets up")
    assert not notifier.status("1/1 targets up")  # unchanged: nothing sent
    assert notifier.status("0/1 targets up\nREADY=1")  # a newline cannot smuggle in another assignment
    assert pending(sock) == [b"STATUS=1/1 targets up", b"STATUS=0/1 targets up READY=1"]


def test_reloading_carries_the_monotonic_time_in_microseconds(listener: tuple[socket.socket, str]) -> None:
    sock, path = listener
    notifier = Notifier({"NOTIFY_SOCKET": path}, monotonic_ns=lambda: 123_456_789_012)
    assert notifier.reloading() and notifier.ready()
    assert pending(sock) == [b"RELOADING=1\nMONOTONIC_USEC=123456789", b"READY=1"]


def test_a_receiver_that_stops_reading_never_blocks_the_sender(listener: tuple[socket.socket, str]) -> None:
    """A blocking send to a full queue once stopped the gateway's event loop, SIGTERM handler included, for
    as long as nobody read: a message that does not fit is dropped, and the next one that fits is sent."""
    sock, path = listener
    notifier = Notifier({"NOTIFY_SOCKET": path})
    results: list[bool] = []
    sender = threading.Thread(
        target=lambda: results.extend(notifier.ping() for _ in range(2000)), daemon=True
    )
    sender.start()
    sender.join(60)  # a bound on a hang, not a timing: each send returns at once or not at all
    assert not sender.is_alive(), "a send blocked on the full queue"
    assert results[0] and not all(results)  # the queue filled up, and the rest were dropped
    queued = pending(sock)
    assert queued and set(queued) == {b"WATCHDOG=1"} and len(queued) == results.count(True)
    assert notifier.stopping() and pending(sock) == [b"STOPPING=1"]  # read again: sent again


def test_abstract_socket_names_work() -> None:
    name = f"vllm-watchdog-test-{os.getpid()}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind("\0" + name)
        assert Notifier({"NOTIFY_SOCKET": "@" + name}).stopping()
        assert sock.recv(100) == b"STOPPING=1"


def test_without_systemd_nothing_is_sent() -> None:
    notifier = Notifier({})
    assert not notifier.enabled
    assert not notifier.status("x") and not notifier.reloading() and not notifier.ready()


def test_the_status_line_names_what_is_down_firing_and_running() -> None:
    up = {"a": True, "b": False, "c": False, "d": False, "e": False}
    line = status_line(up, ["VLLMEngineHung", "VLLMEngineHung", "VLLMQueueSaturated"], {"b": "restart"})
    assert line == (
        "1/5 targets up (down: b, c, d and 1 more); 3 alerts firing (VLLMEngineHung, VLLMQueueSaturated); "
        "1 actions running (restart on b)"
    )
