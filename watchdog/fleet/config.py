"""The `fleet:` section: the etcd cluster a group of watchdogs shares, and the group's disruption budget."""

from __future__ import annotations

import string
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from ..config.addresses import http_url
from ..config.durations import parse_duration
from ..config.httpclient import HttpClientConfig
from ..config.httpkeys import parse_http_client
from ..config.yamlnodes import Node
from ..redact import secret, url_password

FLEET_KEYS = {
    "endpoints",
    "group",
    "member",
    "max_disrupted",
    "lease_ttl",
    "request_timeout",
    "slot_wait",
    "correlated_share",
    "prefix",
    "tls_config",
    "basic_auth",
}
NAME_CHARS = frozenset(string.ascii_letters + string.digits + "_.:-")  # safe inside an etcd key path
MAX_NAME = 128
MAX_ENDPOINTS = 16


@dataclass(frozen=True)
class MaxDisrupted:
    """How many members of the group may run a disruptive action at once: a count, or a percentage of the
    group's live members, rounded down (fewer disruptions, where a Kubernetes PDB rounds up), at least one."""

    count: int | None = 1
    percent: float | None = None

    def limit(self, live: int) -> int:
        """The number of slots when `live` members are registered."""
        if self.percent is None:
            return self.count or 1
        return max(1, int(max(live, 1) * self.percent // 100))

    def __str__(self) -> str:
        return f"{self.percent:g}%" if self.percent is not None else str(self.count)


@dataclass(frozen=True)
class FleetConfig:
    """Where etcd is, which group this watchdog belongs to, and the group's disruption budget."""

    endpoints: tuple[str, ...] = field(default=("http://127.0.0.1:2379",), metadata=secret(url_password))
    group: str = "default"
    member: str = ""  # "": <hostname>:<listen port>
    max_disrupted: MaxDisrupted = field(default_factory=MaxDisrupted)
    lease_ttl: float = 10.0  # a dead watchdog's slots and membership vanish this long after its last renewal
    request_timeout: float = 2.0  # one etcd request on one endpoint
    slot_wait: float = 600.0  # how long a disruptive action waits for a slot before it is refused
    correlated_share: float | None = (
        0.5  # more than this share firing one alert holds the group (correlated.py)
    )
    prefix: str = "/vllm-watchdog"
    http: HttpClientConfig = field(default_factory=HttpClientConfig)  # tls_config, basic_auth


def _name(node: Node) -> str | None:
    text = node.string()
    if text is None:
        return None
    if not text or len(text) > MAX_NAME or not set(text) <= NAME_CHARS:
        node.error(f"must be 1-{MAX_NAME} characters of letters, digits, '_', '.', ':' and '-'")
        return None
    return text


def _endpoint(node: Node) -> str | None:
    url = node.parsed(http_url)
    if url is None:
        return None
    parts = urlsplit(url)
    if parts.path not in ("", "/") or parts.query or parts.fragment or parts.username:
        node.error("must be scheme://host:port only (the client adds /v3/...)")
        return None
    return url.rstrip("/")


def parse_max_disrupted(text: str) -> MaxDisrupted:
    """`3` (members) or `25%` (of the live members); ValueError otherwise."""
    text = text.strip()
    if text.endswith("%"):
        try:
            percent = float(text[:-1])
        except ValueError:
            percent = -1.0
        if not 0 < percent <= 100:
            raise ValueError(f"must be a count of at least 1 or a percentage in (0%, 100%], got {text!r}")
        return MaxDisrupted(count=None, percent=percent)
    if not text.isdigit() or int(text) < 1:
        raise ValueError(f"must be a count of at least 1 or a percentage in (0%, 100%], got {text!r}")
    return MaxDisrupted(count=int(text))


def _duration(m: dict[str, Node], key: str, default: float) -> float:
    if key not in m:
        return default
    value = m[key].parsed(parse_duration)
    if value is not None and value <= 0:
        m[key].error("must be greater than 0")
        return default
    return default if value is None else value


def parse_fleet(node: Node) -> FleetConfig | None:
    """The `fleet:` mapping; problems are reported on `node`'s Problems with file:line."""
    m = node.mapping(set(FLEET_KEYS))
    if m is None:
        return None
    d = FleetConfig()
    endpoints: list[str] = []
    if "endpoints" in m:
        for item in m["endpoints"].items():
            url = _endpoint(item)
            if url is not None:
                endpoints.append(url)
        if not endpoints or len(endpoints) > MAX_ENDPOINTS:
            m["endpoints"].error(f"must list 1 to {MAX_ENDPOINTS} etcd client URLs")
    http = parse_http_client(m, node, {})
    group = _name(m["group"]) if "group" in m else None
    member = _name(m["member"]) if "member" in m else None
    limit = m["max_disrupted"].parsed(parse_max_disrupted) if "max_disrupted" in m else None
    ttl = _duration(m, "lease_ttl", d.lease_ttl)
    if ttl < 2 or ttl != int(ttl):
        m["lease_ttl"].error("must be whole seconds, at least 2s (etcd grants leases in seconds)")
        ttl = d.lease_ttl
    timeout = _duration(m, "request_timeout", d.request_timeout)
    if timeout * 3 > ttl:
        m.get("request_timeout", node).error(
            "must be at most a third of lease_ttl: a renewal that times out must leave time for another"
        )
    share: float | None = d.correlated_share
    if "correlated_share" in m:
        share = _share(m["correlated_share"])
    prefix = m["prefix"].string() if "prefix" in m else None
    if prefix is not None and (not prefix.startswith("/") or not set(prefix) <= NAME_CHARS | {"/"}):
        m["prefix"].error("must start with '/' and hold only letters, digits, '/', '_', '.', ':' and '-'")
        prefix = None
    return FleetConfig(
        endpoints=tuple(endpoints) or d.endpoints,
        group=group or d.group,
        member=member or "",
        max_disrupted=limit or d.max_disrupted,
        lease_ttl=ttl,
        request_timeout=timeout,
        slot_wait=_duration(m, "slot_wait", d.slot_wait),
        correlated_share=share,
        prefix=(prefix or d.prefix).rstrip("/") or d.prefix,
        http=http,
    )


def _share(node: Node) -> float | None:
    if node.is_null():
        return None
    text = (node.scalar() or "").strip()
    try:
        value = float(text[:-1]) / 100 if text.endswith("%") else float(text)
    except ValueError:
        value = -1.0
    if not 0 < value < 1:
        node.error("must be a share between 0 and 1 (or 0% and 100%), exclusive, or null to turn it off")
        return FleetConfig().correlated_share
    return value
