"""Micro-benchmark: the scrape's GET (sources/httpget.py) over plain http, over https, and with credentials.

Usage: python bench/httpget.py [-n GETS] [--rounds R]

A server in a subprocess answers every GET on one kept-alive connection with the real vLLM payload
(tests/fixtures/vllm-0.32.0-metrics.txt); a CA and a server certificate are made for the run (openssl). Prints
the client's CPU time per GET (process time of this process, which runs only the client), the best of R rounds
for each case: a connection and its TLS context are made once, so https adds only encryption per GET, and a
credentials file adds a stat.
"""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from vllm_watchdog.config.httpauth import ClientSettings
from vllm_watchdog.config.httpclient import Authorization, HttpClientConfig, TlsConfig
from vllm_watchdog.sources.httpget import HttpGet

ROOT = Path(__file__).resolve().parent.parent
PAYLOAD = ROOT / "tests" / "fixtures" / "vllm-0.32.0-metrics.txt"
SERVER = r"""
import asyncio, ssl, sys
payload = open(sys.argv[1], "rb").read()
head = b"HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: %d\r\n\r\n"
reply = head % len(payload) + payload
ctx = None
if len(sys.argv) > 2:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(sys.argv[2], sys.argv[3])
async def handle(r, w):
    try:
        while True:
            await r.readuntil(b"\r\n\r\n")
            w.write(reply)
            await w.drain()
    except Exception:
        pass
    w.close()
async def main():
    server = await asyncio.start_server(handle, "127.0.0.1", 0, ssl=ctx)
    print(server.sockets[0].getsockname()[1], flush=True)
    await server.serve_forever()
asyncio.run(main())
"""


async def cpu_per_get(url: str, settings: ClientSettings | None, n: int) -> float:
    """Milliseconds of this process's CPU per GET, after a warm-up on the same connection."""
    http = HttpGet(url, {"Accept-Encoding": "identity"}, 16 << 20, settings=settings)
    try:
        for _ in range(50):
            await http.get()
        start = time.process_time()
        for _ in range(n):
            if (await http.get()).status != 200:
                raise SystemExit("the server did not answer 200")
        return (time.process_time() - start) / n * 1000
    finally:
        await http.aclose()


def main() -> None:
    """Run every case against its own server and print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=3000, help="GETs per round")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT))  # the test PKI maker
    from tests.support.tlsfiles import make_pki

    with tempfile.TemporaryDirectory() as tmp:
        pki = make_pki(Path(tmp) / "pki")
        token = Path(tmp) / "token"
        token.write_text("bench-token-0123456789\n")
        tls = TlsConfig(ca_file=str(pki.ca))
        bearer = Authorization(credentials_file=str(token))
        cases = [
            ("http", False, None),
            ("http, bearer_token_file", False, HttpClientConfig(authorization=bearer)),
            ("https, tls_config.ca_file", True, HttpClientConfig(tls=tls)),
            ("https, ca_file + bearer_token_file", True, HttpClientConfig(tls=tls, authorization=bearer)),
        ]
        print(f"client CPU per GET, best of {args.rounds} x {args.n} GETs on one kept-alive connection")
        for name, https, config in cases:
            extra = [str(pki.server_cert), str(pki.server_key)] if https else []
            server = subprocess.Popen(
                [sys.executable, "-c", SERVER, str(PAYLOAD), *extra], stdout=subprocess.PIPE, text=True
            )
            try:
                assert server.stdout is not None
                url = f"{'https' if https else 'http'}://127.0.0.1:{server.stdout.readline().strip()}/metrics"
                settings = ClientSettings(config) if config is not None else None
                best = min(asyncio.run(cpu_per_get(url, settings, args.n)) for _ in range(args.rounds))
                print(f"  {name:36s} {best:.3f} ms")
            finally:
                server.terminate()
                server.wait()


if __name__ == "__main__":
    main()
