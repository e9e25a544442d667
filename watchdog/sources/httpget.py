"""A lean HTTP/1.1 GET for scrapes: one keep-alive connection per target on asyncio streams.

A scrape is one small GET a second to a server on the same host. httpx pays about 1.5 ms of CPU per request
for its generality (a pool rescanned per request, header models, event hooks); this client pays for reading
the status line, the headers and the body, and nothing else. It keeps the bounds a scrape needs: a body size
limit checked before and while reading, a cap on the header block, and the caller's deadline over the whole
exchange (asyncio.timeout around `get`). Error messages keep httpx's class names (ConnectError,
RemoteProtocolError), which operators and the replay log already know.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from urllib.parse import urlsplit

from ..config.httpauth import ClientSettings, CredentialError
from ..errors import ScrapeError

HEADER_LIMIT = 64 * 1024  # the whole status line and header block; Go's http.DefaultMaxHeaderBytes is 1 MiB
_CHUNK = 256 * 1024

Connector = Callable[..., Awaitable[tuple[asyncio.StreamReader, asyncio.StreamWriter]]]


@dataclass(frozen=True)
class Response:
    """A whole response: status code, lower-cased headers, body bytes."""

    status: int
    headers: Mapping[str, str]
    body: bytes


class _Closed(Exception):
    """The server closed a reused connection before answering: retry once on a new one."""


class HttpGet:
    """GETs of one URL over one kept-alive connection; `aclose` closes it.

    `settings` (the target's TLS and credentials) are asked for the Authorization header before each request
    and for the SSLContext when a connection opens; without them a request costs nothing extra."""

    def __init__(
        self,
        url: str,
        headers: Mapping[str, str],
        body_size_limit: int,
        ssl_context: ssl.SSLContext | None = None,
        connect: Connector = asyncio.open_connection,
        settings: ClientSettings | None = None,
    ) -> None:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an http(s) URL: {url!r}")
        self.host = parts.hostname
        self.port = parts.port or (443 if parts.scheme == "https" else 80)
        https = parts.scheme == "https"
        # The settings' own context, if any, is asked for at each connect (a TLS file may change).
        self._own_tls = https and settings is not None and settings.custom_tls
        self.ssl = (ssl_context or ssl.create_default_context()) if https and not self._own_tls else None
        path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        host = f"[{self.host}]" if ":" in self.host else self.host
        default_port = 443 if parts.scheme == "https" else 80
        authority = host if self.port == default_port else f"{host}:{self.port}"
        lines = [f"GET {path} HTTP/1.1", f"Host: {authority}"]
        lines += [f"{k}: {v}" for k, v in headers.items() if k.lower() != "host"]
        self._lines = lines
        self._request = _encode(lines)
        # Settings that change nothing for this URL (no credentials, and plain http) cost nothing per request.
        used = settings is not None and (settings.config.authenticates or self._own_tls)
        self._settings = settings if used else None
        self._authorization: str | None = None  # the header value in self._request
        self.body_size_limit = body_size_limit
        self._connect = connect
        self._conn: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None

    async def get(self) -> Response:
        """One GET. ScrapeError on any failure; the connection is closed after a failure or a cancellation."""
        reused = self._conn is not None
        try:
            try:
                return await self._exchange()
            except _Closed:
                await self.aclose()
                if not reused:
                    raise
                return await self._exchange()  # the server had closed the idle connection: one fresh try
        except _Closed:
            await self.aclose()
            raise ScrapeError("RemoteProtocolError: server disconnected without sending a response") from None
        except BaseException:
            await self.aclose()
            raise

    def _authorize(self, settings: ClientSettings) -> None:
        """Put the current Authorization header into the request bytes, re-encoded only when it changed."""
        try:
            value = settings.authorization()
        except CredentialError as exc:
            raise ScrapeError(f"no credentials: {exc}") from None
        if value != self._authorization:
            extra = [] if value is None else [f"Authorization: {value}"]
            try:
                self._request, self._authorization = _encode(self._lines + extra), value
            except UnicodeEncodeError:
                raise ScrapeError("no credentials: they must be Latin-1 text to go in a header") from None

    async def _exchange(self) -> Response:
        if self._settings is not None:
            self._authorize(self._settings)
        reader, writer = await self._connection()
        try:
            writer.write(self._request)
            await writer.drain()
            head = await reader.readuntil(b"\r\n\r\n")
        except (asyncio.IncompleteReadError, ConnectionError) as exc:
            if isinstance(exc, asyncio.IncompleteReadError) and exc.partial:
                raise ScrapeError("RemoteProtocolError: incomplete response header") from exc
            raise _Closed from exc
        except asyncio.LimitOverrunError as exc:
            raise ScrapeError(f"RemoteProtocolError: response header over {HEADER_LIMIT} bytes") from exc
        except ssl.SSLError as exc:
            # e.g. a server that wants a client certificate: TLS 1.3 says so after the handshake
            raise ScrapeError(f"RemoteProtocolError: TLS: {_tls_reason(exc)}") from exc
        status, headers, keep = _parse_head(head)
        body = await self._body(reader, headers)
        if not keep:
            await self.aclose()
        return Response(status, headers, body)

    async def _connection(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        if self._conn is None:
            tls = self.ssl
            if self._own_tls and self._settings is not None:
                try:
                    tls = self._settings.ssl_context()
                except CredentialError as exc:
                    raise ScrapeError(f"ConnectError: TLS settings: {exc}") from None
            try:
                self._conn = await self._connect(self.host, self.port, ssl=tls, limit=HEADER_LIMIT)
            except ssl.SSLCertVerificationError as exc:
                raise ScrapeError(
                    f"ConnectError: TLS certificate verification failed: {exc.verify_message}"
                ) from exc
            except ssl.SSLError as exc:
                raise ScrapeError(f"ConnectError: TLS: {_tls_reason(exc)}") from exc
            except OSError as exc:
                raise ScrapeError(f"ConnectError: {exc}") from exc
        return self._conn

    async def _body(self, reader: asyncio.StreamReader, headers: Mapping[str, str]) -> bytes:
        limit = self.body_size_limit
        try:
            if _is_chunked(headers):
                return await _chunked(reader, limit)
            declared = headers.get("content-length")
            if declared is not None:
                if not declared.strip().isdigit():
                    raise ScrapeError(f"RemoteProtocolError: bad Content-Length {declared[:40]!r}")
                size = int(declared)
                if size > limit:
                    raise ScrapeError(f"body size {size} exceeds body_size_limit {limit}", "size")
                return await reader.readexactly(size)
            return await _until_eof(reader, limit)
        except (asyncio.IncompleteReadError, ConnectionError) as exc:
            raise ScrapeError(
                "RemoteProtocolError: peer closed connection without sending complete message body"
            ) from exc
        except asyncio.LimitOverrunError as exc:
            raise ScrapeError(f"RemoteProtocolError: chunk header over {HEADER_LIMIT} bytes") from exc
        except ssl.SSLError as exc:
            raise ScrapeError(f"RemoteProtocolError: TLS: {_tls_reason(exc)}") from exc

    @property
    def connected(self) -> bool:
        """Whether a kept-alive connection is open."""
        return self._conn is not None

    async def aclose(self) -> None:
        """Close the connection, if any."""
        conn, self._conn = self._conn, None
        if conn is not None:
            conn[1].close()


def _tls_reason(exc: ssl.SSLError) -> str:
    """OpenSSL's reason in words (`tlsv13 alert certificate required`), else the whole message."""
    return str(exc.reason).lower().replace("_", " ") if exc.reason else str(exc)


def _encode(lines: list[str]) -> bytes:
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def _parse_head(head: bytes) -> tuple[int, dict[str, str], bool]:
    """Status code, headers (lower-cased names; a repeated one keeps its last value) and whether the
    connection may be kept."""
    lines = head.decode("latin-1").split("\r\n")
    version, _, rest = lines[0].partition(" ")
    code = rest[:3]
    if not version.startswith("HTTP/1.") or not code.isdigit():
        raise ScrapeError(f"RemoteProtocolError: bad status line {lines[0][:80]!r}")
    headers: dict[str, str] = {}
    for line in lines[1:]:
        if not line:
            continue
        name, sep, value = line.partition(":")
        if not sep:
            raise ScrapeError(f"RemoteProtocolError: bad header line {line[:80]!r}")
        headers[name.strip().lower()] = value.strip()
    connection = headers.get("connection", "").lower()
    keep = "close" not in connection and (version != "HTTP/1.0" or "keep-alive" in connection)
    if "content-length" not in headers and not _is_chunked(headers):
        keep = False  # the body ends when the server closes
    return int(code), headers, keep


def _is_chunked(headers: Mapping[str, str]) -> bool:
    """Whether the body comes in chunks (Transfer-Encoding wins over Content-Length, as RFC 9112 says)."""
    return "chunked" in headers.get("transfer-encoding", "").lower()


async def _chunked(reader: asyncio.StreamReader, limit: int) -> bytes:
    """A chunked body, bounded by `limit`; trailers are read and dropped."""
    parts: list[bytes] = []
    size = 0
    while True:
        line = await reader.readuntil(b"\r\n")
        field = line.split(b";", 1)[0].strip()
        try:
            n = int(field, 16)
        except ValueError:
            raise ScrapeError(f"RemoteProtocolError: bad chunk size {field[:20]!r}") from None
        if n == 0:
            break
        size += n
        if size > limit or n < 0:
            raise ScrapeError(f"body exceeds body_size_limit {limit}", "size")
        parts.append(await reader.readexactly(n))
        if await reader.readexactly(2) != b"\r\n":
            raise ScrapeError("RemoteProtocolError: chunk not followed by CRLF")
    while (await reader.readuntil(b"\r\n")) != b"\r\n":
        pass  # trailer fields
    return b"".join(parts)


async def _until_eof(reader: asyncio.StreamReader, limit: int) -> bytes:
    """A body that ends when the server closes the connection, bounded by `limit`."""
    parts: list[bytes] = []
    size = 0
    while chunk := await reader.read(_CHUNK):
        size += len(chunk)
        if size > limit:
            raise ScrapeError(f"body exceeds body_size_limit {limit}", "size")
        parts.append(chunk)
    return b"".join(parts)
