"""Rule expressions evaluated remotely: instant queries against Prometheus, Thanos or Mimir.

All three serve the same HTTP API (`GET <url>/api/v1/query?query=...&time=...`); Mimir needs its path
prefix in the url (e.g. `http://mimir:8080/prometheus`) and an `X-Scope-OrgID` header. The client is
`prometheus-api-client`, which is synchronous (requests): the daemon calls `PrometheusBackend.query`
through `asyncio.to_thread`, never on the event loop.
"""

from __future__ import annotations

import functools
import json
import ssl
import threading
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import requests
from prometheus_api_client import PrometheusConnect
from prometheus_api_client.exceptions import PrometheusApiClientException
from requests.adapters import HTTPAdapter
from urllib3.util.retry import Retry

from ..config.httpauth import ClientSettings, CredentialError, sign
from ..config.model import RemoteBackendConfig
from ..formats.gostrconv import parse_float
from ..store import Labels
from .values import QueryError, Sample, Vector, to_ms


def redact_url(url: str) -> str:
    """The url without credentials or query string, safe for logs and error messages."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    netloc = f"{host}:{parts.port}" if parts.port is not None else host
    return urlunsplit((parts.scheme, netloc, parts.path, "", ""))


class _TlsAdapter(HTTPAdapter):
    """Connections made with one SSLContext: the tls_config (CA, client certificate, server name)."""

    def __init__(self, context: ssl.SSLContext, retry: Retry) -> None:
        self.context = context
        super().__init__(max_retries=retry)

    def init_poolmanager(self, *args: Any, **kwargs: Any) -> None:
        """The pool manager, with our context for every https pool."""
        kwargs["ssl_context"] = self.context
        super().init_poolmanager(*args, **kwargs)


class PrometheusBackend:
    """A QueryFunc for a Prometheus-compatible server; every failure is a QueryError naming the server.

    `query` blocks for about `timeout` at most (plus one retried connect; `timeout` bounds each connect
    and each wait between received bytes); the server is also asked to give up after `timeout`. Proxy
    environment variables are ignored."""

    def __init__(
        self,
        url: str,
        *,
        headers: Mapping[str, str] | None = None,
        timeout: float = 10.0,
        verify_tls: bool = True,
        session: requests.Session | None = None,
        settings: ClientSettings | None = None,
    ) -> None:
        self.url = url.rstrip("/")
        self.name = redact_url(self.url)
        self.timeout = timeout
        self._local = threading.local()
        self.session = session if session is not None else requests.Session()
        self.session.trust_env = False  # no proxies or netrc from the environment
        self.session.verify = verify_tls
        self.session.hooks["response"].append(self._capture)
        # Retry only a failed connect, once; never a read (a timeout would double) nor a status.
        retry = Retry(
            total=1, connect=1, read=False, status=0, other=0, backoff_factor=0, raise_on_status=False
        )
        self.client = PrometheusConnect(
            url=self.url, headers=dict(headers or {}), retry=retry, session=self.session, timeout=timeout
        )
        self.settings = settings
        self._retry = retry
        self._tls: ssl.SSLContext | None = None  # the context mounted for self.url
        self._tls_lock = threading.Lock()
        if settings is not None and settings.config.authenticates:
            self.session.auth = functools.partial(sign, settings)  # credentials read at each request
        if settings is not None and settings.config.tls.insecure_skip_verify:
            self.session.verify = False

    def _mount_tls(self) -> None:
        """Mount an adapter with the tls_config's context, again when a TLS file changed."""
        if self.settings is None or not self.settings.custom_tls:
            return
        with self._tls_lock:
            context = self.settings.ssl_context()
            if context is not self._tls:
                self.session.mount(self.url, _TlsAdapter(context, self._retry))  # type: ignore[arg-type]
                self._tls = context

    def _capture(self, response: requests.Response, *args: Any, **kwargs: Any) -> None:
        self._local.response = response  # the library keeps the status and error body to itself

    def query(self, expr: str, at: float) -> Vector:
        """Evaluate `expr` as an instant query at unix time `at`; a scalar becomes one label-less sample."""
        self._local.response = None
        params = {"time": f"{at:.3f}", "timeout": f"{self.timeout:g}"}
        try:
            self._mount_tls()
            self.client.custom_query(expr, params=params)
        except CredentialError as exc:  # a TLS or credentials file that cannot be used (names no secret)
            raise QueryError(f"{self.name}: {exc}") from None
        except requests.Timeout as exc:
            raise QueryError(f"{self.name}: query timed out after {self.timeout:g}s") from exc
        except requests.RequestException as exc:
            response = self._local.response
            if response is None:
                raise QueryError(f"{self.name}: cannot query: {_reason(exc)}") from exc
        except (PrometheusApiClientException, ValueError, KeyError, TypeError):
            pass  # judged from the captured response below, which says more
        response = self._local.response
        if response is None:
            raise QueryError(f"{self.name}: no response")
        return parse_response(self.name, response.status_code, response.content, at)

    def close(self) -> None:
        """Close pooled connections."""
        self.session.close()


