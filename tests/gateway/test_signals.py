"""Per-session signals: body parsing, tool-call signatures, usage from JSON and SSE, top-K with "other"."""

from __future__ import annotations

import hashlib
import itertools
import json
import random
from collections import deque
from collections.abc import Iterable, Iterator, Mapping

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.support.clock import Clock
from vllm_watchdog.gateway.dataplane.bodies import (
    OPENAI_PATHS,
    RequestTrace,
    parse_json_body,
    tool_call_signatures,
)
from vllm_watchdog.gateway.dataplane.signals import SessionSignals
from vllm_watchdog.gateway.protocol.snapshot import SessionStats

CHAT = "/v1/chat/completions"


def usage(prompt: object = 5, completion: object = 7, cached: object = 0) -> dict[str, object]:
    u: dict[str, object] = {"prompt_tokens": prompt, "completion_tokens": completion}
    if isinstance(prompt, int) and isinstance(completion, int):
        u["total_tokens"] = prompt + completion
    if cached is not None:
        u["prompt_tokens_details"] = {"cached_tokens": cached}
    return u


def json_response(u: object = None, content: str = "hello") -> bytes:
    body: dict[str, object] = {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": content}}],
    }
    if u is not None:
        body["usage"] = u
    return json.dumps(body).encode()


def sse(*contents: str, u: object = None, sep: str = "\n\n") -> bytes:
    """A vLLM-shaped chat completion stream; the usage event (if any) comes last, before [DONE]."""
    events: list[dict[str, object]] = [
        {"id": "c", "object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {"content": c}}]}
        for c in contents
    ]
    if u is not None:
        events.append({"id": "c", "object": "chat.completion.chunk", "choices": [], "usage": u})
    out = "".join(f"data: {json.dumps(e)}{sep}" for e in events) + f"data: [DONE]{sep}"
    return out.encode()


def row(
    signals: SessionSignals,
    name: str,
    in_flight: Mapping[str, int] | None = None,
    breakers: Iterable[str] = (),
) -> SessionStats:
    rows, _ = signals.stats(in_flight, breakers)
    found = [r for r in rows if r.session == name]
    assert len(found) == 1, rows
    return found[0]


def run(
    signals: SessionSignals,
    session: str | None,
    chunks: list[bytes],
    *,
    streaming: bool = True,
    status: int = 200,
    body: dict[str, object] | None = None,
    path: str = CHAT,
    content_type: str | None = None,
) -> None:
    trace = signals.start(session, path, body, streaming, content_type)
    for c in chunks:
        trace.feed(c)
    trace.finish(status)


def tokens(r: SessionStats) -> tuple[int, int, int]:
    return r.prompt_tokens_total, r.completion_tokens_total, r.cached_tokens_total


# --- parse_json_body ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "content_type",
    [None, "", "application/json", "Application/JSON; charset=utf-8", "application/vnd.x+json"],
)
def test_parse_json_body_accepts_json_content_types(content_type: str | None) -> None:
    assert parse_json_body(b'{"model": "m", "stream": true}', content_type) == {"model": "m", "stream": True}


@pytest.mark.parametrize("content_type", ["text/plain", "multipart/form-data; boundary=x", "application/xml"])
def test_parse_json_body_refuses_other_content_types(content_type: str) -> None:
    assert parse_json_body(b'{"model": "m"}', content_type) is None


@pytest.mark.parametrize(
    "body",
    [
        b"",
        b"not json",
        b'{"a": ',
        b"[1, 2]",
        b'"text"',
        b"null",
        b"\xff\xfe\x00garbage",
        b"[" * 100_000 + b"]" * 100_000,
        b'{"n": ' + b"9" * 10_000 + b"}",
    ],
)
def test_parse_json_body_returns_none_for_garbage(body: bytes) -> None:
    assert parse_json_body(body, "application/json") is None


def test_parse_json_body_handles_utf8_bom_and_unicode() -> None:
    assert parse_json_body('\ufeff{"user": "é"}'.encode(), None) == {"user": "é"}


# --- tool_call_signatures ----------------------------------------------------------------------------------


def call(name: object, arguments: object) -> dict[str, object]:
    return {"id": "call_1", "type": "function", "function": {"name": name, "arguments": arguments}}


def agent_body(
    *calls: dict[str, object], earlier: list[dict[str, object]] | None = None
) -> dict[str, object]:
    messages: list[object] = [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]
    messages += earlier or []
    messages.append({"role": "assistant", "content": None, "tool_calls": list(calls)})
    messages.append({"role": "tool", "tool_call_id": "call_1", "content": "result"})
    return {"model": "m", "messages": messages}


def expected_sig(name: str, canonical: str) -> str:
    return hashlib.sha256((name + "\x00" + canonical).encode()).hexdigest()[:16]


