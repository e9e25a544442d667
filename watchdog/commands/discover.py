"""What `vllm-watchdog init` finds on this host: the TCP ports listening on loopback or on every address
(read from /proc/net/tcp and tcp6, no psutil), each asked briefly whether it is a vLLM (`/metrics` with
`vllm:` series, or `/v1/models` owned by vllm), and the Docker containers that publish them, when a Docker
engine answers on its socket (quietly skipped otherwise)."""

from __future__ import annotations

import asyncio
import json
import os
import socket
from collections.abc import Collection, Iterable
from dataclasses import dataclass, field

import httpx

LISTEN = "0A"  # TCP_LISTEN in /proc/net/tcp's `st` column
MAX_CANDIDATES = 256  # ports probed at most, the usual vLLM ports first
CONCURRENCY = 32
PROBE_TIMEOUT = 0.5
MAX_BODY = 1 << 20  # bytes of /metrics read: the first vLLM series comes long before
DOCKER_SOCKET = "/var/run/docker.sock"
_LOCAL_V4 = {"127.0.0.1": "127.0.0.1", "0.0.0.0": "127.0.0.1"}
_LOCAL_V6 = {"::1": "[::1]", "::": "[::1]"}


@dataclass(frozen=True)
class Found:
    """A port that answered like vLLM."""

    url: str  # http://127.0.0.1:8000
    port: int
    models: tuple[str, ...] = ()
    started: str = ""  # process_start_time_seconds of its /metrics: ports that share it are one server
    container: str = ""  # the Docker container publishing it, if Docker says so


@dataclass
class Discovery:
    """Every vLLM found, and what else is worth a comment in the written config."""

    found: list[Found] = field(default_factory=list)
    duplicates: list[tuple[Found, Found]] = field(default_factory=list)  # (another port, the server it is)
    probed: int = 0
    skipped: int = 0  # candidates beyond MAX_CANDIDATES
    taken: frozenset[int] = frozenset()  # every port listening on loopback or every address


def _ipv4(hex_addr: str) -> str:
    raw = bytes.fromhex(hex_addr)[::-1]  # one little-endian 32-bit word
    return socket.inet_ntop(socket.AF_INET, raw)


def _ipv6(hex_addr: str) -> str:
    raw = b"".join(bytes.fromhex(hex_addr[i : i + 8])[::-1] for i in range(0, 32, 8))
    return socket.inet_ntop(socket.AF_INET6, raw)


def listening(tables: Iterable[tuple[str, str]]) -> dict[int, str]:
    """Port -> the host to ask (127.0.0.1 or [::1]) of each socket listening on loopback or every address;
    `tables` are (family "4" or "6", the text of /proc/net/tcp or tcp6)."""
    out: dict[int, str] = {}
    for family, text in tables:
        for line in text.splitlines()[1:]:
            cols = line.split()
            if len(cols) < 4 or cols[3] != LISTEN or ":" not in cols[1]:
                continue
            addr_hex, port_hex = cols[1].rsplit(":", 1)
            try:
                addr = _ipv4(addr_hex) if family == "4" else _ipv6(addr_hex)
                port = int(port_hex, 16)
            except ValueError:
                continue
            host = (_LOCAL_V4 if family == "4" else _LOCAL_V6).get(addr)
            if host is not None and (port not in out or host == "127.0.0.1"):
                out[port] = host
    return out


def proc_tables(root: str = "/proc/net") -> list[tuple[str, str]]:
    """The text of /proc/net/tcp and tcp6, whichever can be read."""
    out = []
    for family, name in (("4", "tcp"), ("6", "tcp6")):
        try:
            with open(os.path.join(root, name), encoding="ascii", errors="replace") as f:
                out.append((family, f.read()))
        except OSError:
            continue
    return out


def _order(ports: Collection[int]) -> list[int]:
    """vLLM's usual ports (8000-8099) first, then the rest, each ascending."""
    return sorted(ports, key=lambda p: (not 8000 <= p < 8100, p))


async def _head(client: httpx.AsyncClient, url: str) -> str:
    """At most MAX_BODY bytes of a 200 answer's body, as text; "" for anything else."""
    async with client.stream("GET", url) as resp:
        if resp.status_code != 200:
            return ""
        body = b""
        async for chunk in resp.aiter_bytes():
            body += chunk
            if len(body) >= MAX_BODY:
                break
        return body[:MAX_BODY].decode("utf-8", "replace")


