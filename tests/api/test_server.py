"""The own API's embedded uvicorn: it ticks once a second (the Date header) and stops at once when told."""

from __future__ import annotations

import asyncio

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from tests.support.vllm_server import free_port
from vllm_watchdog.api.server import API_LIMITS, api_error_body, api_server
from vllm_watchdog.listener import Listener

pytestmark = pytest.mark.anyio


async def test_the_embedded_server_ticks_to_refresh_its_date_and_exits_when_told() -> None:
    async def hello(request: Request) -> PlainTextResponse:
        return PlainTextResponse("ok")

    port = free_port()
    server = api_server(
        Starlette(routes=[Route("/", hello)]), "127.0.0.1", port, Listener(API_LIMITS, api_error_body)
    )
    ticks: list[int] = []
    tick = server.on_tick

    async def counted(counter: int) -> bool:
        ticks.append(counter)
        return await tick(counter)

    server.on_tick = counted  # type: ignore[method-assign]
    task = asyncio.create_task(server.serve())
    for _ in range(200):  # bounded: started within 20 s
        if server.started or task.done():
            break
        await asyncio.sleep(0.1)
    assert server.started
    async with httpx.AsyncClient() as client:
        reply = await client.get(f"http://127.0.0.1:{port}/")
    assert reply.text == "ok" and reply.headers["date"].endswith(" GMT")
    server.should_exit = True
    await asyncio.wait_for(task, 20)
    # Each tick refreshes the Date header (uvicorn does at counter % 10 == 0): one a second, not ten.
    assert ticks and all(counter % 10 == 0 for counter in ticks)
