"""Phase (f) of bench/isolation.py: the worst query mix against the daemon's API, without a token.

  python3 bench/_attack_api.py attack PORT SECONDS TRICKLE     the hostile clients
  python3 bench/_attack_api.py polite PORT SECONDS             a second client: `up`, /healthz, /metrics

For SECONDS (each request also bounded by its own timeout, each worker by a count), the hostile clients
send at once: a 4,500-operand `1+1+...` chain; three nested label_replace with "$1" x 2700 replacements;
16 KB of nested parentheses; sort_desc nested 1,000 deep over 1,000 series; a ~9 MB-answer range query
from 4 clients; /api/v1/samples of every series; 40 concurrent subqueries that each run into the query
deadline (2 s); and TRICKLE connections each sending a POST body one byte every 5 s. The polite client
asks `up` one query at a time and polls /healthz and /metrics every 0.5 s. Each prints what it saw (status
counts, p50/p99, slowest answer, biggest answer) as JSON. Standard library only, so that bench/isolation.py
can run the hostile side as another local user (the API takes turns between users).
"""

from __future__ import annotations

import asyncio
import json
import resource
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote, urlencode

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
TIMEOUT = 30.0  # seconds for one answer


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


async def fetch(port: int, path: str, form: dict[str, str] | None) -> tuple[int, int]:
    """One request on a new connection (POST with a form, else GET): (status, body bytes)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port, limit=1 << 20)
    try:
        body = urlencode(form).encode() if form is not None else b""
        method = "POST" if form is not None else "GET"
        head = f"{method} {path} HTTP/1.1\r\nhost: 127.0.0.1\r\nconnection: close\r\n"
        if form is not None:
            head += f"content-type: application/x-www-form-urlencoded\r\ncontent-length: {len(body)}\r\n"
        writer.write(head.encode() + b"\r\n" + body)
        status = await reader.readuntil(b"\r\n")
        rest = await _read_all(reader)
        return int(status[9:12]), len(rest)
    finally:
        writer.close()


async def _read_all(reader: asyncio.StreamReader) -> bytes:
    """Everything until the server closes (the request said `connection: close`), headers included."""
    chunks = []
    while chunk := await reader.read(1 << 20):
        chunks.append(chunk)
    return b"".join(chunks)


async def ask(port: int, client: Client, path: str, form: dict[str, str] | None) -> None:
    """One request; its status, time and size into `client`."""
    t0 = time.monotonic()
    try:
        status, size = await asyncio.wait_for(fetch(port, path, form), TIMEOUT)
        client.statuses[str(status)] += 1
        client.max_bytes = max(client.max_bytes, size)
    except asyncio.TimeoutError:
        client.statuses["timeout"] += 1
    except (OSError, ValueError, asyncio.IncompleteReadError, asyncio.LimitOverrunError) as exc:
        client.statuses[type(exc).__name__] += 1
    took = time.monotonic() - t0
    client.latencies.append(took)
    client.slowest = max(client.slowest, took)


async def repeat(port: int, client: Client, path: str, form: dict[str, str] | None, deadline: float) -> None:
    """The same request back to back until the deadline (at most PER_WORKER times)."""
    for _ in range(PER_WORKER):
        if time.monotonic() >= deadline:
            return
        await ask(port, client, path, form)
        await asyncio.sleep(0.05)


async def range_form(port: int) -> dict[str, str]:
    """A range query over every series whose answer holds about RANGE_SAMPLES samples."""
    series = 1000
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        query = quote(f"count({ALL})")
        writer.write(
            f"GET /api/v1/query?query={query} HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n".encode()
        )
        answer = (await asyncio.wait_for(_read_all(reader), TIMEOUT)).split(b"\r\n\r\n", 1)[1]
        writer.close()
        series = max(1, int(float(json.loads(answer)["data"]["result"][0]["value"][1])))
    except (OSError, ValueError, KeyError, IndexError, TypeError, asyncio.TimeoutError):
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


async def poll(port: int, client: Client, path: str, deadline: float, every: float) -> None:
    """GET `path` every `every` s until the deadline."""
    while time.monotonic() < deadline:
        await ask(port, client, path, None)
        await asyncio.sleep(every)


async def attack(port: int, seconds: float, trickles: int) -> dict[str, Any]:
    """Every hostile client at once until the deadline; what each saw."""
    clients: dict[str, Client] = {}
    conns: Counter[str] = Counter()
    ranged = await range_form(port)
    deadline = time.monotonic() + seconds
    jobs: list[tuple[str, str, dict[str, str] | None, int]] = [
        ("chain_4500", "/api/v1/query", {"query": CHAIN}, 1),
        ("label_replace_x2700", "/api/v1/query", {"query": LABEL_BOMB}, 1),
        ("parens_16k", "/api/v1/query", {"query": PARENS}, 1),
        ("sort_desc_1000", "/api/v1/query", {"query": SORTS}, 1),
        ("range_9mb", "/api/v1/query_range", ranged, RANGE_CLIENTS),
        ("samples", "/api/v1/samples?" + urlencode({"match": ALL}), None, 1),
        ("subquery_2s", "/api/v1/query", {"query": SUBQUERY}, SUBQUERIES),
    ]
    tasks = []
    for name, path, form, n in jobs:
        clients[name] = Client()
        tasks += [repeat(port, clients[name], path, form, deadline) for _ in range(n)]
    tasks += [trickle(port, deadline, conns) for _ in range(trickles)]
    await asyncio.gather(*tasks)
    return {name: c.json() for name, c in clients.items()} | {"trickle": dict(conns)}


async def polite(port: int, seconds: float) -> dict[str, Any]:
    """A second client: `up` one query at a time, /healthz and /metrics every 0.5 s."""
    clients = {name: Client() for name in ("second_client_up", "poll/healthz", "poll/metrics")}
    deadline = time.monotonic() + seconds
    await asyncio.gather(
        poll(port, clients["second_client_up"], "/api/v1/query?query=up", deadline, 0.05),
        poll(port, clients["poll/healthz"], "/healthz", deadline, 0.5),
        poll(port, clients["poll/metrics"], "/metrics", deadline, 0.5),
    )
    return {name: c.json() for name, c in clients.items()}


def main(argv: list[str]) -> int:
    """Run one side and print its JSON."""
    if len(argv) == 4 and argv[0] == "attack":
        _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))  # TRICKLE connections at once, and more
        result = asyncio.run(attack(int(argv[1]), float(argv[2]), int(argv[3])))
    elif len(argv) == 3 and argv[0] == "polite":
        result = asyncio.run(polite(int(argv[1]), float(argv[2])))
    else:
        print(__doc__, file=sys.stderr)
        return 2
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
