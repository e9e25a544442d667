"""What a client trusts and presents, at use: the SSLContext and Authorization header of an HttpClientConfig.

One `ClientSettings` per endpoint, kept with its client, so the context is built once and not per request.
Files are watched with a stat, the way Prometheus reads them on every request but cheaper: credential files
(`password_file`, `credentials_file`, `bearer_token_file`) before each request, TLS files (`ca_file`,
`cert_file`, `key_file`) whenever a connection is opened; a changed file is read again and a changed TLS file
rebuilds the context, so rotating a token or a certificate needs no reload. A file that cannot be used fails
that request with a CredentialError naming the file, never its contents. No httpx here: the gateway process
imports config/ and must stay without it.
"""

from __future__ import annotations

import base64
import os
import re
import socket
import ssl
from collections.abc import Callable
from typing import Any

from .files import UnreadableFileError, read_text
from .httpclient import HttpClientConfig, TlsConfig

TLS_VERSIONS = {
    "TLS10": ssl.TLSVersion.TLSv1,
    "TLS11": ssl.TLSVersion.TLSv1_1,
    "TLS12": ssl.TLSVersion.TLSv1_2,
    "TLS13": ssl.TLSVersion.TLSv1_3,
}
CREDENTIAL_LIMIT = 64 * 1024  # a token or a password; a larger file is not one
PEM_LIMIT = 1024 * 1024  # a CA bundle (the system's is about 200 KiB)
Stat = Callable[[str], os.stat_result]
_SSL_NOISE = re.compile(r"^\[[^\]]*\]\s*|\s*\(_ssl\.c:\d+\)$")  # "[SSL] PEM lib (_ssl.c:3926)"


class CredentialError(ValueError):
    """A TLS or credential file could not be used; `field` is its key (ca_file, key_file, ...)."""

    def __init__(self, message: str, field: str = "") -> None:
        super().__init__(message)
        self.field = field


class _NamedContext(ssl.SSLContext):
    """A client context that sends and verifies `server_name` whatever host the connection names (Go's
    tls.Config.ServerName): asyncio, httpx and urllib3 all pass the host in through these two methods."""

    server_name = ""

    def wrap_socket(
        self,
        sock: socket.socket,
        server_side: bool = False,
        do_handshake_on_connect: bool = True,
        suppress_ragged_eofs: bool = True,
        server_hostname: str | bytes | None = None,
        session: ssl.SSLSession | None = None,
    ) -> ssl.SSLSocket:
        """Wrap a socket, naming `server_name`."""
        return super().wrap_socket(
            sock, server_side, do_handshake_on_connect, suppress_ragged_eofs, self.server_name, session
        )

    def wrap_bio(
        self,
        incoming: ssl.MemoryBIO,
        outgoing: ssl.MemoryBIO,
        server_side: bool = False,
        server_hostname: str | bytes | None = None,
        session: ssl.SSLSession | None = None,
    ) -> ssl.SSLObject:
        """Wrap a pair of memory BIOs, naming `server_name`."""
        return super().wrap_bio(incoming, outgoing, server_side, self.server_name, session)


def _reason(exc: BaseException) -> str:
    """Why a file could not be used, in words: OpenSSL's reason without its codes, or the system's."""
    if isinstance(exc, ssl.SSLError):
        text = _SSL_NOISE.sub("", str(exc.reason or exc.strerror or "")).lower().replace("_", " ")
        return "not a PEM certificate or private key" if text in ("", "pem lib") else text
    if isinstance(exc, OSError):
        return exc.strerror or type(exc).__name__
    return str(exc)


def _no_passphrase() -> str:
    raise CredentialError("is encrypted; give the watchdog an unencrypted key", "key_file")


