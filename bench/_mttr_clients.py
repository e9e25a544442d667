"""Parts of bench/mttr.py: the clients that keep sending through a fault, and what each request saw.

Open-loop arrivals, so that requests keep coming while the ones in flight hang: every `every` seconds a new
completion is sent, plain and streaming in turn, each with its own deadline; at most `cap` are outstanding
(more are counted as not sent). A request fails before its first byte (no status line, or an error status,
or a stream that ended before its first chunk) or mid-stream (a stream that had sent tokens and then broke or
ended without [DONE]).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass

import httpx

BODY = {"model": "tiny-llama", "prompt": "one two three four", "max_tokens": 16, "temperature": 0}


@dataclass
class Request:
    """One client request: when it was sent, its first byte and end (unix seconds), and how it ended."""

    kind: str  # "plain" or "stream"
    sent: float
    first_byte: float | None = None
    done: float | None = None
    ok: bool = False
    error: str = ""  # the failure ("" while running or when ok)
    replayed: bool = False  # the gateway said so (a response header naming a replay)

    @property
    def phase(self) -> str:
        """Where it failed: "before first byte" or "mid-stream" ("" if it did not fail)."""
        if self.ok or not self.error:
            return ""
        return "mid-stream" if self.first_byte is not None and self.kind == "stream" else "before first byte"


class Clients:
    """Send completions to `url` until stopped; every request is kept."""

    def __init__(self, url: str, every: float = 0.5, deadline: float = 300.0, cap: int = 64) -> None:
        self.url = url
        self.every = every
        self.deadline = deadline
        self.cap = cap
        self.requests: list[Request] = []
        self.not_sent = 0
        self._tasks: set[asyncio.Task[None]] = set()
        self._client = httpx.AsyncClient(trust_env=False, limits=httpx.Limits(max_connections=cap + 4))

    async def run(self, stop: asyncio.Event) -> None:
        """Send one request every `every` seconds until `stop` is set."""
        n = 0
        while not stop.is_set():
            if len(self._tasks) >= self.cap:
                self.not_sent += 1
            else:
                req = Request("stream" if n % 2 else "plain", time.time())
                self.requests.append(req)
                task = asyncio.create_task(self._one(req))
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)
            n += 1
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(stop.wait(), self.every)

    async def close(self) -> int:
        """Cancel what is still outstanding (not counted as failed); how many that was."""
        left = list(self._tasks)
        for task in left:
            task.cancel()
        await asyncio.gather(*left, return_exceptions=True)
        await self._client.aclose()
        return len(left)

    async def _one(self, req: Request) -> None:
        body = {**BODY, "stream": req.kind == "stream"}
        try:
            async with self._client.stream(
                "POST", self.url + "/v1/completions", json=body, timeout=self.deadline
            ) as resp:
                req.replayed = any("replay" in k.lower() for k in resp.headers)
                if resp.status_code != 200:
                    req.error = f"status {resp.status_code}"
                    return
                if req.kind == "plain":
                    await resp.aread()
                    req.first_byte = req.done = time.time()
                    req.ok = bool(resp.json().get("choices"))
                    req.error = "" if req.ok else "no choices"
                    return
                await self._stream(req, resp)
        except asyncio.CancelledError:
            req.error = "cancelled at the end of the run"
            raise
        except (httpx.HTTPError, ValueError) as exc:
            req.error = f"{type(exc).__name__}: {exc}"[:200]
        finally:
            req.done = req.done or time.time()

    @staticmethod
    async def _stream(req: Request, resp: httpx.Response) -> None:
        ended = False
        async for line in resp.aiter_lines():
            if line.startswith("data:"):
                req.first_byte = req.first_byte or time.time()
                ended = ended or line.strip() == "data: [DONE]"
        req.ok = ended and req.first_byte is not None
        req.error = "" if req.ok else "the stream ended without [DONE]"
        req.done = time.time()


def recovered_at(requests: list[Request], fault: float) -> float | None:
    """When the first request sent at or after the fault succeeded: the service is back."""
    return min((r.done for r in requests if r.ok and r.sent >= fault and r.done is not None), default=None)


def errors(requests: list[Request], fault: float) -> dict[str, int]:
    """Failed requests that were in flight at the fault or sent after it, by where they failed."""
    out = {"before first byte": 0, "mid-stream": 0}
    for r in requests:
        if r.phase and r.done is not None and r.done >= fault and "cancelled at the end" not in r.error:
            out[r.phase] += 1
    return out
