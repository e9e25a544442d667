"""Request bodies: the element count before parsing, the few fields kept after it, and a 16 MiB body of empty
objects against a real gateway, whose memory is measured with tracemalloc (every thread's allocations)."""

from __future__ import annotations

import json
import socket
import tracemalloc
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.support.gateway_upstream import Upstream
from tests.support.vllm_server import free_port
from vllm_watchdog.gateway.config import GatewayConfig
from vllm_watchdog.gateway.dataplane.bodies import (
    ElementCounter,
    TooManyElements,
    _at_most,
    request_fields,
    tool_call_signatures,
)
from vllm_watchdog.gateway.dataplane.server import GatewayServer

MiB = 1024 * 1024
CALL = {"id": "c1", "type": "function", "function": {"name": "grep", "arguments": '{"q": "a, b"}'}}


def empty_objects(size: int) -> bytes:
    """`{"messages":[{},{},...]}` of at most `size` bytes: about 70 bytes of Python objects per 3 bytes."""
    inner = b"{}," * ((size - 16) // 3)
    return b'{"messages":[' + inner[:-1] + b"]}"


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(alphabet='ab"\\\\,[]{}: \u00e9'),
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(st.text(alphabet='k"\\\\,', max_size=3), inner, max_size=3)
    ),
    max_leaves=12,
)


def _elements(text: str) -> int:
    """The count `_at_most` sees: the least limit it accepts the text under."""
    lo, hi = 0, len(text) + 1
    while lo < hi:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if _at_most(text, mid) else (mid + 1, hi)
    return lo


@given(JSON_VALUES, st.lists(st.integers(min_value=0, max_value=400), max_size=6))
def test_counting_chunks_as_they_arrive_counts_as_the_whole_text_does(value: Any, cuts: list[int]) -> None:
    data = json.dumps(value, ensure_ascii=False).encode()
    counter = ElementCounter(10**9)
    start = 0
    for cut in [*sorted(c for c in cuts if c <= len(data)), len(data)]:
        counter.feed(data[start:cut])  # a cut may split a string, an escape, or a run of backslashes
        start = cut
    assert counter.count == _elements(data.decode())
    if counter.count:
        with pytest.raises(TooManyElements):
            ElementCounter(counter.count - 1).feed(data)


def test_elements_are_counted_outside_strings() -> None:
    # Counted: each "[" and "{", each comma, each string (keys too).
    text = json.dumps({"prompt": ",[{" * 10_000, "user": "u"}).encode()  # 30,000 brackets in one string: 6
    assert request_fields(text, None, 6) == {"stream": False, "user": "u"}
    assert request_fields(b'{"prompt": [1, 2, 3, 4]}', None, 6) == {"stream": False}
    with pytest.raises(TooManyElements):
        request_fields(b'{"prompt": [1, 2, 3, 4, 5]}', None, 6)
    escaped = json.dumps({"a": 'x\\",[' * 1000}).encode()  # escaped quotes do not end the string
    assert request_fields(escaped, "application/json", 3) == {"stream": False}


def test_a_body_that_is_not_a_json_object_has_no_fields() -> None:
    assert request_fields(b"[1, 2]", None, 10) is None
    assert request_fields(b'{"a": "unterminated', None, 10) is None
    assert request_fields(b'{"a": 1}', "text/plain", 10) is None
    assert request_fields(b"", None, 10) is None


def test_only_the_fields_read_after_admission_are_kept() -> None:
    body: dict[str, Any] = {
        "model": "m",
        "user": "alice",
        "stream": True,
        "messages": [
            {"role": "user", "content": "x" * 1000},
            {"role": "assistant", "content": None, "tool_calls": [CALL]},
            {"role": "tool", "content": "result"},
        ],
        "tools": [{"type": "function", "function": {"name": "grep"}}],
    }
    fields = request_fields(json.dumps(body).encode(), None, 1000)
    assert fields == {"stream": True, "user": "alice", "messages": [body["messages"][1]]}
    assert tool_call_signatures(fields) == tool_call_signatures(body) != []
    odd = request_fields(b'{"user": ["x"], "stream": "yes", "messages": [{"role": "user"}]}', None, 100)
    assert odd == {"stream": False, "messages": []}


@pytest.fixture
def gateway() -> Iterator[tuple[GatewayServer, Upstream]]:
    upstream = Upstream()
    server = GatewayServer(GatewayConfig(target="bodies", upstream=upstream.url, listen_port=free_port()))
    server.start()
    yield server, upstream
    server.stop(grace=1.0)
    upstream.close()


def test_a_16_mib_body_of_empty_objects_is_refused_within_bounded_memory(
    gateway: tuple[GatewayServer, Upstream],
) -> None:
    server, upstream = gateway
    body = empty_objects(16 * MiB)
    head = b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    data = head + b"Content-Length: %d\r\n\r\n" % len(body) + body
    tracemalloc.start()
    try:
        with socket.create_connection(("127.0.0.1", server.config.listen_port), timeout=60) as sock:
            sock.sendall(data)
            raw = b""
            while part := sock.recv(65536):
                raw += part
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    status, _, rest = raw.partition(b"\r\n")
    assert status.startswith(b"HTTP/1.1 413 "), raw[:300]
    error = json.loads(rest.partition(b"\r\n\r\n")[2])["error"]
    assert (error["code"], error["type"]) == ("body_too_complex", "invalid_request_error")
    assert upstream.seen == []
    # The body itself is 16 MiB; json.loads made about 430 MB of it. Read, joined and counted: a few times it.
    # The body is 16 MiB; json.loads made about 430 MB of it. It is refused at the element that passes the
    # limit, about 1.3 MB in, and the rest is read and dropped: less than half the body is ever held.
    assert peak < 8 * MiB, f"{peak / MiB:.0f} MiB"