def build_ssl_context(tls: TlsConfig) -> ssl.SSLContext:
    """A client context as `tls` describes it: its CA (else the system's), its client certificate, its
    server name and minimum version; CredentialError names the file that could not be used."""
    ctx = (
        _NamedContext(ssl.PROTOCOL_TLS_CLIENT) if tls.server_name else ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    )
    if tls.server_name:
        ctx.server_name = tls.server_name  # type: ignore[attr-defined]
    if tls.ca_file is None:
        ctx.load_default_certs(ssl.Purpose.SERVER_AUTH)
    else:
        try:  # read_text refuses FIFOs and devices, which load_verify_locations would block on
            ctx.load_verify_locations(cadata=read_text(tls.ca_file, PEM_LIMIT))
        except (UnreadableFileError, ssl.SSLError, ValueError) as exc:
            raise CredentialError(
                f"ca_file {tls.ca_file} cannot be used: {_reason(exc)}", "ca_file"
            ) from None
    if tls.cert_file is not None and tls.key_file is not None:
        for key, path in (("cert_file", tls.cert_file), ("key_file", tls.key_file)):
            try:
                read_text(path, PEM_LIMIT)
            except UnreadableFileError as exc:
                raise CredentialError(f"{key} {path} cannot be read: {exc}", key) from None
        try:
            ctx.load_cert_chain(tls.cert_file, tls.key_file, password=_no_passphrase)
        except CredentialError as exc:
            raise CredentialError(f"key_file {tls.key_file} {exc}", "key_file") from None
        except (ssl.SSLError, OSError) as exc:
            message = (
                f"cert_file {tls.cert_file} and key_file {tls.key_file} do not go together: {_reason(exc)}"
            )
            raise CredentialError(message, "key_file") from None
    if tls.insecure_skip_verify:
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    if tls.min_version is not None:
        ctx.minimum_version = TLS_VERSIONS[tls.min_version]
    return ctx


def read_credential(path: str, what: str) -> str:
    """A password or token from its file, surrounding whitespace removed (as Prometheus trims it)."""
    try:
        return read_text(path, CREDENTIAL_LIMIT).strip()
    except UnreadableFileError as exc:
        raise CredentialError(f"{what} {path} cannot be read: {exc}", what) from None


def _signature(stat: Stat, path: str) -> tuple[int, ...]:
    try:
        st = stat(path)
    except OSError as exc:
        return (-1, exc.errno or 0)
    return (st.st_ino, st.st_dev, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


class _WatchedFile:
    """A credential file, read again when its stat changes."""

    def __init__(self, path: str, what: str, stat: Stat) -> None:
        self.path, self.what, self.stat = path, what, stat
        self._signature: tuple[int, ...] | None = None
        self._value = ""

    def value(self) -> str:
        signature = _signature(self.stat, self.path)
        if signature != self._signature:
            self._value = read_credential(self.path, self.what)  # raises: the next request tries again
            self._signature = signature
        return self._value


class ClientSettings:
    """The SSLContext and the Authorization header of one endpoint's HttpClientConfig."""

    def __init__(self, config: HttpClientConfig, stat: Stat = os.stat) -> None:
        self.config = config
        self._stat = stat
        tls = config.tls
        self.custom_tls = tls.custom
        self._tls_files = tuple(p for p in (tls.ca_file, tls.cert_file, tls.key_file) if p is not None)
        self._tls_signature: tuple[tuple[int, ...], ...] | None = None
        self._context: ssl.SSLContext | None = None
        self._fixed: str | None = None  # the header when no file is involved
        self._file: _WatchedFile | None = None
        self._scheme = ""
        self._last = ("", "")  # the file's last value and the header made of it
        if config.basic_auth is not None:
            basic = config.basic_auth
            if basic.password_file is not None:
                self._file = _WatchedFile(basic.password_file, "password_file", stat)
            else:
                self._fixed = _basic(basic.username, basic.password or "")
        elif config.authorization is not None:
            auth = config.authorization
            self._scheme = auth.type
            if auth.credentials_file is not None:
                self._file = _WatchedFile(auth.credentials_file, auth.file_key, stat)
            else:
                self._fixed = f"{auth.type} {auth.credentials or ''}"

    def ssl_context(self) -> ssl.SSLContext | None:
        """The context for a new connection (None: nothing custom, the caller's default); rebuilt when a TLS
        file changed since it was built. CredentialError when it cannot be built."""
        if not self.custom_tls:
            return None
        signature = tuple(_signature(self._stat, p) for p in self._tls_files)
        if self._context is None or signature != self._tls_signature:
            self._context = build_ssl_context(self.config.tls)
            self._tls_signature = signature
        return self._context

    def authorization(self) -> str | None:
        """The Authorization header value for the next request (None: none); CredentialError if its file
        cannot be read."""
        if self._file is None:
            return self._fixed
        value = self._file.value()
        if value != self._last[0]:
            basic = self.config.basic_auth
            header = _basic(basic.username, value) if basic is not None else f"{self._scheme} {value}"
            self._last = (value, header)
        return self._last[1]


def sign(settings: ClientSettings, request: Any) -> Any:
    """Set the Authorization header of an outgoing httpx or requests request, unless it has one (a canary's
    own API key); both libraries take this, bound with functools.partial, as their `auth`."""
    if "authorization" not in request.headers:
        value = settings.authorization()
        if value is not None:
            request.headers["Authorization"] = value
    return request


def _basic(username: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{username}:{password}".encode()).decode("ascii")