def test_signature_is_sha256_of_name_and_canonical_arguments() -> None:
    sigs = tool_call_signatures(agent_body(call("read_file", '{"path": "/a", "n": 1}')))
    assert sigs == [expected_sig("read_file", '{"n":1,"path":"/a"}')]
    assert len(sigs[0]) == 16


def test_signature_ignores_key_order_and_whitespace() -> None:
    a = tool_call_signatures(agent_body(call("f", '{"b": {"y": 1, "x": [1, 2]}, "a": "é"}')))
    b = tool_call_signatures(agent_body(call("f", '{ "a":"\\u00e9",\n "b":{"x":[1,2],"y":1} }')))
    c = tool_call_signatures(agent_body(call("f", {"a": "é", "b": {"x": [1, 2], "y": 1}})))  # already parsed
    assert a == b == c


def test_signature_differs_for_other_arguments_or_name() -> None:
    base = tool_call_signatures(agent_body(call("f", '{"a": 1}')))
    assert tool_call_signatures(agent_body(call("f", '{"a": 2}'))) != base
    assert tool_call_signatures(agent_body(call("g", '{"a": 1}'))) != base
    assert tool_call_signatures(agent_body(call("f", '{"a": [2, 1]}'))) != tool_call_signatures(
        agent_body(call("f", '{"a": [1, 2]}'))
    )  # list order matters


def test_signature_of_unparseable_arguments_hashes_the_raw_string() -> None:
    assert tool_call_signatures(agent_body(call("f", "{not json"))) == [expected_sig("f", "{not json")]
    assert tool_call_signatures(agent_body(call("f", ""))) == [expected_sig("f", "")]
    assert tool_call_signatures(agent_body(call("f", None))) == [expected_sig("f", "")]


def test_only_the_last_assistant_message_counts() -> None:
    old: dict[str, object] = {"role": "assistant", "tool_calls": [call("old", "{}")]}
    tool: dict[str, object] = {"role": "tool", "content": "r"}
    sigs = tool_call_signatures(agent_body(call("new", "{}"), call("new2", "{}"), earlier=[old, tool]))
    assert sigs == [expected_sig("new", "{}"), expected_sig("new2", "{}")]
    # the last assistant message said something instead of calling a tool: no signature, old ones are not recounted
    text = {"model": "m", "messages": [old, tool, {"role": "assistant", "content": "done"}, {"role": "user"}]}
    assert tool_call_signatures(text) == []


def test_legacy_function_call_is_signed() -> None:
    body = {"messages": [{"role": "assistant", "function_call": {"name": "f", "arguments": '{"a":1}'}}]}
    assert tool_call_signatures(body) == [expected_sig("f", '{"a":1}')]


@pytest.mark.parametrize(
    "body",
    [
        {},
        {"messages": None},
        {"messages": "text"},
        {"messages": {"role": "assistant"}},
        {"messages": []},
        {"messages": [None, 1, "x", []]},
        {"messages": [{"role": "user", "tool_calls": [call("f", "{}")]}]},
        {"messages": [{"role": "assistant", "tool_calls": "x"}]},
        {
            "messages": [
                {"role": "assistant", "tool_calls": [None, 1, "f", {"function": "f"}, {"function": None}]}
            ]
        },
        {"messages": [{"role": "assistant", "tool_calls": [{"function": {"name": 1, "arguments": "{}"}}]}]},
        {"messages": [{"role": "assistant", "tool_calls": [{"function": {"name": "", "arguments": "{}"}}]}]},
        {"messages": [{"role": "assistant", "tool_calls": [{"function": {"arguments": "{}"}}]}]},
        {"messages": [{"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": {1j}}}]}]},
        {"messages": [{"role": "assistant", "function_call": "f"}]},
    ],
)
def test_malformed_structures_give_no_signatures(body: dict[str, object]) -> None:
    assert tool_call_signatures(body) == []


def test_strange_but_valid_arguments_do_not_raise() -> None:
    deep = "[" * 50_000 + "]" * 50_000
    huge = '{"n": ' + "1" * 10_000 + "}"
    for args in (deep, huge, "NaN", '"\\ud800"', "1e999"):
        assert len(tool_call_signatures(agent_body(call("f", args)))) == 1
    assert len(tool_call_signatures(agent_body(call("\ud800", "{}")))) == 1  # lone surrogate in the name


def test_tool_calls_per_request_are_bounded() -> None:
    assert len(tool_call_signatures(agent_body(*[call("f", str(i)) for i in range(1000)]))) == 64


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=5), inner, max_size=4),
    max_leaves=20,
)


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(st.text(max_size=10), json_values, max_size=4), json_values)
def test_signatures_never_raise(body: dict[str, object], messages: object) -> None:
    assert isinstance(tool_call_signatures(body), list)
    assert isinstance(tool_call_signatures({"messages": messages}), list)
    assert isinstance(
        tool_call_signatures({"messages": [{"role": "assistant", "tool_calls": messages}]}), list
    )


