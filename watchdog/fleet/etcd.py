"""A small asyncio client for etcd's v3 JSON gateway (`/v3/...`, served by etcd 3.4 and later on its client
port): ranges, puts, deletes, transactions, leases and one-shot watches, over httpx.

Why not a library: docs/fleet.md compares them. In short, the gRPC clients are either unmaintained, pinned to
one grpcio, without TLS or without asyncio, and the maintained gateway client is synchronous; the gateway
needs nothing but httpx, which the watchdog already uses with the same TLS settings as every other endpoint.

Every request has a deadline per endpoint and the client tries each configured endpoint once, beginning with
the last that answered: a dead member costs one refused connection, a cut-off one one timeout. Answers are
read up to MAX_BODY; keys and values are bytes on the wire (base64 in the JSON).
"""

from __future__ import annotations

import base64
import json
import ssl
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import httpx

from ..config.httpauth import ClientSettings, CredentialError, read_credential
from ..config.httpclient import HttpClientConfig
from ..errors import WatchdogError

MAX_BODY = 4 * 1024 * 1024  # an answer larger than this is refused (a range is limited well below it)
NOT_FOUND = 5  # gRPC NOT_FOUND: the lease is gone
UNAUTHENTICATED = 16
INVALID_TOKEN = "etcdserver: invalid auth token"


class EtcdError(WatchdogError):
    """etcd answered with an error (`code` is its gRPC code), or could not be reached (`code` -1)."""

    def __init__(self, message: str, code: int = -1) -> None:
        super().__init__(message)
        self.code = code

    @property
    def unreachable(self) -> bool:
        """No endpoint answered in time."""
        return self.code == -1


@dataclass(frozen=True)
class KeyValue:
    """One key as a range returns it."""

    key: bytes
    value: bytes
    create_revision: int
    mod_revision: int
    lease: int


@dataclass(frozen=True)
class Range:
    """A range's keys (at most its limit), how many matched in all, and the revision it was read at."""

    kvs: tuple[KeyValue, ...]
    count: int
    revision: int


def b64(data: bytes) -> str:
    """Bytes as the gateway's JSON carries them."""
    return base64.b64encode(data).decode("ascii")


def prefix_end(prefix: bytes) -> bytes:
    """The range end that covers every key starting with `prefix` (etcd's clientv3.GetPrefixRangeEnd)."""
    end = bytearray(prefix)
    for i in range(len(end) - 1, -1, -1):
        if end[i] < 0xFF:
            end[i] += 1
            return bytes(end[: i + 1])
    return b"\0"


def range_request(
    prefix: bytes,
    *,
    limit: int = 0,
    by_create: bool = False,
    count_only: bool = False,
    keys_only: bool = False,
) -> dict[str, Any]:
    """A RangeRequest over every key under `prefix` (also a txn operation's body)."""
    req: dict[str, Any] = {"key": b64(prefix), "range_end": b64(prefix_end(prefix))}
    if limit:
        req["limit"] = str(limit)
    if by_create:
        req |= {"sort_order": "ASCEND", "sort_target": "CREATE"}
    if count_only:
        req["count_only"] = True
    if keys_only:
        req["keys_only"] = True
    return req


def parse_range(body: Mapping[str, Any], revision: int = 0) -> Range:
    """A RangeResponse (or a txn's response_range) as a Range."""
    kvs = tuple(
        KeyValue(
            key=base64.b64decode(str(kv.get("key", ""))),
            value=base64.b64decode(str(kv.get("value", ""))),
            create_revision=int(kv.get("create_revision", 0)),
            mod_revision=int(kv.get("mod_revision", 0)),
            lease=int(kv.get("lease", 0)),
        )
        for kv in body.get("kvs", ())
    )
    header = body.get("header") or {}
    return Range(kvs, int(body.get("count", 0)), int(header.get("revision", revision)))


