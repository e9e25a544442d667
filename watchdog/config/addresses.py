"""Addresses in the config: `host:port` to listen on, and the http(s) URLs of targets and backends."""

from __future__ import annotations

import re
from urllib.parse import urlsplit


def parse_listen(text: str) -> tuple[str, int]:
    """Parse `host:port` or `[v6]:port`."""
    m = re.match(r"^(?:\[([0-9A-Fa-f:.]+)\]|([^:\[\]]+)):(\d{1,5})$", text)
    if m is None or not 0 < int(m.group(3)) < 65536:
        raise ValueError(f"must be host:port, e.g. 127.0.0.1:9460, got {text!r}")
    return (m.group(1) or m.group(2)), int(m.group(3))


def http_url(text: str) -> str:
    """The text itself if it is an http(s) URL with a host (and a valid port, if any); else ValueError."""
    parts = urlsplit(text)
    try:  # .port raises ValueError for a port that is not a number or out of range
        port_ok = parts.port is None or parts.port > 0
    except ValueError:
        port_ok = False
    if parts.scheme not in ("http", "https") or not parts.hostname or not port_ok:
        raise ValueError(f"must be an http(s) URL, got {text!r}")
    return text


def scrape_address(url: str) -> str:
    """Prometheus' `instance` of a target scraped at `url`: host:port as written, default port added."""
    parts = urlsplit(url)
    hostport = parts.netloc.rpartition("@")[2]
    if parts.port is None:
        hostport = hostport.rstrip(":") + (":443" if parts.scheme == "https" else ":80")
    return hostport
