"""A real HTTP server on 127.0.0.1 whose responses tests program: bodies, statuses, delays, resets; over TLS
when given a server context (tests/support/tlsfiles.py makes them)."""

from __future__ import annotations

import json
import socket
import ssl
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class Reply:
    """What one path answers."""

    body: bytes = b""
    status: int = 200
    delay: float = 0.0
    content_type: str = "text/plain; version=0.0.4"
    close_early: bool = False  # send headers claiming a longer body, then drop the connection
    headers: dict[str, str] = field(default_factory=dict)
    authorization: str | None = None  # when set, a request without this Authorization header gets a 401
    render: Callable[[], bytes] | None = None  # makes the body at each request (a counter that grows)


class _TlsServer(ThreadingHTTPServer):
    """The handshake runs in each request's thread, so a client that fails it holds up nobody else."""

    tls: ssl.SSLContext

    def finish_request(self, request: Any, client_address: Any) -> None:
        """Wrap the accepted socket, then serve it."""
        assert isinstance(request, socket.socket)
        super().finish_request(self.tls.wrap_socket(request, server_side=True), client_address)


class FaultServer:
    """Serves programmed replies; records every request (method, path, body)."""

    def __init__(self, tls: ssl.SSLContext | None = None) -> None:
        self.replies: dict[str, Reply] = {}
        self.requests: list[tuple[str, str, bytes]] = []
        self.authorizations: list[tuple[str, str | None]] = []  # (path, Authorization header)
        self.peers: list[tuple[str, int]] = []  # the client address of each request: one port per connection
        self.client_certs: list[str] = []  # over TLS: the client certificate's common name ("" for none)
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def _serve(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                body = self.rfile.read(length) if length else b""
                path = self.path.split("?")[0]
                outer.requests.append((self.command, path, body))
                outer.authorizations.append((path, self.headers.get("authorization")))
                outer.peers.append(self.client_address)
                if isinstance(self.connection, ssl.SSLSocket):
                    cert = self.connection.getpeercert() or {}
                    names = [v for rdn in cert.get("subject", ()) for k, v in rdn if k == "commonName"]
                    outer.client_certs.append(names[0] if names else "")
                reply = outer.replies.get(path, Reply(b"not found", 404))
                if (
                    reply.authorization is not None
                    and self.headers.get("authorization") != reply.authorization
                ):
                    reply = Reply(b"unauthorized", 401, headers={"WWW-Authenticate": 'Basic realm="test"'})
                if reply.delay:
                    time.sleep(reply.delay)
                body = reply.render() if reply.render is not None else reply.body
                self.send_response(reply.status)
                self.send_header("Content-Type", reply.content_type)
                size = len(body) * (2 if reply.close_early else 1)
                self.send_header("Content-Length", str(size))
                for k, v in reply.headers.items():
                    self.send_header(k, v)
                self.end_headers()
                try:
                    self.wfile.write(body)
                    self.wfile.flush()
                except (BrokenPipeError, ConnectionResetError):
                    return
                if reply.close_early:
                    self.close_connection = True

            do_GET = _serve
            do_POST = _serve

        if tls is None:
            self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        else:
            self.httpd = _TlsServer(("127.0.0.1", 0), Handler)
            self.httpd.tls = tls
        self.httpd.daemon_threads = True
        # Clients that time out or drop connections on purpose are expected here, not errors to print.
        self.httpd.handle_error = lambda request, client_address: None  # type: ignore[method-assign]
        self.port = self.httpd.server_address[1]
        self.url = f"{'https' if tls else 'http'}://127.0.0.1:{self.port}"
        self._thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self._thread.start()

    def set(self, path: str, body: bytes | str | dict[str, Any] = b"", **kw: Any) -> None:
        """Program a path's reply."""
        if isinstance(body, dict):
            body, kw["content_type"] = json.dumps(body).encode(), "application/json"
        elif isinstance(body, str):
            body = body.encode()
        self.replies[path] = Reply(body=body, **kw)

    def vllm_like(self, metrics: str, model: str = "tiny") -> None:
        """Answer like a healthy vLLM: /metrics, /health, /v1/models and /v1/completions."""
        self.set("/metrics", metrics)
        self.set("/health", b"")
        self.set("/v1/models", {"object": "list", "data": [{"id": model, "object": "model"}]})
        self.set(
            "/v1/completions",
            {"choices": [{"text": "x"}], "usage": {"prompt_tokens": 1, "completion_tokens": 1}},
        )

    def close(self) -> None:
        """Stop serving."""
        self.httpd.shutdown()
        self.httpd.server_close()