class EtcdClient:
    """The v3 JSON gateway of one etcd cluster, reached through any of its client URLs."""

    def __init__(
        self,
        endpoints: Sequence[str],
        http: HttpClientConfig,
        timeout: float,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.endpoints = tuple(endpoints)
        self.http = http
        self.timeout = timeout
        self._current = 0
        self._token: str | None = None
        settings = ClientSettings(http)
        try:
            verify: ssl.SSLContext | bool = settings.ssl_context() or True
        except CredentialError:
            verify = True  # `check` reported it; requests fail with the TLS error and are refused
        self.client = httpx.AsyncClient(
            trust_env=False,
            verify=verify,
            transport=transport,
            timeout=httpx.Timeout(timeout),
            limits=httpx.Limits(max_connections=16, max_keepalive_connections=len(self.endpoints) * 2),
        )

    @property
    def endpoint(self) -> str:
        """The endpoint the next request goes to first."""
        return self.endpoints[self._current]

    async def call(self, path: str, body: Mapping[str, Any], timeout: float | None = None) -> dict[str, Any]:
        """POST `body` to /v3/`path`; each endpoint once, from the last that answered. EtcdError if none
        answered (code -1) or etcd refused the request (its gRPC code)."""
        problems: list[str] = []
        for step in range(len(self.endpoints)):
            index = (self._current + step) % len(self.endpoints)
            try:
                answer = await self._post(self.endpoints[index], path, body, timeout or self.timeout)
            except (httpx.HTTPError, OSError, ValueError) as exc:
                problems.append(f"{self.endpoints[index]}: {_describe(exc)}")
                continue
            self._current = index
            return answer
        raise EtcdError("no etcd endpoint answered: " + "; ".join(problems))

    async def _post(self, url: str, path: str, body: Mapping[str, Any], timeout: float) -> dict[str, Any]:
        for attempt in range(2):
            headers = {"Authorization": self._token} if self._token else {}
            if self.http.basic_auth is not None and self._token is None:
                headers = {"Authorization": await self._authenticate(url, timeout)}
            status, answer = await self._send(f"{url}/v3/{path}", body, headers, timeout)
            if status == 200:
                return answer
            message = str(answer.get("error") or answer.get("message") or f"HTTP {status}")
            code = int(answer.get("code", -1)) if str(answer.get("code", "")).lstrip("-").isdigit() else -1
            if attempt == 0 and self.http.basic_auth is not None and INVALID_TOKEN in message:
                self._token = None  # expired simple token: authenticate again once
                continue
            if status >= 500 and code in (-1, 14):  # the member is unavailable: try the next one
                raise httpx.TransportError(message)
            raise EtcdError(message, code)
        raise EtcdError("authentication failed twice", UNAUTHENTICATED)

    async def _send(
        self, url: str, body: Mapping[str, Any], headers: Mapping[str, str], timeout: float
    ) -> tuple[int, dict[str, Any]]:
        request = self.client.build_request(
            "POST", url, content=json.dumps(body), headers=headers, timeout=timeout
        )
        response = await self.client.send(request, stream=True)
        try:
            data = bytearray()
            async for chunk in response.aiter_bytes():
                data += chunk
                if len(data) > MAX_BODY:
                    raise ValueError(f"answer larger than {MAX_BODY} bytes")
        finally:
            await response.aclose()
        answer = json.loads(data or b"{}")
        if not isinstance(answer, dict):
            raise ValueError("answer is not a JSON object")
        return response.status_code, answer

    async def _authenticate(self, url: str, timeout: float) -> str:
        basic = self.http.basic_auth
        assert basic is not None
        try:
            password = basic.password or read_credential(basic.password_file or "", "password_file")
        except CredentialError as exc:
            raise EtcdError(str(exc), UNAUTHENTICATED) from None
        body = {"name": basic.username, "password": password}
        status, answer = await self._send(f"{url}/v3/auth/authenticate", body, {}, timeout)
        if status != 200 or not answer.get("token"):
            raise EtcdError(f"etcd refused user {basic.username!r}: {answer.get('error', status)}", 16)
        self._token = str(answer["token"])
        return self._token

    # -- the operations ----------------------------------------------------------------------------------
    async def get_prefix(self, prefix: bytes, *, limit: int = 0, by_create: bool = False) -> Range:
        """The keys under `prefix` (linearizable), oldest first when `by_create`."""
        return parse_range(
            await self.call("kv/range", range_request(prefix, limit=limit, by_create=by_create))
        )

    async def put(self, key: bytes, value: bytes, lease: int = 0) -> int:
        """Write a key (attached to `lease` when given); the revision of the write."""
        body: dict[str, Any] = {"key": b64(key), "value": b64(value)}
        if lease:
            body["lease"] = str(lease)
        answer = await self.call("kv/put", body)
        return int((answer.get("header") or {}).get("revision", 0))

    async def delete(self, key: bytes) -> int:
        """Delete a key; how many were deleted."""
        return int((await self.call("kv/deleterange", {"key": b64(key)})).get("deleted", 0))

    async def txn(self, operations: Sequence[Mapping[str, Any]]) -> tuple[int, list[dict[str, Any]]]:
        """Operations applied at one revision (no comparisons); that revision and their responses."""
        answer = await self.call("kv/txn", {"success": list(operations)})
        return int((answer.get("header") or {}).get("revision", 0)), list(answer.get("responses", ()))

    async def grant(self, ttl: int) -> tuple[int, int]:
        """A new lease; its id and the TTL granted."""
        answer = await self.call("lease/grant", {"TTL": str(ttl)})
        if answer.get("error"):
            raise EtcdError(str(answer["error"]))
        return int(answer["ID"]), int(answer.get("TTL", ttl))

    async def keepalive(self, lease: int) -> int:
        """Renew a lease; the TTL it has now, 0 if it has expired (its keys are gone)."""
        answer = await self.call("lease/keepalive", {"ID": str(lease)})
        result = answer.get("result") or {}
        if "error" in answer and not result:
            raise EtcdError(str((answer["error"] or {}).get("message", answer["error"])))
        return int(result.get("TTL", 0))

    async def revoke(self, lease: int) -> None:
        """End a lease now: its keys are deleted."""
        try:
            await self.call("lease/revoke", {"ID": str(lease)})
        except EtcdError as exc:
            if exc.code != NOT_FOUND:
                raise

    async def status(self, endpoint: str) -> dict[str, Any]:
        """One member's status (its id, the leader's id, the raft term), asked of that member alone."""
        status, answer = await self._send(f"{endpoint}/v3/maintenance/status", {}, {}, self.timeout)
        if status != 200:
            raise EtcdError(str(answer.get("error", status)))
        return answer

    async def watch_once(self, prefix: bytes, after: int, timeout: float) -> bool:
        """Wait up to `timeout` for a change under `prefix` after revision `after`: True if one came (or the
        watch ended), False if none did. It only wakes a waiter, which then reads again: errors are False."""
        create = range_request(prefix) | {"start_revision": str(after + 1)}
        headers = {"Authorization": self._token} if self._token else {}
        request = self.client.build_request(
            "POST",
            f"{self.endpoint}/v3/watch",
            content=json.dumps({"create_request": create}),
            headers=headers,
            timeout=httpx.Timeout(self.timeout, read=timeout),
        )
        try:
            response = await self.client.send(request, stream=True)
        except (httpx.HTTPError, OSError):
            return False
        try:
            seen = 0
            async for line in response.aiter_lines():
                seen += len(line)
                if seen > MAX_BODY:
                    return True
                if '"events"' in line or '"canceled"' in line or '"error"' in line:
                    return True
            return True
        except (httpx.HTTPError, OSError):
            return False
        finally:
            await response.aclose()

    async def aclose(self) -> None:
        """Close the connections."""
        await self.client.aclose()


def _describe(exc: BaseException) -> str:
    if isinstance(exc, httpx.TimeoutException):
        return "timed out"
    return str(exc) or type(exc).__name__
