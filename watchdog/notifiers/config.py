"""The notifiers part of the config: `notifiers:`, parsed into frozen dataclasses."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from ..config.durations import parse_duration
from ..config.httpclient import HTTP_CLIENT_KEYS, HttpClientConfig, parse_http_client
from ..config.yamlnodes import Node
from ..matchers import Matcher, parse_matchers

NOTIFIER_TYPES = ("alertmanager", "webhook")


@dataclass(frozen=True)
class NotifierConfig:
    """Where alerts (and, for webhooks, action events) are delivered."""

    name: str
    type: str
    url: str
    headers: Mapping[str, str] = field(default_factory=dict)
    matchers: tuple[Matcher, ...] = ()
    timeout: float = 10.0
    send_resolved: bool = True
    max_queue: int = 10_000
    backoff_initial: float = 1.0
    backoff_max: float = 300.0
    http: HttpClientConfig = field(default_factory=HttpClientConfig)  # TLS and credentials


def parse_notifier(node: Node, index: int, http_url: Callable[[str], str]) -> NotifierConfig | None:
    """One entry of `notifiers:`."""
    keys = {"type", "name", "url", "headers", "match", "match_re", "matchers", "timeout", "send_resolved"}
    m = node.mapping(keys | {"max_queue", "backoff_initial", "backoff_max"} | HTTP_CLIENT_KEYS)
    if m is None:
        return None
    kind = m["type"].string() if "type" in m else None
    for required in ("type", "url"):
        if required not in m:
            node.error("is required", field=f"{node.path}.{required}")
    if kind is not None and kind not in NOTIFIER_TYPES:
        m["type"].error(f"unknown notifier type {kind!r} (known: {', '.join(NOTIFIER_TYPES)})")
        kind = None
    url = m["url"].parsed(http_url) if "url" in m else None
    d = NotifierConfig(name="-", type="-", url="-")
    durations = {}
    for key in ("timeout", "backoff_initial", "backoff_max"):
        durations[key] = (m[key].parsed(parse_duration) if key in m else None) or getattr(d, key)
    resolved = m["send_resolved"].boolean() if "send_resolved" in m else None
    queue = m["max_queue"].integer(minimum=1) if "max_queue" in m else None
    headers = (m["headers"].string_map() or {}) if "headers" in m else {}
    http = parse_http_client(m, node, headers)
    if kind is None or not isinstance(url, str):
        return None
    return NotifierConfig(
        name=(m["name"].string() if "name" in m else None) or f"{kind}-{index}",
        type=kind,
        url=url,
        headers=headers,
        matchers=parse_matchers(m),
        send_resolved=d.send_resolved if resolved is None else resolved,
        max_queue=queue or d.max_queue,
        http=http,
        **durations,
    )
