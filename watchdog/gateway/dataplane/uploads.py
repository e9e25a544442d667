"""Reading a request body from the client, within the gateway's limit on its size."""

from __future__ import annotations

from starlette.types import Receive

from .bodies import ElementCounter


class BodyTooLarge(Exception):
    """The request body went over max_body while it was read."""


async def read_body(receive: Receive, max_body: int, counter: ElementCounter | None) -> bytes | None:
    """The whole request body (its chunks are freed on return); None if the client left first; BodyTooLarge
    past `max_body`; TooManyElements as soon as `counter` says so."""
    chunks: list[bytes] = []
    size = 0
    more = True
    while more:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > max_body:
            raise BodyTooLarge
        if counter is not None:
            counter.feed(chunk)
        chunks.append(chunk)
        more = message.get("more_body", False)
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


async def discard_body(receive: Receive, max_body: int) -> bool:
    """Read the rest of a refused body (up to `max_body`), keeping none of it; False if the client left."""
    size = 0
    while size <= max_body:
        message = await receive()
        if message["type"] == "http.disconnect":
            return False
        if not message.get("more_body", False):
            break
        size += len(message.get("body", b""))
    return True