def _start_time(metrics: str) -> str:
    for line in metrics.splitlines():
        if line.startswith("process_start_time_seconds "):
            return line.split()[1]
    return ""


async def _probe(client: httpx.AsyncClient, host: str, port: int) -> Found | None:
    """A Found if the port answers like vLLM, else None (whatever it answers, or if it does not)."""
    base = f"http://{host}:{port}"
    try:
        metrics = await _head(client, base + "/metrics")
        models_text = await _head(client, base + "/v1/models")
    except (httpx.HTTPError, OSError, UnicodeError):
        return None
    models: list[dict[str, object]] = []
    try:
        doc = json.loads(models_text) if models_text else {}
        if isinstance(doc, dict) and isinstance(doc.get("data"), list):
            models = [m for m in doc["data"] if isinstance(m, dict)]
    except ValueError:
        pass
    vllm_metrics = any(line.startswith("vllm:") for line in metrics.splitlines())
    if not vllm_metrics and not any(m.get("owned_by") == "vllm" for m in models):
        return None
    names = tuple(str(m.get("id")) for m in models if m.get("id"))
    return Found(base, port, names, _start_time(metrics))


async def _probe_all(candidates: dict[int, str]) -> list[Found]:
    limit = asyncio.Semaphore(CONCURRENCY)
    timeout = httpx.Timeout(PROBE_TIMEOUT)
    async with httpx.AsyncClient(timeout=timeout, trust_env=False, follow_redirects=False) as client:

        async def one(port: int) -> Found | None:
            async with limit:
                return await _probe(client, candidates[port], port)

        results = await asyncio.gather(*(one(p) for p in candidates))
    return [f for f in results if f is not None]


def docker_ports(socket_path: str) -> dict[int, str]:
    """Host port -> name of each running container that publishes it or runs with `--port N` on the host
    network; {} when no Docker engine answers there (quietly: Docker is optional)."""
    if not os.path.exists(socket_path):
        return {}
    transport = httpx.HTTPTransport(uds=socket_path)
    try:
        with httpx.Client(transport=transport, timeout=1.0, trust_env=False) as client:
            containers = client.get("http://docker/containers/json").json()
    except (httpx.HTTPError, OSError, ValueError):
        return {}
    out: dict[int, str] = {}
    for c in containers if isinstance(containers, list) else []:
        name = str((c.get("Names") or ["?"])[0]).lstrip("/")
        for p in c.get("Ports") or []:
            if isinstance(p.get("PublicPort"), int):
                out.setdefault(p["PublicPort"], name)
        argv = str(c.get("Command", "")).split()
        if "--port" in argv[:-1]:
            port = argv[argv.index("--port") + 1]
            if port.isdigit():
                out.setdefault(int(port), name)
    return out


def discover(
    tables: Iterable[tuple[str, str]],
    ports: Collection[int] | None = None,
    docker_socket: str = DOCKER_SOCKET,
) -> Discovery:
    """Probe the listening ports (only `ports`, if given) and name their Docker containers."""
    open_ports = listening(tables)
    wanted = [p for p in _order(open_ports) if ports is None or p in ports]
    result = Discovery(
        probed=min(len(wanted), MAX_CANDIDATES),
        skipped=max(len(wanted) - MAX_CANDIDATES, 0),
        taken=frozenset(open_ports),
    )
    candidates = {p: open_ports[p] for p in wanted[:MAX_CANDIDATES]}
    found = asyncio.run(_probe_all(candidates)) if candidates else []
    containers = docker_ports(docker_socket) if found else {}
    by_start: dict[str, Found] = {}
    for probed in sorted(found, key=lambda f: f.port):
        f = Found(probed.url, probed.port, probed.models, probed.started, containers.get(probed.port, ""))
        same = by_start.get(f.started) if f.started else None
        if same is not None:  # a proxy in front of a server found already (the watchdog's gateway, say)
            result.duplicates.append((f, same))
            continue
        by_start[f.started] = f
        result.found.append(f)
    return result
