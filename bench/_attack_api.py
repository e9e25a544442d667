"""Phase (f) of bench/isolation.py: the worst query mix against the daemon's API, without a token.

  python bench/_attack_api.py PORT SECONDS TRICKLE OUT.json

For SECONDS (each request also bounded by its own timeout, each worker by a count), several concurrent
clients send: a 4,500-operand `1+1+...` chain; three nested label_replace with "$1" x 2700 replacements;
16 KB of nested parentheses; sort_desc nested 1,000 deep over 1,000 series; a ~9 MB-answer range query
from 4 clients; /api/v1/samples of every series; 40 concurrent subqueries that each run into the query
deadline (2 s), from one client, while a second client asks `up` one query at a time (its 503s counted);
and TRICKLE connections each sending a POST body one byte every 5 s, while /healthz and /metrics are polled.
Writes what each client saw (status counts, slowest answer, bytes) to OUT.json.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

ALL = '{__name__=~".+"}'
CHAIN = "+".join(["1"] * 4500)
_REPL = '"' + "$1" * 2700 + '"'
LABEL_BOMB = (
    f'label_replace(label_replace(label_replace(up, "a", {_REPL}, "job", "(.+)"), '
    f'"b", {_REPL}, "a", "(.+)"), "c", {_REPL}, "b", "(.+)")'
)
PARENS = "(" * 8150 + "1" + ")" * 8150
SORTS = "sort_desc(" * 1000 + f"topk(1000, {ALL})" + ")" * 1000
SUBQUERY = f"max_over_time(rate({ALL}[5s])[10m:1ms])"  # far more work than its 2 s deadline allows
SUBQUERIES = 40
RANGE_CLIENTS = 4
RANGE_SAMPLES = 400_000  # about 9 MB of JSON (~23 bytes a sample), under the API's 500,000
TRICKLE_EVERY = 5.0
PER_WORKER = 200  # requests at most per worker


@dataclass
class Client:
    """What one client saw."""

    statuses: Counter[str] = field(default_factory=Counter)
    slowest: float = 0.0
    latencies: list[float] = field(default_factory=list)
    max_bytes: int = 0

    def json(self) -> dict[str, Any]:
        """A summary (p50/p99 of answers, slowest, biggest)."""
        ordered = sorted(self.latencies)
        pick = (lambda q: ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]) if ordered else None
        return {
            "statuses": dict(self.statuses),
            "requests": sum(self.statuses.values()),
            "p50_s": pick(0.5) if pick else None,
            "p99_s": pick(0.99) if pick else None,
            "slowest_s": self.slowest,
            "max_bytes": self.max_bytes,
        }


async def ask(http: httpx.AsyncClient, client: Client, path: str, form: dict[str, str] | None) -> None:
    """One request (POST with a form, else GET); its status, time and size into `client`."""
    t0 = time.monotonic()
    try:
        if form is None:
            resp = await http.get(path)
        else:
            resp = await http.post(path, data=form)
        client.statuses[str(resp.status_code)] += 1
        client.max_bytes = max(client.max_bytes, len(resp.content))
    except httpx.TimeoutException:
        client.statuses["timeout"] += 1
    except httpx.HTTPError as exc:
        client.statuses[type(exc).__name__] += 1
    took = time.monotonic() - t0
    client.latencies.append(took)
    client.slowest = max(client.slowest, took)


async def repeat(
    http: httpx.AsyncClient, client: Client, path: str, form: dict[str, str] | None, deadline: float
) -> None:
    """The same request back to back until the deadline (at most PER_WORKER times)."""
    for _ in range(PER_WORKER):
        if time.monotonic() >= deadline:
            return
        await ask(http, client, path, form)
        await asyncio.sleep(0.05)


async def range_form(http: httpx.AsyncClient) -> dict[str, str]:
    """A range query over every series whose answer holds about RANGE_SAMPLES samples."""
    series = 1000
    try:
        resp = await http.post("/api/v1/query", data={"query": f"count({ALL})"})
        series = max(1, int(float(resp.json()["data"]["result"][0]["value"][1])))
    except (httpx.HTTPError, ValueError, KeyError, IndexError, TypeError):
        pass
    now = time.time()
    steps = max(2, min(10_000, RANGE_SAMPLES // series))
    span = 60.0
    return {"query": ALL, "start": f"{now - span:.3f}", "end": f"{now:.3f}", "step": f"{span / steps:.6f}"}


async def trickle(port: int, deadline: float, stats: Counter[str]) -> None:
    """One connection sending a POST body a byte every TRICKLE_EVERY s; reconnects (after 1 s) when cut."""
    head = (
        b"POST /api/v1/query HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/x-www-form-urlencoded"
        b"\r\ncontent-length: 4096\r\n\r\n"
    )
    while time.monotonic() < deadline:
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
        except OSError:
            stats["connect_failed"] += 1
            await asyncio.sleep(1.0)
            continue
        stats["opened"] += 1
        try:
            writer.write(head)
            while time.monotonic() < deadline:
                writer.write(b"q")
                await writer.drain()
                got = await _read_for(reader, TRICKLE_EVERY)
                if got is not None:
                    stats[f"answered_{got[9:12].decode(errors='replace') or 'eof'}"] += 1
                    break
        except OSError:
            stats["reset"] += 1
        finally:
            writer.close()
        await asyncio.sleep(1.0)


async def _read_for(reader: asyncio.StreamReader, seconds: float) -> bytes | None:
    """What the server sent within `seconds` (b"" at end of file); None if it sent nothing."""
    try:
        return await asyncio.wait_for(reader.read(4096), seconds)
    except asyncio.TimeoutError:
        return None


async def poll(http: httpx.AsyncClient, client: Client, path: str, deadline: float) -> None:
    """GET `path` every 0.5 s until the deadline."""
    while time.monotonic() < deadline:
        await ask(http, client, path, None)
        await asyncio.sleep(0.5)


async def attack(port: int, seconds: float, trickles: int) -> dict[str, Any]:
    """Every client at once until the deadline; what each saw."""
    base = f"http://127.0.0.1:{port}"
    limits = httpx.Limits(max_connections=SUBQUERIES + 8, max_keepalive_connections=SUBQUERIES + 8)
    clients: dict[str, Client] = {}
    conns: Counter[str] = Counter()
    async with (
        httpx.AsyncClient(base_url=base, timeout=30.0, limits=limits, trust_env=False) as http,
        httpx.AsyncClient(base_url=base, timeout=30.0, trust_env=False) as polite,
    ):
        ranged = await range_form(http)
        deadline = time.monotonic() + seconds
        jobs: list[tuple[str, httpx.AsyncClient, str, dict[str, str] | None, int]] = [
            ("chain_4500", http, "/api/v1/query", {"query": CHAIN}, 1),
            ("label_replace_x2700", http, "/api/v1/query", {"query": LABEL_BOMB}, 1),
            ("parens_16k", http, "/api/v1/query", {"query": PARENS}, 1),
            ("sort_desc_1000", http, "/api/v1/query", {"query": SORTS}, 1),
            ("range_9mb", http, "/api/v1/query_range", ranged, RANGE_CLIENTS),
            ("samples", http, f"/api/v1/samples?match={ALL}", None, 1),
            ("subquery_2s", http, "/api/v1/query", {"query": SUBQUERY}, SUBQUERIES),
            ("second_client_up", polite, "/api/v1/query?query=up", None, 1),
        ]
        tasks = []
        for name, session, path, form, n in jobs:
            clients[name] = Client()
            tasks += [repeat(session, clients[name], path, form, deadline) for _ in range(n)]
        for path in ("/healthz", "/metrics"):
            clients[f"poll{path}"] = Client()
            tasks.append(poll(polite, clients[f"poll{path}"], path, deadline))
        tasks += [trickle(port, deadline, conns) for _ in range(trickles)]
        await asyncio.gather(*tasks)
    return {name: c.json() for name, c in clients.items()} | {"trickle": dict(conns)}


def main(argv: list[str]) -> int:
    """Run the attack and write its JSON."""
    if len(argv) != 4:
        print(__doc__, file=sys.stderr)
        return 2
    port, seconds, trickles, out = int(argv[0]), float(argv[1]), int(argv[2]), Path(argv[3])
    result = asyncio.run(attack(port, seconds, trickles))
    out.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
