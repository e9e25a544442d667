"""Phases (g) and (h) of bench/isolation.py: hostile clients of the gateway, without a token.

  python3 bench/_attack_gateway.py nonreaders PORT SECONDS COUNT
  python3 bench/_attack_gateway.py bodies PORT SECONDS COUNT

nonreaders: COUNT connections with a 2 KiB receive buffer each send one streaming request that the upstream
answers with an endless stream, and never read; after SECONDS, each is read for a moment to see whether the
gateway had cut it (end of file) or still streams.
bodies: COUNT clients each POST a 16 MiB `{"messages":[{},{},...]}` body to /v1/chat/completions, back to
back until SECONDS pass (at most BODY_ROUNDS each); their status counts and slowest answer.
Each prints its JSON. Standard library only, so that bench/isolation.py can run it as another local user.
"""

from __future__ import annotations

import asyncio
import json
import socket
import sys
import time
from collections import Counter
from typing import Any

RCVBUF = 2048
BODY_BYTES = 16 * 1024 * 1024 - 1024  # just under the gateway's default max_body (16 MiB)
BODY_ROUNDS = 20
ENDLESS = json.dumps({"model": "bench", "prompt": "endless", "stream": True}).encode()


def request(port: int, path: str, body: bytes) -> bytes:
    """A POST without credentials."""
    return (
        b"POST %s HTTP/1.1\r\nhost: 127.0.0.1:%d\r\ncontent-type: application/json\r\n"
        b"content-length: %d\r\n\r\n" % (path.encode(), port, len(body))
    ) + body


def nonreaders(port: int, seconds: float, count: int) -> dict[str, Any]:
    """COUNT non-reading streaming clients for SECONDS; how many the gateway cut."""
    socks: list[socket.socket] = []
    stats: Counter[str] = Counter()
    data = request(port, "/v1/completions", ENDLESS)
    for _ in range(count):
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, RCVBUF)
        try:
            s.connect(("127.0.0.1", port))
            s.sendall(data)
            socks.append(s)
            stats["sent"] += 1
        except OSError:
            stats["connect_failed"] += 1
            s.close()
    time.sleep(seconds)
    for s in socks:
        stats[_fate(s)] += 1
        s.close()
    return dict(stats)


def _fate(s: socket.socket) -> str:
    """Read for up to 0.3 s: "cut" at end of file or a reset, "open" if it still streams, "idle" if silent."""
    s.settimeout(0.3)
    got = 0
    try:
        while got < 4 * 1024 * 1024:
            chunk = s.recv(65536)
            if not chunk:
                return "cut"
            got += len(chunk)
    except TimeoutError:
        return "open" if got > 0 else "idle"
    except OSError:
        return "cut"
    return "open"


async def _body_client(
    port: int, data: bytes, deadline: float, stats: Counter[str], slow: list[float]
) -> None:
    for _ in range(BODY_ROUNDS):
        if time.monotonic() >= deadline:
            return
        t0 = time.monotonic()
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            try:
                writer.write(data)
                await writer.drain()
                head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 60)
                stats[head[9:12].decode(errors="replace")] += 1
            finally:
                writer.close()
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, asyncio.TimeoutError) as exc:
            stats[type(exc).__name__] += 1
        slow.append(time.monotonic() - t0)


async def _bodies(port: int, seconds: float, count: int) -> dict[str, Any]:
    items = b"{}," * ((BODY_BYTES - 40) // 3)
    body = b'{"model":"bench","messages":[' + items + b"{}]}"
    data = request(port, "/v1/chat/completions", body)
    stats: Counter[str] = Counter()
    slow: list[float] = []
    deadline = time.monotonic() + seconds
    await asyncio.gather(*(_body_client(port, data, deadline, stats, slow) for _ in range(count)))
    return {"statuses": dict(stats), "body_bytes": len(body), "slowest_s": max(slow, default=0.0)}


def main(argv: list[str]) -> int:
    """Run one attack and print its JSON."""
    if len(argv) != 4 or argv[0] not in ("nonreaders", "bodies"):
        print(__doc__, file=sys.stderr)
        return 2
    kind, port, seconds, count = argv[0], int(argv[1]), float(argv[2]), int(argv[3])
    if kind == "nonreaders":
        result = nonreaders(port, seconds, count)
    else:
        result = asyncio.run(_bodies(port, seconds, count))
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