# --- usage from non-streaming JSON -------------------------------------------------------------------------


def test_json_usage_is_recorded() -> None:
    s = SessionSignals()
    run(s, "a", [json_response(usage(100, 20, 64))], streaming=False)
    r = row(s, "a")
    assert (r.requests_total, r.in_flight) == (1, 0)
    assert tokens(r) == (100, 20, 64)
    assert r.prefix_cache_hit_ratio == pytest.approx(0.64)


def test_json_body_split_in_many_chunks() -> None:
    body = json_response(usage(30, 4, 16))
    s = SessionSignals()
    run(s, "a", [body[i : i + 7] for i in range(0, len(body), 7)], streaming=False)
    assert tokens(row(s, "a")) == (30, 4, 16)


@pytest.mark.parametrize(
    "chunks",
    [[json_response()], [b"not json at all"], [b'{"usage": '], [b"[1]"], [], [json_response("usage")]],
)
def test_json_without_usage_counts_the_request_only(chunks: list[bytes]) -> None:
    s = SessionSignals()
    run(s, "a", chunks, streaming=False)
    r = row(s, "a")
    assert (r.requests_total, r.in_flight, *tokens(r)) == (1, 0, 0, 0, 0)
    assert r.prefix_cache_hit_ratio is None and r.context_growth_tokens is None


def test_error_status_records_the_request_but_no_usage() -> None:
    s = SessionSignals()
    run(s, "a", [json_response(usage(100, 20, 0))], streaming=False, status=400)
    r = row(s, "a")
    assert (r.requests_total, r.in_flight, *tokens(r)) == (1, 0, 0, 0, 0)


def test_finish_counts_once() -> None:
    s = SessionSignals()
    trace = s.start("a", CHAT, None, False)
    other = s.start("a", CHAT, None, False)
    trace.feed(json_response(usage(10, 1, 0)))
    trace.finish(200)
    trace.finish(200)
    assert row(s, "a").in_flight == 1  # the second finish() did not release `other`
    assert tokens(row(s, "a")) == (10, 1, 0)
    other.finish(500)
    assert row(s, "a").in_flight == 0


def test_big_json_body_is_not_kept_but_usage_still_found() -> None:
    body = json_response(usage(9, 8, 7), content="x" * (3 * 1024 * 1024))
    s = SessionSignals()
    trace = s.start("a", CHAT, None, False, "application/json")
    for i in range(0, len(body), 65536):
        trace.feed(body[i : i + 65536])
    assert sum(len(p) for p in trace._parts) <= 1024 * 1024
    trace.finish(200)
    assert tokens(row(s, "a")) == (9, 8, 7)


def test_big_json_body_with_usage_split_across_chunks() -> None:
    body = json_response(usage(9, 8, 7), content="x" * (2 * 1024 * 1024))  # no newline anywhere
    key = body.rindex(b'"usage"')
    for cut in range(key - 3, len(body), 5):
        s = SessionSignals()
        run(s, "a", [body[: key - 100_000], body[key - 100_000 : cut], body[cut:]], streaming=False)
        assert tokens(row(s, "a")) == (9, 8, 7), cut


@pytest.mark.parametrize(
    "u",
    [
        usage(True, 5, 0),
        usage(-1, 5, 0),
        usage(2**40, 5, 0),
        usage(1.5, 5, 0),
        usage("10", 5, 0),
        usage(None, 5, 0),
        {"completion_tokens": 5},
    ],
)
def test_bad_prompt_tokens_are_ignored(u: dict[str, object]) -> None:
    s = SessionSignals()
    run(s, "a", [json_response(u)], streaming=False)
    r = row(s, "a")
    assert tokens(r) == (0, 5, 0)  # completion still counted, no prompt, no cached, no step
    assert r.prefix_cache_hit_ratio is None and r.context_growth_tokens is None


@pytest.mark.parametrize("cached", [True, -3, 101, 2**40, "5", 5.0, None, {"x": 1}])
def test_bad_cached_tokens_are_ignored(cached: object) -> None:
    s = SessionSignals()
    run(s, "a", [json_response(usage(100, 5, cached))], streaming=False)
    r = row(s, "a")
    assert tokens(r) == (100, 5, 0)
    assert r.prefix_cache_hit_ratio is None  # no step reported cached tokens


@pytest.mark.parametrize(
    "u", [[], "usage", 5, {"prompt_tokens_details": "x"}, {"prompt_tokens_details": [1]}]
)
def test_usage_of_wrong_shape_is_ignored(u: object) -> None:
    s = SessionSignals()
    run(s, "a", [json_response(u)], streaming=False)
    assert tokens(row(s, "a")) == (0, 0, 0)


# --- usage from SSE ----------------------------------------------------------------------------------------


def test_sse_usage_event_is_recorded() -> None:
    s = SessionSignals()
    run(s, "a", [sse("Hel", "lo", u=usage(5, 7, 0))], content_type="text/event-stream")
    assert tokens(row(s, "a")) == (5, 7, 0)


