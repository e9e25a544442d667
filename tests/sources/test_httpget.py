"""The scrape's HTTP/1.1 GET against a raw socket server: framing, keep-alive, bounds and errors."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import pytest

from vllm_watchdog.errors import ScrapeError
from vllm_watchdog.sources.httpget import HEADER_LIMIT, HttpGet

pytestmark = pytest.mark.anyio
HEADERS = {"Accept": "text/plain", "Accept-Encoding": "identity"}


@dataclass
class RawServer:
    """Answers each request with the next scripted reply (bytes, then optionally closes); records requests."""

    replies: list[tuple[bytes, bool]] = field(default_factory=list)
    requests: list[bytes] = field(default_factory=list)
    connections: int = 0
    port: int = 0

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while True:
                if not self.replies:
                    await reader.read()  # silent until the client goes
                    break
                self.requests.append(await reader.readuntil(b"\r\n\r\n"))
                reply, close = self.replies.pop(0)
                writer.write(reply)
                await writer.drain()
                if close:
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    def url(self, path: str = "/metrics") -> str:
        return f"http://127.0.0.1:{self.port}{path}"


@pytest.fixture
async def raw() -> AsyncIterator[RawServer]:
    server = RawServer()
    listener = await asyncio.start_server(server.handle, "127.0.0.1", 0)
    server.port = listener.sockets[0].getsockname()[1]
    yield server
    listener.close()


def reply(body: bytes, **headers: str) -> bytes:
    head = "".join(f"{k.replace('_', '-')}: {v}\r\n" for k, v in headers.items())
    return f"HTTP/1.1 200 OK\r\n{head}\r\n".encode() + body


async def test_content_length_keep_alive_reuses_one_connection(raw: RawServer) -> None:
    raw.replies = [(reply(b"a 1\n", Content_Length="4"), False), (reply(b"a 2\n", Content_Length="4"), False)]
    get = HttpGet(raw.url("/metrics?x=1"), HEADERS, 1 << 20)
    assert (await get.get()).body == b"a 1\n"
    assert get.connected
    second = await get.get()
    assert second.status == 200 and second.body == b"a 2\n" and second.headers["content-length"] == "4"
    assert raw.connections == 1
    first = raw.requests[0].decode()
    assert first.startswith("GET /metrics?x=1 HTTP/1.1\r\n")
    assert f"Host: 127.0.0.1:{raw.port}\r\n" in first and "Accept-Encoding: identity\r\n" in first
    await get.aclose()
    assert not get.connected


async def test_chunked_body_with_extensions_and_trailers(raw: RawServer) -> None:
    body = b"4;ext=1\r\na 1\n\r\n5\r\nb 22\n\r\n0\r\nX-Trailer: y\r\n\r\n"
    raw.replies = [(reply(body, Transfer_Encoding="chunked"), False)]
    get = HttpGet(raw.url(), HEADERS, 1 << 20)
    assert (await get.get()).body == b"a 1\nb 22\n"
    assert get.connected  # the chunked body ended cleanly: the connection is kept
    await get.aclose()


async def test_body_until_close_and_connection_close(raw: RawServer) -> None:
    raw.replies = [(reply(b"a 1\n"), True)]
    get = HttpGet(raw.url(), HEADERS, 1 << 20)
    assert (await get.get()).body == b"a 1\n"
    assert not get.connected
    raw.replies = [(reply(b"ok", Content_Length="2", Connection="close"), True)]
    assert (await get.get()).body == b"ok" and not get.connected


async def test_a_closed_idle_connection_is_retried_once_on_a_new_one(raw: RawServer) -> None:
    raw.replies = [(reply(b"a 1\n", Content_Length="4"), True)]  # the server closes after answering
    get = HttpGet(raw.url(), HEADERS, 1 << 20)
    await get.get()
    raw.replies = [(reply(b"a 2\n", Content_Length="4"), False)]
    assert (await get.get()).body == b"a 2\n"
    assert raw.connections == 2
    await get.aclose()


@pytest.mark.parametrize(
    ("answer", "message", "kind"),
    [
        (reply(b"x" * 10, Content_Length="10"), "body size 10 exceeds body_size_limit 8", "size"),
        (reply(b"x" * 10), "body exceeds body_size_limit 8", "size"),
        (
            reply(b"6\r\nxxxxxx\r\n6\r\nxxxxxx\r\n0\r\n\r\n", Transfer_Encoding="chunked"),
            "body_size_limit",
            "size",
        ),
        (reply(b"zz\r\n", Transfer_Encoding="chunked"), "bad chunk size", "connection"),
        (
            reply(b"ab", Content_Length="4"),
            "peer closed connection without sending complete message body",
            "connection",
        ),
        (reply(b"", Content_Length="x"), "bad Content-Length", "connection"),
        (b"SSH-2.0-OpenSSH\r\n\r\n", "bad status line", "connection"),
        (b"HTTP/1.1 200 OK\r\nno colon here\r\n\r\n", "bad header line", "connection"),
        (
            b"HTTP/1.1 200 OK\r\nX: " + b"y" * (HEADER_LIMIT + 10) + b"\r\n\r\n",
            "response header over",
            "connection",
        ),
        (b"HTTP/1.1 200 OK\r\nContent-", "RemoteProtocolError: incomplete response header", "connection"),
    ],
)
async def test_bad_answers_are_scrape_errors_and_drop_the_connection(
    raw: RawServer, answer: bytes, message: str, kind: str
) -> None:
    raw.replies = [(answer, True)]
    get = HttpGet(raw.url(), HEADERS, 8)
    with pytest.raises(ScrapeError) as err:
        await get.get()
    assert message in str(err.value) and err.value.kind == kind
    assert not get.connected


async def test_no_answer_on_a_new_connection_is_not_retried(raw: RawServer) -> None:
    raw.replies = [(b"", True)]
    get = HttpGet(raw.url(), HEADERS, 1 << 20)
    with pytest.raises(ScrapeError, match="server disconnected without sending a response"):
        await get.get()
    assert raw.connections == 1


async def test_refused_is_a_connect_error() -> None:
    listener = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
    port = listener.sockets[0].getsockname()[1]
    listener.close()
    await listener.wait_closed()
    with pytest.raises(ScrapeError, match=r"^ConnectError: "):
        await HttpGet(f"http://127.0.0.1:{port}/metrics", HEADERS, 100).get()


async def test_a_cancelled_get_closes_its_connection(raw: RawServer) -> None:
    raw.replies = [
        (reply(b"a 1\n", Content_Length="4"), False),
        (b"HTTP/1.1 200 OK\r\n", False),
    ]  # then silence
    get = HttpGet(raw.url(), HEADERS, 1 << 20)
    await get.get()
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0.3):
            await get.get()
    assert not get.connected


@pytest.mark.parametrize(
    ("url", "host"),
    [
        ("http://[::1]:9090/metrics", "Host: [::1]:9090"),
        ("http://localhost/metrics", "Host: localhost\r"),
        ("https://localhost:443/m", "Host: localhost\r"),
    ],
)
def test_request_line_and_host(url: str, host: str) -> None:
    get = HttpGet(url, {"Authorization": "Bearer t", "Host": "evil"}, 1)
    request = get._request.decode()
    assert host in request and "evil" not in request and "Authorization: Bearer t\r\n" in request


@pytest.mark.parametrize("url", ["ftp://x/y", "http:///nohost", "replay://vllm/x"])
def test_only_http_urls(url: str) -> None:
    with pytest.raises(ValueError, match="not an http"):
        HttpGet(url, {}, 1)
