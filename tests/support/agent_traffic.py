"""Agent-like traffic through the gateway, read to the end: growing contexts, tool-call loops, streamed and
plain completions and chats, a burst over a session's rate, an abandoned stream."""

from __future__ import annotations

import threading
from typing import Any

import httpx

CLIENT = httpx.Client(limits=httpx.Limits(max_connections=32), trust_env=False)
# Repetitive text: vLLM's ngram drafter finds matches in it, and every request shares it (prefix-cache hits).
PREFIX = "alpha beta gamma delta " * 60


def post(gateway: str, path: str, session: str, body: dict[str, Any]) -> int:
    """One request through the gateway, read to the end (streamed or not); returns the status."""
    headers = {"X-Session-ID": session}
    with CLIENT.stream("POST", gateway + path, json=body, headers=headers, timeout=180) as resp:
        for _ in resp.iter_bytes():
            pass
        return resp.status_code


def tool_messages(session: str, step: int) -> list[dict[str, Any]]:
    """An agent step that calls the same tool with the same arguments as before (a loop, in small)."""
    call = {"id": "call_1", "type": "function", "function": {"name": "search", "arguments": '{"q": "docs"}'}}
    return [
        {"role": "system", "content": PREFIX},
        {"role": "user", "content": f"{session} task step {step}"},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "content": "nothing found " * (step + 1)},
    ]


def agent(gateway: str, session: str, statuses: list[int], tokens: int = 12) -> None:
    """Four steps with a growing context: completion, streamed completion, chat with tool calls, streamed chat."""
    common = {"model": "tiny-llama", "max_tokens": tokens, "temperature": 0, "ignore_eos": True}
    usage = {"stream_options": {"include_usage": True}}
    history = ""
    for step in range(4):
        history += f" {session} step {step}" * 5  # 36 tokens a step, prefilled anew (it names the session)
        if step < 2:
            body = common | {"prompt": PREFIX + history} | ({"stream": True} | usage if step == 1 else {})
            statuses.append(post(gateway, "/v1/completions", session, body))
        else:
            body = (
                common
                | {"messages": tool_messages(session, step)}
                | ({"stream": True} | usage if step == 3 else {})
            )
            statuses.append(post(gateway, "/v1/chat/completions", session, body))


def flood(gateway: str, statuses: list[int]) -> None:
    """Six tiny requests at once from one session: its burst of 4 passes, the rest get 429 (session_rate)."""
    body = {"model": "tiny-llama", "prompt": PREFIX, "max_tokens": 2, "temperature": 0}
    threads = [
        threading.Thread(target=lambda: statuses.append(post(gateway, "/v1/completions", "burst", body)))
        for _ in range(6)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(180)


def hang_up(gateway: str) -> None:
    """A streamed completion the client abandons after its first event (an upstream client_disconnect)."""
    body = {"model": "tiny-llama", "prompt": PREFIX, "max_tokens": 64, "ignore_eos": True, "stream": True}
    headers = {"X-Session-ID": "agent-a"}
    with CLIENT.stream("POST", gateway + "/v1/completions", json=body, headers=headers, timeout=180) as resp:
        assert resp.status_code == 200
        next(resp.iter_lines())