def test_sse_every_split_point() -> None:
    stream = sse("a", "usage", 'say "usage": {}', u=usage(120, 3, 96))
    for cut in range(len(stream) + 1):
        s = SessionSignals()
        run(s, "a", [stream[:cut], stream[cut:]])
        assert tokens(row(s, "a")) == (120, 3, 96), cut


def test_sse_byte_by_byte_and_three_way_splits() -> None:
    stream = sse("x" * 40, u=usage(11, 2, 8), sep="\r\n\r\n")
    s = SessionSignals()
    run(s, "a", [stream[i : i + 1] for i in range(len(stream))])
    assert tokens(row(s, "a")) == (11, 2, 8)
    rng = random.Random(7)
    for _ in range(300):
        i, j = sorted(rng.sample(range(len(stream) + 1), 2))
        s = SessionSignals()
        run(s, "a", [stream[:i], stream[i:j], stream[j:]])
        assert tokens(row(s, "a")) == (11, 2, 8), (i, j)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.integers(min_value=0, max_value=400), max_size=12), st.integers(0, 10_000))
def test_sse_any_chunking(cuts: list[int], prompt: int) -> None:
    stream = sse("one", "two", "usage", u=usage(prompt, 9, prompt // 2))
    points = sorted({min(c, len(stream)) for c in cuts} | {0, len(stream)})
    s = SessionSignals()
    run(s, "a", [stream[a:b] for a, b in itertools.pairwise(points)])
    assert tokens(row(s, "a")) == (prompt, 9, prompt // 2)


def test_sse_last_usage_wins_and_null_usage_is_skipped() -> None:
    # continuous usage stats: every chunk carries cumulative usage; OpenAI style: "usage": null until the end
    events: list[dict[str, object]] = [
        {"choices": [{"delta": {"content": "a"}}], "usage": usage(5, n, 0)} for n in (1, 2, 3)
    ]
    events += [{"choices": [], "usage": None}]
    stream = "".join(f"data: {json.dumps(e)}\n\n" for e in events).encode() + b"data: [DONE]\n\n"
    s = SessionSignals()
    run(s, "a", [stream])
    assert tokens(row(s, "a")) == (5, 3, 0)
    s = SessionSignals()
    run(s, "a", [stream[i : i + 50] for i in range(0, len(stream), 50)])
    assert tokens(row(s, "a")) == (5, 3, 0)


def test_sse_without_usage_or_with_garbage_records_nothing() -> None:
    for stream in (
        sse("a", "b"),
        sse("a", u="usage"),
        sse("a", u=[1, 2]),
        b'data: {"usage": {"prompt_tokens": 5, "completion_tok',  # cut off
        b'data: {"usage": {"prompt_tokens": 5 oops}}\n\n',
        b'data: {"usage": {' + b"x" * 40_000 + b"\n\n",
        b'data: {"content":"usage"}\n\n',
        b"\x00\xff" * 100 + b'"usage"',
    ):
        s = SessionSignals()
        run(s, "a", [stream])
        assert tokens(row(s, "a")) == (0, 0, 0), stream[:60]


def test_sse_error_status_records_no_usage() -> None:
    s = SessionSignals()
    run(s, "a", [sse("a", u=usage(5, 1, 0))], status=500)
    assert tokens(row(s, "a")) == (0, 0, 0)


def test_plain_chunks_keep_nothing() -> None:
    s = SessionSignals()
    trace = s.start("a", CHAT, None, True, "text/event-stream")
    for c in (sse("some text")[:-2], b"\n\n", sse("more")):
        trace.feed(c)
    scan = trace._usage  # the usage KeyScan
    assert scan._pending is None and scan.found is None and len(scan._tail) <= 6
    assert trace._parts == []


def test_response_content_type_decides_the_mode() -> None:
    s = SessionSignals()
    # a stream was asked for but the server answered with JSON (an error, or stream ignored)
    run(s, "a", [json_response(usage(3, 1, 0))], streaming=True, content_type="application/json")
    # no stream asked for, but the answer is an event stream; the type arrives after start()
    trace = s.start("a", CHAT, None, False)
    trace.set_content_type("text/event-stream; charset=utf-8")
    trace.feed(sse("x", u=usage(4, 1, 0)))
    trace.finish(200)
    assert tokens(row(s, "a")) == (7, 2, 0)


def test_other_paths_record_no_usage_and_no_signatures() -> None:
    s = SessionSignals()
    body = agent_body(call("f", "{}"))
    run(s, "a", [json_response(usage(5, 1, 0))], body=body, path="/v1/embeddings", streaming=False)
    r = row(s, "a")
    assert (r.requests_total, *tokens(r), r.tool_call_repeats) == (1, 0, 0, 0, 0)
    assert set(OPENAI_PATHS) == {"/v1/chat/completions", "/v1/completions"}
    run(s, "a", [json_response(usage(5, 1, 0))], path="/v1/completions", streaming=False)
    assert tokens(row(s, "a")) == (5, 1, 0)


def _strings(obj: object, seen: set[int]) -> Iterator[str | bytes]:
    if id(obj) in seen:
        return
    seen.add(id(obj))
    if isinstance(obj, str | bytes):
        yield obj
    elif isinstance(obj, dict):
        for k, v in obj.items():
            yield from _strings(k, seen)
            yield from _strings(v, seen)
    elif isinstance(obj, list | tuple | set | frozenset | deque):
        for v in obj:
            yield from _strings(v, seen)
    elif hasattr(obj, "__dict__") or hasattr(obj, "__slots__"):
        for name in getattr(obj, "__slots__", ()):
            yield from _strings(getattr(obj, name, None), seen)
        yield from _strings(getattr(obj, "__dict__", {}), seen)


def test_no_prompt_or_completion_text_is_kept() -> None:
    s = SessionSignals()
    body = agent_body(call("f", '{"q": "SECRET-ARG"}'))
    body["messages"][1]["content"] = "SECRET-PROMPT"  # type: ignore[index]
    run(s, "a", [json_response(usage(5, 1, 0), content="SECRET-COMPLETION")], body=body, streaming=False)
    run(s, "a", [sse("SECRET-STREAM", u=usage(5, 1, 0))], body=body)
    kept = s.start("a", CHAT, body, True)
    kept.feed(sse("SECRET-TAIL", u=usage(5, 1, 0)))
    kept.finish(200)
    everything = list(_strings(s, set())) + list(_strings(kept, set()))
    assert everything  # the walk does reach the state
    assert not [x for x in everything if (b"SECRET" if isinstance(x, bytes) else "SECRET") in x]  # type: ignore[operator]


# --- sessions: names, in flight, LRU ------------------------------------------------------------------------


def test_session_names_and_reserved_labels() -> None:
    s = SessionSignals(top_k=10)
    for name in (None, "other", "anonymous", "x~", "plain"):
        s.start(name, CHAT, None, False).finish(200)
    rows, tracked = s.stats()
    assert {r.session for r in rows} == {"anonymous", "other~", "anonymous~", "x~~", "plain"}
    assert tracked == 5


def test_in_flight_own_count_and_override() -> None:
    s = SessionSignals(top_k=1)
    a1 = s.start("a", CHAT, None, True)
    s.start("a", CHAT, None, True)
    s.start("b", CHAT, None, True)
    assert row(s, "a").in_flight == 2 and row(s, "other").in_flight == 1
    assert row(s, "a", in_flight={"a": 5, "z": 3}).in_flight == 5
    assert row(s, "other", in_flight={"a": 5, "z": 3}).in_flight == 4  # z from the gate, b our own count
    a1.finish(200)
    assert row(s, "a").in_flight == 1


def test_breakers_flag_named_rows_and_other() -> None:
    s = SessionSignals(top_k=1)
    for _ in range(3):
        s.start("a", CHAT, None, False).finish(200)
    s.start("b", CHAT, None, False).finish(200)
    assert row(s, "a", breakers=["a"]).breaker_open
    assert not row(s, "other", breakers=["a"]).breaker_open
    assert row(s, "other", breakers=["b"]).breaker_open
    assert row(s, "other", breakers=["never-seen"]).breaker_open


def test_lru_bound_prefers_idle_sessions() -> None:
    clock = Clock()
    s = SessionSignals(top_k=10, max_sessions=3, monotonic=clock)
    busy = s.start("busy", CHAT, None, False)
    for name in ("b", "c", "d", "e"):
        clock.advance(1)
        s.start(name, CHAT, None, False).finish(200)
    rows, tracked = s.stats()
    assert tracked == 3
    assert {r.session for r in rows} == {"busy", "d", "e", "other"}
    assert row(s, "other").requests_total == 2  # b and c were forgotten, their counts were not
    busy.finish(200)


def test_evicted_session_finishing_late_counts_into_other() -> None:
    clock = Clock()
    s = SessionSignals(top_k=10, max_sessions=1, monotonic=clock)
    late = s.start("a", CHAT, None, False)
    s.start("b", CHAT, None, False).finish(200)  # evicts a although it is busy: nothing idle to evict
    late.feed(json_response(usage(50, 5, 10)))
    late.finish(200)
    rows, tracked = s.stats()
    assert tracked == 1
    assert [(r.session, r.requests_total, *tokens(r)) for r in rows] == [
        ("b", 1, 0, 0, 0),
        ("other", 1, 50, 5, 10),
    ]


# --- top-K, decay and "other" -------------------------------------------------------------------------------


def test_top_k_by_traffic_with_other_summed() -> None:
    clock = Clock()
    s = SessionSignals(top_k=2, monotonic=clock)
    for name, n in (("a", 5), ("b", 3), ("c", 2), ("d", 1)):
        for _ in range(n):
            run(s, name, [json_response(usage(10, 1, 5))], streaming=False)
    rows, tracked = s.stats()
    assert tracked == 4
    assert [(r.session, r.requests_total, *tokens(r)) for r in rows] == [
        ("a", 5, 50, 5, 25),
        ("b", 3, 30, 3, 15),
        ("other", 3, 30, 3, 15),
    ]
    assert rows[-1].prefix_cache_hit_ratio == pytest.approx(0.5)


def test_no_other_row_when_everyone_is_named() -> None:
    s = SessionSignals(top_k=3)
    run(s, "a", [], streaming=False)
    rows, _ = s.stats()
    assert [r.session for r in rows] == ["a"]
    assert SessionSignals().stats() == ((), 0)


def test_recent_traffic_beats_old_traffic() -> None:
    clock = Clock()
    s = SessionSignals(top_k=1, monotonic=clock, half_life=60.0)
    for _ in range(100):
        s.start("old", CHAT, None, False).finish(200)
    clock.advance(600)  # ten half-lives: 100 requests weigh less than 0.1 now
    s.start("new", CHAT, None, False).finish(200)
    rows, _ = s.stats()
    assert rows[0].session == "new"


def test_scores_survive_renormalisation() -> None:
    clock = Clock()
    s = SessionSignals(top_k=1, monotonic=clock, half_life=1.0)
    for step in range(2000):  # about eight renormalisations
        clock.advance(1.0)
        s.start("a" if step % 3 else "b", CHAT, None, False).finish(200)
    rows, _ = s.stats()
    assert rows[0].session == "a"
    clock.advance(5000)
    s.start("b", CHAT, None, False).finish(200)
    assert s.stats()[0][0].session == "b"


@pytest.mark.parametrize("max_sessions", [8, 5])
def test_counters_are_monotonic_and_sum_to_the_totals(max_sessions: int) -> None:
    """With room for every session each series is monotonic and the last values of all series ever exported
    sum to the exact totals. With evictions a returning session restarts from 0 (a counter reset) but "other"
    stays monotonic."""
    clock = Clock()
    rng = random.Random(42)
    s = SessionSignals(top_k=2, max_sessions=max_sessions, monotonic=clock, half_life=5.0)
    names = [f"s{i}" for i in range(8)]
    evicting = max_sessions < len(names)
    last: dict[str, tuple[int, ...]] = {}
    totals = [0, 0, 0, 0]
    open_traces: list[RequestTrace] = []

    def observe() -> None:
        rows, tracked = s.stats()
        assert len(rows) <= 3 and tracked <= max_sessions
        assert sum(r.in_flight for r in rows) == len(open_traces)
        for r in rows:
            now = (r.requests_total, *tokens(r))
            before = last.get(r.session, (0, 0, 0, 0))
            if r.session == "other" or not evicting:
                assert all(x >= y for x, y in zip(now, before, strict=True)), (r.session, before, now)
            last[r.session] = now

    for step in range(3000):
        clock.advance(rng.random())
        op = rng.random()
        if op < 0.5:
            weights = [8, 4, 2, 1, 1, 1, 1, 1] if step < 1500 else [1, 1, 1, 1, 1, 1, 4, 8]
            t = s.start(rng.choices(names, weights)[0], CHAT, None, False)
            totals[0] += 1
            open_traces.append(t)
        elif op < 0.9 and open_traces:
            t = open_traces.pop(rng.randrange(len(open_traces)))
            p, c = rng.randrange(1000), rng.randrange(100)
            k = rng.randrange(p + 1)
            t.feed(json_response(usage(p, c, k)))
            t.finish(200)
            totals[1:] = [totals[1] + p, totals[2] + c, totals[3] + k]
        else:
            observe()
    while open_traces:
        open_traces.pop().finish(599)
    observe()
    assert last["other"][0] > 0 and len(last) > 3  # sessions did move in and out of the top
    if not evicting:
        assert [sum(x) for x in zip(*last.values(), strict=True)] == totals


def test_session_rising_into_the_top_keeps_its_past_in_other() -> None:
    clock = Clock()
    s = SessionSignals(top_k=1, monotonic=clock)
    for _ in range(3):
        s.start("a", CHAT, None, False).finish(200)
    s.start("b", CHAT, None, False).finish(200)
    assert [(r.session, r.requests_total) for r in s.stats()[0]] == [("a", 3), ("other", 1)]
    for _ in range(5):
        s.start("b", CHAT, None, False).finish(200)
    assert [(r.session, r.requests_total) for r in s.stats()[0]] == [("b", 5), ("other", 1)]
    for _ in range(10):
        s.start("a", CHAT, None, False).finish(200)
    assert [(r.session, r.requests_total) for r in s.stats()[0]] == [("a", 13), ("other", 1)]


def test_evicting_a_top_session_reranks_everyone() -> None:
    clock = Clock()
    s = SessionSignals(top_k=1, max_sessions=2, monotonic=clock)
    for _ in range(10):
        s.start("a", CHAT, None, False).finish(200)
    for _ in range(3):
        s.start("b", CHAT, None, False).finish(200)
    assert s.stats()[0][0].session == "a"
    s.start("c", CHAT, None, False).finish(200)  # evicts a, the least recently started
    rows, tracked = s.stats()
    assert tracked == 2
    assert [(r.session, r.requests_total) for r in rows] == [("b", 0), ("other", 4)]


def test_other_gauges_cover_recent_non_top_sessions() -> None:
    clock = Clock()
    s = SessionSignals(top_k=1, monotonic=clock, active=100.0, half_life=1e9)  # scores are plain counts
    for _ in range(5):
        run(s, "top", [json_response(usage(1000, 1, 1000))], streaming=False)
    run(s, "idle", [json_response(usage(100, 1, 0))], streaming=False)
    run(s, "idle", [json_response(usage(900, 1, 0))], streaming=False)  # growth 800, ratio 0
    clock.advance(150)
    for p, k in ((100, 50), (140, 70)):
        run(s, "x", [json_response(usage(p, 1, k))], streaming=False)
    for p in (10, 30):
        run(s, "y", [json_response(usage(p, 1, None))], streaming=False)
    run(s, "y", [], streaming=False, body=agent_body(call("f", "{}")))
    run(s, "y", [], streaming=False, body=agent_body(call("f", "{}")))
    other = row(s, "other")
    assert other.prefix_cache_hit_ratio == pytest.approx(120 / 240)  # x only: idle is too old, y reports none
    assert other.context_growth_tokens == pytest.approx(40.0)  # max of x (40) and y (20)
    assert other.tool_call_repeats == 2
    assert other.requests_total == 8  # counters keep everyone


# --- ratio, growth and repeats math -------------------------------------------------------------------------


def test_ratio_over_the_window() -> None:
    s = SessionSignals(window=3)
    steps = [(100, 0), (100, 50), (200, 200), (100, None), (300, 0)]
    expect = [0.0, 50 / 200, 250 / 400, 250 / 300, 200 / 500]
    for (p, k), e in zip(steps, expect, strict=True):
        run(s, "a", [json_response(usage(p, 1, k))], streaming=False)
        assert row(s, "a").prefix_cache_hit_ratio == pytest.approx(e)
    assert row(s, "a").cached_tokens_total == 250  # totals are not windowed


def test_ratio_none_without_cached_reports_or_prompt() -> None:
    s = SessionSignals()
    run(s, "a", [json_response(usage(100, 1, None))], streaming=False)
    assert row(s, "a").prefix_cache_hit_ratio is None
    run(s, "b", [json_response(usage(0, 1, 0))], streaming=False)
    assert row(s, "b").prefix_cache_hit_ratio is None


def test_context_growth_mean_of_differences() -> None:
    s = SessionSignals(window=4)
    prompts = [100, 150, 250, 240, 400, 100]
    expect: list[float | None] = [None, 50, 75, (240 - 100) / 3, (400 - 150) / 3, (100 - 250) / 3]
    for p, e in zip(prompts, expect, strict=True):
        run(s, "a", [json_response(usage(p, 1, 0))], streaming=False)
        got = row(s, "a").context_growth_tokens
        assert got == (None if e is None else pytest.approx(e))


def brute_force_repeats(steps: list[tuple[str, ...]]) -> int:
    """How many whole copies of the newest block of 1 to 3 steps (one with a tool call at least) end the list
    back to back, by trying every block."""
    best = 0
    for period in (1, 2, 3):
        block = steps[len(steps) - period :]
        if len(block) < period or not any(block):
            continue
        n = 1
        while steps[len(steps) - (n + 1) * period : len(steps) - n * period] == block:
            n += 1
        best = max(best, n)
    return best


def test_tool_call_repeats_match_a_brute_force_window() -> None:
    rng = random.Random(3)
    s = SessionSignals(loop_window=8)
    recent: deque[tuple[str, ...]] = deque(maxlen=8)
    for _ in range(400):
        calls = [call(rng.choice("ab"), json.dumps({"n": rng.randrange(2)})) for _ in range(rng.randrange(3))]
        body = agent_body(*calls)
        recent.append(tuple(tool_call_signatures(body)))  # a step without tool calls is a step too
        run(s, "a", [], streaming=False, body=body)
        assert row(s, "a").tool_call_repeats == brute_force_repeats(list(recent))


def test_tests_rerun_between_different_edits_are_not_a_loop() -> None:
    """A coding agent runs the same test command after each of its (different) edits: no repeats."""
    s = SessionSignals()
    for i in range(12):
        run(s, "a", [], streaming=False, body=agent_body(call("edit", json.dumps({"diff": f"@@ -{i} @@"}))))
        run(s, "a", [], streaming=False, body=agent_body(call("run_tests", '{"path": "tests/"}')))
    assert row(s, "a").tool_call_repeats == 1


def test_a_cycle_of_two_calls_is_a_loop() -> None:
    s = SessionSignals()
    for _ in range(5):
        run(s, "a", [], streaming=False, body=agent_body(call("read", '{"path": "/x"}')))
        run(s, "a", [], streaming=False, body=agent_body(call("search", '{"q": "x"}')))
    assert row(s, "a").tool_call_repeats == 5


def test_repeated_tool_call_loop_is_counted() -> None:
    s = SessionSignals()
    for i in range(5):
        args = '{"path": "/x"}' if i % 2 else '{ "path" : "/x" }'
        run(s, "a", [], streaming=False, body=agent_body(call("read", args)))
    assert row(s, "a").tool_call_repeats == 5


# --- signals age: with the session's own steps, with time, and when a breaker settles them ------------------


def test_a_different_step_ends_the_loop() -> None:
    """A session that stopped looping stops matching: the count is the loop it is in now, not its worst."""
    s = SessionSignals()
    for _ in range(6):
        run(s, "a", [], streaming=False, body=agent_body(call("read", '{"path": "/x"}')))
    assert row(s, "a").tool_call_repeats == 6
    run(s, "a", [], streaming=False, body=agent_body(call("write", "{}")))
    assert row(s, "a").tool_call_repeats == 1
    run(s, "a", [], streaming=False, body={"messages": [{"role": "user", "content": "new task"}]})
    assert row(s, "a").tool_call_repeats == 1  # a step without tool calls is a different step too
    for _ in range(4):
        run(s, "a", [], streaming=False, body={"messages": [{"role": "user", "content": "chat"}]})
    assert row(s, "a").tool_call_repeats == 0  # plain requests are no loop


def test_a_quiet_session_ages_out_of_every_windowed_signal() -> None:
    clock = Clock()
    s = SessionSignals(monotonic=clock, max_age=120.0, half_life=1e9)
    for prompt in (1000, 4000, 7000, 10000, 13000):
        body = agent_body(call("read", '{"path": "/x"}'))
        run(s, "a", [json_response(usage(prompt, 1, 0))], streaming=False, body=body)
    r = row(s, "a")
    assert (r.tool_call_repeats, r.context_growth_tokens, r.prefix_cache_hit_ratio) == (5, 3000.0, 0.0)
    clock.advance(119.0)
    assert row(s, "a").tool_call_repeats == 5  # not yet
    clock.advance(2.0)
    r = row(s, "a")
    assert (r.tool_call_repeats, r.context_growth_tokens, r.prefix_cache_hit_ratio) == (0, None, None)
    assert (r.requests_total, r.prompt_tokens_total) == (5, 35000)  # counters are not windowed
    run(s, "a", [], streaming=False, body=agent_body(call("read", '{"path": "/x"}')))
    assert row(s, "a").tool_call_repeats == 1  # the old loop does not come back with the next step


def test_steps_age_one_by_one_and_the_other_row_ages_too() -> None:
    clock = Clock()
    s = SessionSignals(top_k=0, monotonic=clock, max_age=60.0, active=1e9)
    for _ in range(3):
        run(s, "a", [], streaming=False, body=agent_body(call("f", "{}")))
        clock.advance(20.0)
    assert row(s, "other").tool_call_repeats == 3  # steps 60, 40 and 20 s old: none older than 60 s
    clock.advance(1.0)
    assert row(s, "other").tool_call_repeats == 2
    clock.advance(40.0)
    assert row(s, "other").tool_call_repeats == 0


def test_a_breaker_settles_the_session_s_signals() -> None:
    s = SessionSignals()
    for prompt in (1000, 5000, 9000):
        body = agent_body(call("read", '{"path": "/x"}'))
        run(s, "a~", [json_response(usage(prompt, 1, 0))], streaming=False, body=body)
        run(s, "b", [], streaming=False, body=body)
    s.settle("a~")  # the gateway's name; the row is labelled "a~~"
    s.settle("nobody")
    r = row(s, "a~~")
    assert (r.tool_call_repeats, r.context_growth_tokens, r.prefix_cache_hit_ratio) == (0, None, None)
    assert r.requests_total == 3
    assert row(s, "b").tool_call_repeats == 3  # other sessions keep theirs


@pytest.mark.parametrize(
    "kw",
    [
        {"top_k": -1},
        {"max_sessions": 0},
        {"window": 1},
        {"loop_window": 1},
        {"half_life": 0.0},
        {"active": -1.0},
        {"max_age": 0.0},
    ],
)
def test_bad_parameters_are_refused(kw: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        SessionSignals(**kw)  # type: ignore[arg-type]
