"""What a stream sent (StreamText) and the request that goes on from it (continued): the pure parts of a resume."""

from __future__ import annotations

import json

import pytest

from vllm_watchdog.gateway.dataplane.resume import MAX_TEXT, StreamText, continued


def event(doc: object) -> bytes:
    return b"data: " + json.dumps(doc).encode() + b"\n\n"


def text_event(text: str, finish: str | None = None) -> bytes:
    return event({"choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish}]})


def test_events_split_anywhere_give_the_same_text() -> None:
    data = text_event("Once") + text_event(" upon") + event({"choices": [], "usage": {"prompt_tokens": 2}})
    for cut in range(len(data)):
        stream = StreamText()
        stream.feed(data[:cut])
        stream.feed(data[cut:])
        assert (stream.text, stream.events, stream.resumable()) == ("Once upon", 2, True)
    half = StreamText()
    half.feed(data[:5])
    assert not half.resumable()  # the client has half an event: nothing can follow it cleanly


@pytest.mark.parametrize(
    "data",
    [
        text_event("a", "stop"),
        b"data: [DONE]\n\n",
        event({"choices": [{"index": 0, "delta": {"tool_calls": [{"id": "x"}]}}]}),
        event({"choices": [{"index": 0, "delta": {"reasoning_content": "hm"}}]}),
        event({"choices": [{"index": 0, "text": "a", "logprobs": {"tokens": ["a"]}}]}),
        event({"choices": [{"index": 0, "text": "a"}, {"index": 1, "text": "b"}]}),
        b"data: {broken\n\n",
        b"event: x\n\n",
        text_event("x" * (MAX_TEXT + 1)),
    ],
    ids=[
        "finished",
        "done",
        "tool-calls",
        "reasoning",
        "logprobs",
        "two-choices",
        "not-json",
        "not-data",
        "long",
    ],
)
def test_what_cannot_go_on(data: bytes) -> None:
    stream = StreamText()
    stream.feed(text_event("a"))
    stream.feed(data)
    assert not stream.resumable()


def test_a_chat_delta_with_empty_extras_is_plain_text() -> None:
    stream = StreamText()
    stream.feed(
        event({"choices": [{"index": 0, "delta": {"role": "assistant", "content": "", "tool_calls": []}}]})
    )
    stream.feed(event({"choices": [{"index": 0, "delta": {"content": "Hi"}}]}))
    assert (stream.text, stream.events, stream.resumable()) == ("Hi", 1, True)


def test_continued_bodies() -> None:
    body = json.dumps({"model": "m", "prompt": "Once", "max_tokens": 5, "stream": True}).encode()
    assert json.loads(continued(body, "/v1/completions", " upon", 1) or b"") == {
        "model": "m",
        "prompt": "Once upon",
        "max_tokens": 4,
        "stream": True,
    }
    assert continued(body, "/v1/completions", " upon a time", 5) is None  # nothing left to generate
    chat = json.dumps({"messages": [{"role": "user", "content": "q"}], "max_completion_tokens": 9}).encode()
    assert json.loads(continued(chat, "/v1/chat/completions", "A", 2) or b"") == {
        "messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "A"}],
        "max_completion_tokens": 7,
        "continue_final_message": True,
        "add_generation_prompt": False,
    }
    for bad in (
        {"prompt": "a", "echo": True},
        {"prompt": ["a", "b"]},
        {"messages": [], "stream": True},
        {"messages": [{"role": "user", "content": "q"}], "tools": [{"type": "function"}]},
    ):
        path = "/v1/completions" if "prompt" in bad else "/v1/chat/completions"
        assert continued(json.dumps(bad).encode(), path, "x", 1) is None, bad
    assert continued(b"not json", "/v1/completions", "x", 1) is None
