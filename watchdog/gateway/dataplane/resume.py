"""Resume: a completions or chat stream that had sent text when the watchdog stopped its engine goes on, on
the new engine, as the same SSE stream: the request is sent again with the text so far appended (a
completion's prompt plus the text; a chat's messages plus the partial assistant message,
`continue_final_message`), and the new stream's events follow the old ones on the client's connection,
without its head, so that no text is repeated or dropped.

Only a stream of one choice, cut at an event boundary, whose events were plain text (no tool calls, no
reasoning, no logprobs, no echo), with a string prompt or a list of messages; anything else is cut off as
before. The text kept is bounded (MAX_TEXT); a longer stream is not resumed.
"""

from __future__ import annotations

import json
from typing import Any

from starlette.types import Message, Send

MAX_TEXT = 1024 * 1024  # characters of a stream's text kept for a resume
_SEP = b"\n\n"
_MAX_EVENT = 256 * 1024  # an unfinished event held back longer than this: not resumable


class StreamText:
    """The text of one SSE stream's only choice as its events reach the client, and whether it can resume."""

    __slots__ = ("_partial", "events", "finished", "ok", "parts", "size")

    def __init__(self) -> None:
        self.parts: list[str] = []
        self.size = 0
        self.events = 0  # events that carried text (about one token each)
        self.ok = True
        self.finished = False  # a finish_reason or [DONE] went out: nothing to resume
        self._partial = b""  # the bytes of an event not yet complete

    @property
    def text(self) -> str:
        """The text sent so far."""
        return "".join(self.parts)

    def resumable(self) -> bool:
        """Whether the stream may go on from here (its client has whole events only)."""
        return self.ok and not self.finished and not self._partial

    def feed(self, chunk: bytes) -> None:
        """Note a chunk sent to the client."""
        if not self.ok:
            return
        data = self._partial + chunk
        *events, self._partial = data.split(_SEP)
        if len(self._partial) > _MAX_EVENT:
            self.ok = False
        for event in events:
            self._event(event)

    def _event(self, event: bytes) -> None:
        if not event.startswith(b"data: "):
            self.ok = self.ok and not event.strip()
            return
        payload = event[6:].strip()
        if payload == b"[DONE]":
            self.finished = True
            return
        try:
            doc = json.loads(payload)
            choices = doc["choices"]
        except (ValueError, KeyError, TypeError):
            self.ok = False
            return
        if not choices:
            return  # the usage event
        if len(choices) != 1 or not isinstance(choices[0], dict) or choices[0].get("index", 0) != 0:
            self.ok = False
            return
        self._choice(choices[0])

    def _choice(self, choice: dict[str, Any]) -> None:
        delta = choice.get("delta")
        if isinstance(delta, dict):
            if any(v for k, v in delta.items() if k not in ("role", "content")):
                self.ok = False  # tool calls, reasoning: not plain text
            text = delta.get("content")
        else:
            text = choice.get("text")
        if choice.get("logprobs") is not None:
            self.ok = False
        if choice.get("finish_reason") is not None:
            self.finished = True
        if isinstance(text, str) and text:
            self.parts.append(text)
            self.size += len(text)
            self.events += 1
            if self.size > MAX_TEXT:
                self.ok = False


def continued(body: bytes, path: str, text: str, events: int) -> bytes | None:
    """The request body that goes on from `text` (`events` tokens or so already generated); None if the
    request cannot be continued that way."""
    try:
        doc = json.loads(body)
    except ValueError:
        return None
    if not isinstance(doc, dict) or doc.get("n", 1) != 1 or doc.get("echo") or doc.get("logprobs"):
        return None
    if path == "/v1/completions" and isinstance(doc.get("prompt"), str):
        doc["prompt"] += text
    elif path == "/v1/chat/completions" and isinstance(doc.get("messages"), list) and doc["messages"]:
        if doc.get("continue_final_message") or doc.get("tools"):
            return None
        doc["messages"] = [*doc["messages"], {"role": "assistant", "content": text}]
        doc["continue_final_message"], doc["add_generation_prompt"] = True, False
    else:
        return None
    for key in ("max_tokens", "max_completion_tokens"):
        limit = doc.get(key)
        if isinstance(limit, int) and not isinstance(limit, bool):
            if limit - events < 1:
                return None
            doc[key] = limit - events
    return json.dumps(doc).encode()


class Continuation:
    """The resumed request's `send`: its head is dropped (the client has the first one), its events follow;
    a head other than 200 is refused (`refuse` says how)."""

    __slots__ = ("_refuse", "_send", "sent")

    def __init__(self, send: Send, refuse: type[Exception]) -> None:
        self._send = send
        self._refuse = refuse
        self.sent = False

    async def __call__(self, message: Message) -> None:
        """Pass the new stream's body on, not its head."""
        if message["type"] == "http.response.start":
            if message["status"] != 200:
                raise self._refuse(f"the resumed stream was answered {message['status']}")
            return
        self.sent = self.sent or bool(message.get("body"))
        await self._send(message)
