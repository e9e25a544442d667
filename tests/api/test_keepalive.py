"""The own API closes a kept-alive connection after uvicorn's keep-alive timeout (5 s), as HTTP/1.1 servers do;
a client that keeps idle connections as long as the server (httpx's default: 5 s) can reuse one in the moment
the server closes it and get httpx.ReadError (RFC 9112 §9.3.1: the client retries, the server is not at fault).
On a loop shared by the server and the client (bench/detect_to_act.py runs the daemon in-process) a stall
between the server's response and the client's reading of it widens that moment by the stall. A client that
gives up idle connections well before the server does never meets it (what the bench's probe does).

The keep-alive timeout is shortened to 1 s here to keep the test short; the stalls are blocking sleeps on the
loop, placed so that the client's wake-up and the server's keep-alive timer fall due in the same loop turn."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from tests.support.vllm_server import free_port
from vllm_watchdog.api.server import API_LIMITS, ApiServer, api_error_body, api_server
from vllm_watchdog.listener import Listener

pytestmark = pytest.mark.anyio
KEEP_ALIVE = 1.0  # the server's, shortened from uvicorn's 5 s


async def _serving() -> tuple[ApiServer, asyncio.Task[None], str]:
    async def hello(request: Request) -> PlainTextResponse:
        asyncio.get_running_loop().call_soon(time.sleep, 0.5)  # the loop stalls once the response is sent
        return PlainTextResponse("ok")

    port = free_port()
    server = api_server(
        Starlette(routes=[Route("/", hello)]), "127.0.0.1", port, Listener(API_LIMITS, api_error_body)
    )
    assert server.config.timeout_keep_alive == 5  # what the daemon runs with
    server.config.timeout_keep_alive = int(KEEP_ALIVE)
    task = asyncio.create_task(server.serve())
    for _ in range(200):  # bounded: started within 20 s
        if server.started or task.done():
            break
        await asyncio.sleep(0.1)
    assert server.started
    return server, task, f"http://127.0.0.1:{port}/"


async def _reuse_at_the_close(client: httpx.AsyncClient, url: str) -> str:
    """GET, then GET again on the kept connection in the loop turn where the server's keep-alive ends."""
    assert (await client.get(url)).text == "ok"  # the server armed its timer 0.5 s before this returned
    asyncio.get_running_loop().call_later(0.4, time.sleep, 0.25)  # a second stall, over both deadlines
    await asyncio.sleep(0.45)  # due just before the server's keep-alive timer
    try:
        return (await client.get(url)).text
    except httpx.HTTPError as exc:
        return type(exc).__name__


async def test_a_client_keeping_connections_as_long_as_the_server_races_its_close() -> None:
    server, task, url = await _serving()
    try:
        async with httpx.AsyncClient(limits=httpx.Limits(keepalive_expiry=KEEP_ALIVE)) as client:
            # ReadError (the bench's) when the request reached the socket before its close, else this
            assert await _reuse_at_the_close(client, url) in ("ReadError", "RemoteProtocolError")
        short = httpx.Limits(keepalive_expiry=KEEP_ALIVE / 5)  # the bench's probe: 1 s against 5 s
        async with httpx.AsyncClient(limits=short) as client:
            assert await _reuse_at_the_close(client, url) == "ok"
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, 20)
