"""The notifiers part of the config: `notifiers:`, parsed into frozen dataclasses.

The keys every kind shares are parsed here; each kind (a `NotifierKind` in KINDS, as Alertmanager's
config/notifiers.go declares each integration's config) adds its own keys and says which fields hold secrets.
Its sender is its module in this folder (`notifier.Notifier`, listed in `registry.py`). What a kind declares
secret is what `redact.config_secrets` masks, and it is noted while the file is read, so that `check` and a
reload mask it in their problems too.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from ..config.durations import parse_duration
from ..config.httpclient import HttpClientConfig
from ..config.httpkeys import HTTP_CLIENT_KEYS, parse_http_client
from ..config.yamlnodes import Node
from ..matchers import Matcher, parse_matchers
from ..redact import Extract, declared_secrets, secret, secret_headers, url_password

# A URL that is secret only in its password (or a token user part), and secret-named headers.
ENDPOINT_SECRETS: Mapping[str, Extract] = MappingProxyType({"url": url_password, "headers": secret_headers})


def _no_options(m: Mapping[str, Node]) -> None:
    return None


@dataclass(frozen=True)
class NotifierKind:
    """The config side of one kind of notifier: its `type:`, its own keys and which fields hold secrets."""

    type: str
    keys: frozenset[str] = frozenset()  # its own keys, beyond the common ones (url, headers, matchers, ...)
    secret_fields: Mapping[str, Extract] = field(default_factory=lambda: ENDPOINT_SECRETS)  # by field name
    # Its own keys of one entry, parsed into a frozen dataclass whose secret fields are declared; or None.
    options: Callable[[Mapping[str, Node]], Any] = _no_options


KINDS: dict[str, NotifierKind] = {k.type: k for k in (NotifierKind("alertmanager"), NotifierKind("webhook"))}

_COMMON_KEYS = {"type", "name", "url", "headers", "match", "match_re", "matchers", "timeout", "send_resolved"}
_COMMON_KEYS |= {"max_queue", "backoff_initial", "backoff_max"} | HTTP_CLIENT_KEYS


@dataclass(frozen=True)
class NotifierConfig:
    """Where alerts (and, for kinds that take them, action events) are delivered."""

    name: str
    type: str
    url: str = field(metadata=secret(url_password))  # as its kind declares it: secret_fields()
    headers: Mapping[str, str] = field(default_factory=dict, metadata=secret(secret_headers))
    matchers: tuple[Matcher, ...] = ()
    timeout: float = 10.0
    send_resolved: bool = True
    max_queue: int = 10_000
    backoff_initial: float = 1.0
    backoff_max: float = 300.0
    http: HttpClientConfig = field(default_factory=HttpClientConfig)  # TLS and credentials
    options: Any = None  # the kind's own keys, as it parsed them (a frozen dataclass declaring its secrets)

    def secret_fields(self) -> Mapping[str, Extract]:
        """Which of its fields hold secrets, as its kind declares them (read by `redact.config_secrets`)."""
        kind = KINDS.get(self.type)
        return kind.secret_fields if kind is not None else {}


def parse_notifier(node: Node, index: int, http_url: Callable[[str], str]) -> NotifierConfig | None:
    """One entry of `notifiers:`."""
    own = {key for kind in KINDS.values() for key in kind.keys}
    m = node.mapping(_COMMON_KEYS | own)
    if m is None:
        return None
    name = m["type"].string() if "type" in m else None
    for required in ("type", "url"):
        if required not in m:
            node.error("is required", field=f"{node.path}.{required}")
    kind = KINDS.get(name) if name is not None else None
    if name is not None and kind is None:
        m["type"].error(f"unknown notifier type {name!r} (known: {', '.join(KINDS)})")
    for key in sorted(own - (kind.keys if kind is not None else set())):
        if key in m and kind is not None:
            m[key].error(f"not a key of {kind.type} notifiers")
    text = m["url"].scalar() if "url" in m else None
    url = _url(m["url"], text, http_url) if text is not None else None
    d = NotifierConfig(name="-", type="-", url="-")
    durations = {}
    for key in ("timeout", "backoff_initial", "backoff_max"):
        durations[key] = (m[key].parsed(parse_duration) if key in m else None) or getattr(d, key)
    resolved = m["send_resolved"].boolean() if "send_resolved" in m else None
    queue = m["max_queue"].integer(minimum=1) if "max_queue" in m else None
    headers = (m["headers"].string_map() or {}) if "headers" in m else {}
    http = parse_http_client(m, node, headers)
    if kind is None:
        return None
    options = kind.options(m)
    _note_secrets(node, kind.secret_fields, {"url": text, "headers": headers}, options)
    if url is None:
        return None
    return NotifierConfig(
        name=(m["name"].string() if "name" in m else None) or f"{kind.type}-{index}",
        type=kind.type,
        url=url,
        headers=headers,
        matchers=parse_matchers(m),
        send_resolved=d.send_resolved if resolved is None else resolved,
        max_queue=queue or d.max_queue,
        http=http,
        options=options,
        **durations,
    )


def _url(node: Node, text: str, http_url: Callable[[str], str]) -> str | None:
    try:
        return http_url(text)
    except ValueError as exc:
        node.error(str(exc))
        return None


def _note_secrets(
    node: Node, declared: Mapping[str, Extract], values: Mapping[str, Any], options: Any
) -> None:
    """The values the kind declares secret, masked in every problem of the file from now on."""
    for name, value in values.items():
        if name in declared and value:
            node.problems.secrets.extend(declared[name](value))
    node.problems.secrets.extend(declared_secrets(options))