def parse_response(name: str, status: int, content: bytes, at: float) -> Vector:
    """Turn a /api/v1/query answer into a Vector, or raise a QueryError that explains it."""
    try:
        envelope = json.loads(content)
    except ValueError:
        envelope = None
    if not isinstance(envelope, dict):
        snippet = content[:200].decode("utf-8", "replace").strip()
        what = f"HTTP {status}: {snippet}" if status != 200 else "response is not a JSON object"
        raise QueryError(f"{name}: {what}")
    if envelope.get("status") != "success":
        kind = envelope.get("errorType") or "error"
        message = envelope.get("error") or "no error message"
        raise QueryError(f"{name}: HTTP {status}: {kind}: {message}")
    if status != 200:
        raise QueryError(f"{name}: HTTP {status} with a success body")
    data = envelope.get("data")
    if not isinstance(data, dict):
        raise QueryError(f"{name}: response has no data")
    try:
        return _convert(data.get("resultType"), data.get("result"), at)
    except (TypeError, ValueError, KeyError, IndexError) as exc:
        raise QueryError(f"{name}: malformed query result: {exc}") from exc


def _convert(kind: object, result: Any, at: float) -> Vector:
    if kind == "scalar":
        return Vector([Sample((), _float(result[1]), _ms(result[0]))])
    if kind == "vector":
        out = Vector()
        for item in result:
            labels: Labels = tuple(sorted((str(k), str(v)) for k, v in item["metric"].items()))
            t, value = item["value"]
            out.append(Sample(labels, _float(value), _ms(t)))
        return out
    if kind in ("matrix", "string"):
        raise ValueError(f"the expression returns a {kind}; rules need an instant vector or a scalar")
    raise ValueError(f"unknown resultType {kind!r}")


def _float(text: object) -> float:
    if not isinstance(text, str):
        raise ValueError(f"sample value {text!r} is not a string")
    return parse_float(text)  # as client_golang reads a SampleValue: strconv.ParseFloat


def _ms(t: object) -> int:
    if not isinstance(t, (int, float)):
        raise ValueError(f"timestamp {t!r} is not a number")
    return to_ms(float(t))


def _reason(exc: BaseException) -> str:
    """The root cause of a requests failure in a few words (no urls, which may hold the query)."""
    seen: set[int] = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        if isinstance(cur, OSError) and cur.strerror:
            return str(cur.strerror)
        nxt = getattr(cur, "reason", None)
        if not isinstance(nxt, BaseException) and cur.args and isinstance(cur.args[0], BaseException):
            nxt = cur.args[0]
        if not isinstance(nxt, BaseException):
            nxt = cur.__cause__ or cur.__context__
        cur = nxt
    if isinstance(exc, requests.exceptions.SSLError):
        return "TLS handshake or certificate verification failed"
    return type(exc).__name__


def backend_for(cfg: RemoteBackendConfig) -> PrometheusBackend:
    """The backend a config's `rule_backend.prometheus` block describes."""
    return PrometheusBackend(
        cfg.url,
        headers=dict(cfg.headers),
        timeout=cfg.timeout,
        verify_tls=cfg.verify_tls,
        settings=ClientSettings(cfg.http),
    )
