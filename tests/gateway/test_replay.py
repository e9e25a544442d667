"""Replay through a restart: the real gateway (uvicorn, aiohttp) in front of an upstream whose requests freeze
until the test "stops the engine" (drops their connections), drained and undrained by the same command table
the daemon's control channel uses."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Callable
from typing import Any

import pytest

from tests.support.gateway_upstream import SSE_HEAD, Upstream, chunk, echo, sse
from tests.support.replayrig import (
    BOOM,
    BOOM_500,
    COMPLETION,
    DEAD,
    DEAD_500,
    DEAD_EVENT,
    EVENTS,
    PATH,
    REPLAYED,
    STREAM,
    Engine,
    Rig,
    eventually,
    revive,
)
from vllm_watchdog.config.gatewayreplay import ReplayConfig
from vllm_watchdog.config.model import parse_config
from vllm_watchdog.errors import ConfigError


def test_a_plain_request_in_flight_when_the_engine_is_stopped_during_a_drain_is_replayed(
    rig: Callable[..., Rig], upstream: Upstream
) -> None:
    r = rig()
    engine = Engine()
    upstream.routes[PATH] = engine
    pending = r.post()
    eventually(lambda: engine.frozen == 1, "the request reached the engine")
    r.drain(True)  # the restart begins
    engine.stop()
    eventually(lambda: r.proxy().replays_held == 1, "the request is held")
    assert not pending.done()
    revive(upstream)
    r.drain(False)  # the new engine is ready
    response = pending.result(30)
    assert response.status_code == 200
    assert response.headers[REPLAYED] == "1"
    assert json.loads(response.json()["body"]) == COMPLETION  # the same body sent again
    assert len(r.completions()) == 2
    proxy = r.proxy()
    assert proxy.replays_total == {"replayed": 1}
    assert proxy.replays_held == 0
    assert proxy.upstream_errors_total.get("protocol", 0) == 0  # the client never saw the failure
    assert proxy.responses_total == {"200": 1}


def test_a_stream_stopped_before_its_first_chunk_is_replayed_as_a_whole_stream(
    rig: Callable[..., Rig], upstream: Upstream
) -> None:
    r = rig()
    engine = Engine(head=SSE_HEAD)  # vLLM sends its head at once, the first event with the first token
    upstream.routes[PATH] = engine
    pending = r.stream()
    eventually(lambda: engine.frozen == 1, "the stream reached the engine")
    r.drain(True)
    engine.stop()
    eventually(lambda: r.proxy().replays_held == 1, "the stream is held")
    revive(upstream, sse(EVENTS))
    r.drain(False)
    status, headers, body = pending.result(30)
    assert (status, headers[REPLAYED]) == (200, "1")
    assert headers["content-type"] == "text/event-stream"
    assert body == b"".join(EVENTS)
    assert r.outcomes() == {"replayed": 1}


@pytest.mark.parametrize("drained_first", [True, False], ids=["while-drained", "before-the-drain"])
@pytest.mark.parametrize(
    ("head", "last", "streamed"),
    [(b"", DEAD_500, False), (SSE_HEAD, DEAD_EVENT, True)],
    ids=["500", "sse-error-event"],
)
def test_the_engines_dead_answer_is_replayed_once_the_restart_drains(
    rig: Callable[..., Rig], upstream: Upstream, head: bytes, last: bytes, streamed: bool, drained_first: bool
) -> None:
    """vLLM answers EngineDeadError to what it held as its engine goes: during the restart's drain, or
    before its process exits and the watchdog's respawn drains; then the request waits up to dead_window
    (30 s), not drain_window, for that drain."""
    r = rig(replay={"drain_window": 0.1})
    engine = Engine(head=head, last=last)
    upstream.routes[PATH] = engine
    pending = r.stream() if streamed else r.post()
    eventually(lambda: engine.frozen == 1, "the request reached the engine")
    if drained_first:
        r.drain(True)
    engine.stop()
    if not drained_first:
        waiting = lambda: r.gw.call_sync(lambda: r.gw.proxy.replays.awaiting_drain)  # noqa: E731
        eventually(lambda: waiting() == 1, "the failure waits")
        time.sleep(0.3)  # past drain_window: it still waits
        assert not pending.done()
        r.drain(True)  # the respawn begins
        eventually(lambda: waiting() == 0, "it saw the drain")
    eventually(lambda: r.proxy().replays_held == 1, "the request is held")
    revive(upstream, sse(EVENTS) if streamed else echo)
    r.drain(False)
    result = pending.result(30)
    status, headers = (
        (result[0], result[1]) if isinstance(result, tuple) else (result.status_code, result.headers)
    )
    assert (status, headers[REPLAYED]) == (200, "1")
    assert r.outcomes() == {"replayed": 1}
    assert r.proxy().responses_total == {"200": 1}


def test_an_error_of_an_engine_that_lives_is_forwarded_as_today(
    rig: Callable[..., Rig], upstream: Upstream
) -> None:
    r = rig(replay={"drain_window": 60.0})
    engine = Engine(last=BOOM_500)
    upstream.routes[PATH] = engine
    pending = r.post()
    eventually(lambda: engine.frozen == 1, "the request reached the engine")
    engine.stop()
    response = pending.result(30)
    assert (response.status_code, response.content) == (500, BOOM)
    assert REPLAYED not in response.headers
    assert r.outcomes() == {}


def test_a_dead_engines_answer_with_no_drain_in_its_window_is_an_error(
    rig: Callable[..., Rig], upstream: Upstream
) -> None:
    r = rig(replay={"dead_window": 0.1})
    engine = Engine(last=DEAD_500)
    upstream.routes[PATH] = engine
    pending = r.post()
    eventually(lambda: engine.frozen == 1, "the request reached the engine")
    engine.stop()
    response = pending.result(30)
    assert response.status_code == 502 and REPLAYED not in response.headers
    assert r.outcomes() == {"not_drained": 1}
    assert len(r.completions()) == 1


def completion_event(text: str, finish: str | None = None) -> bytes:
    """One vLLM completions SSE event."""
    doc = {"id": "cmpl-1", "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish}]}
    return b"data: " + json.dumps(doc).encode() + b"\n\n"


def chat_event(delta: dict[str, str], finish: str | None = None) -> bytes:
    """One vLLM chat SSE event."""
    doc = {
        "id": "chatcmpl-1",
        "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}],
    }
    return b"data: " + json.dumps(doc).encode() + b"\n\n"


CHAT = "/v1/chat/completions"
ASKED = [{"role": "user", "content": "tell"}]


@pytest.mark.parametrize(
    ("path", "body", "before", "after", "wanted"),
    [
        (
            PATH,
            {**STREAM, "prompt": "Once", "max_tokens": 5},
            [completion_event(" upon"), completion_event(" a")],
            [completion_event(" time"), completion_event(",", "length"), b"data: [DONE]\n\n"],
            {**STREAM, "prompt": "Once upon a", "max_tokens": 3},
        ),
        (
            CHAT,
            {"model": "m", "messages": ASKED, "stream": True},
            [chat_event({"role": "assistant", "content": ""}), chat_event({"content": "Once"})],
            [
                chat_event({"role": "assistant", "content": ""}),
                chat_event({"content": " more"}, "stop"),
                b"data: [DONE]\n\n",
            ],
            {
                "model": "m",
                "messages": [*ASKED, {"role": "assistant", "content": "Once"}],
                "stream": True,
                "continue_final_message": True,
                "add_generation_prompt": False,
            },
        ),
    ],
    ids=["completion", "chat"],
)
def test_a_stream_that_had_sent_text_goes_on_on_the_new_engine(
    rig: Callable[..., Rig],
    upstream: Upstream,
    path: str,
    body: dict[str, Any],
    before: list[bytes],
    after: list[bytes],
    wanted: dict[str, Any],
) -> None:
    r = rig()
    engine = Engine(head=SSE_HEAD + b"".join(chunk(e) for e in before))
    upstream.routes[path] = engine
    pending = r.stream(body, path)
    eventually(lambda: engine.frozen == 1, "the stream reached the engine")
    r.drain(True)
    engine.stop()
    eventually(lambda: r.proxy().replays_held == 1, "the stream is held")
    upstream.routes[path] = sse(after)
    r.drain(False)
    status, _, got = pending.result(30)
    assert status == 200
    assert got == b"".join(before + after)  # one stream: the old events, then the new engine's, nothing twice
    sent = [json.loads(s.body) for s in upstream.seen if s.target == path]
    assert sent == [body, wanted]
    assert r.outcomes() == {"resumed": 1}


def test_a_stream_whose_engine_died_between_events_goes_on_once_the_respawn_drains(
    rig: Callable[..., Rig], upstream: Upstream
) -> None:
    """The engine dies mid-stream and vLLM sends its EngineDeadError event: that event is not the client's,
    the stream goes on on the new engine."""
    r = rig(replay={"drain_window": 0.1})
    before = [completion_event(" upon")]
    dead = chunk(b"data: " + DEAD + b"\n\n") + chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n"
    engine = Engine(head=SSE_HEAD + b"".join(chunk(e) for e in before), last=dead)
    upstream.routes[PATH] = engine
    body = {**STREAM, "prompt": "Once", "max_tokens": 3}
    pending = r.stream(body)
    eventually(lambda: engine.frozen == 1, "the stream reached the engine")
    engine.stop()
    eventually(lambda: r.gw.call_sync(lambda: r.gw.proxy.replays.awaiting_drain) == 1, "the stream waits")
    r.drain(True)
    eventually(lambda: r.gw.call_sync(lambda: r.gw.proxy.replays.awaiting_drain) == 0, "it saw the drain")
    after = [completion_event(" a"), completion_event(" time", "length"), b"data: [DONE]\n\n"]
    upstream.routes[PATH] = sse(after)
    r.drain(False)
    status, _, got = pending.result(30)
    assert status == 200 and got == b"".join(before + after)  # no error event, nothing twice
    assert [json.loads(s.body)["prompt"] for s in r.completions()] == ["Once", "Once upon"]
    assert r.outcomes() == {"resumed": 1}


@pytest.mark.parametrize(
    "body",
    [{**STREAM, "logprobs": 1}, {**STREAM, "n": 2}, {**STREAM, "prompt": [1, 2, 3]}],
    ids=["logprobs", "n", "tokens"],
)
def test_a_stream_that_cannot_go_on_is_cut_off_as_today(
    rig: Callable[..., Rig], upstream: Upstream, body: dict[str, Any]
) -> None:
    r = rig()
    engine = Engine(head=SSE_HEAD + chunk(EVENTS[0]))
    upstream.routes[PATH] = engine
    pending = r.stream(body)
    eventually(lambda: engine.frozen == 1, "the stream reached the engine")
    r.drain(True)
    engine.stop()
    status, headers, got = pending.result(30)
    assert status == 200 and REPLAYED not in headers
    assert isinstance(got, str) and got.startswith(f"cut off after {EVENTS[0]!r}")
    assert len(r.completions()) == 1
    assert r.outcomes() == {"not_resumable": 1}
    assert r.proxy().upstream_errors_total["protocol"] == 1


def test_a_stream_cut_inside_an_event_is_cut_off_as_today(
    rig: Callable[..., Rig], upstream: Upstream
) -> None:
    r = rig()
    engine = Engine(head=SSE_HEAD + chunk(EVENTS[0]) + chunk(EVENTS[1][:10]))
    upstream.routes[PATH] = engine
    pending = r.stream()
    eventually(lambda: engine.frozen == 1, "the stream reached the engine")
    r.drain(True)
    engine.stop()
    status, _, got = pending.result(30)
    assert status == 200 and isinstance(got, str) and got.startswith("cut off after")
    assert len(r.completions()) == 1
    assert r.outcomes() == {}


def test_without_a_drain_the_client_gets_todays_error(rig: Callable[..., Rig], upstream: Upstream) -> None:
    r = rig(replay={"drain_window": 0.1, "dead_window": 0.1})
    engine = Engine()
    upstream.routes[PATH] = engine
    pending = r.post()
    eventually(lambda: engine.frozen == 1, "the request reached the engine")
    revive(upstream)  # a new request would succeed: the failed one must still not be sent again
    engine.stop()
    response = pending.result(30)
    assert response.status_code == 502
    assert response.json()["error"]["code"] == "upstream_protocol"
    assert REPLAYED not in response.headers
    assert len(r.completions()) == 1
    assert r.outcomes() == {"not_drained": 1}
    assert r.proxy().upstream_errors_total["protocol"] == 1


def test_a_drain_that_begins_within_the_window_after_the_failure_makes_it_replayable(
    rig: Callable[..., Rig], upstream: Upstream
) -> None:
    r = rig(replay={"drain_window": 60.0})
    engine = Engine()
    upstream.routes[PATH] = engine
    pending = r.post()
    eventually(lambda: engine.frozen == 1, "the request reached the engine")
    engine.stop()  # the engine died before the watchdog began its restart
    eventually(lambda: r.gw.call_sync(lambda: r.gw.proxy.replays.awaiting_drain) == 1, "the failure waits")
    r.drain(True)
    eventually(lambda: r.gw.call_sync(lambda: r.gw.proxy.replays.awaiting_drain) == 0, "it saw the drain")
    revive(upstream)
    r.drain(False)
    response = pending.result(30)
    assert (response.status_code, response.headers[REPLAYED]) == (200, "1")
    assert r.outcomes() == {"replayed": 1}


def test_past_the_cap_on_held_requests_the_excess_gets_todays_error(
    rig: Callable[..., Rig], upstream: Upstream
) -> None:
    r = rig(replay={"max_held": 1})
    engine = Engine()
    upstream.routes[PATH] = engine
    first, second = r.post(), r.post()
    eventually(lambda: engine.frozen == 2, "both requests reached the engine")
    r.drain(True)
    engine.stop()
    eventually(
        lambda: r.outcomes() == {"too_many": 1} and r.proxy().replays_held == 1, "one held, one refused"
    )
    revive(upstream)
    r.drain(False)
    responses = [first.result(30), second.result(30)]
    assert sorted(resp.status_code for resp in responses) == [200, 502]
    assert [resp.headers.get(REPLAYED) for resp in responses if resp.status_code == 200] == ["1"]
    assert r.outcomes() == {"too_many": 1, "replayed": 1}


def test_past_the_cap_on_held_bytes_the_excess_gets_todays_error(
    rig: Callable[..., Rig], upstream: Upstream
) -> None:
    r = rig(replay={"max_bytes": 1000})
    engine = Engine()
    upstream.routes[PATH] = engine
    small, large = r.post(), r.post({**COMPLETION, "prompt": "x" * 2000})
    eventually(lambda: engine.frozen == 2, "both requests reached the engine")
    r.drain(True)
    engine.stop()
    eventually(lambda: r.outcomes() == {"too_large": 1} and r.proxy().replays_held == 1, "small held")
    assert large.result(30).status_code == 502
    revive(upstream)
    r.drain(False)
    assert small.result(30).status_code == 200
    assert r.outcomes() == {"too_large": 1, "replayed": 1}


def test_a_client_that_leaves_while_held_is_never_sent_again(
    rig: Callable[..., Rig], upstream: Upstream
) -> None:
    r = rig()
    engine = Engine()
    upstream.routes[PATH] = engine
    body = json.dumps(COMPLETION).encode()
    head = f"POST {PATH} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    sock = socket.create_connection(("127.0.0.1", r.gw.config.listen_port), timeout=10)
    sock.sendall(head.encode() + body)
    eventually(lambda: engine.frozen == 1, "the request reached the engine")
    r.drain(True)
    engine.stop()
    eventually(lambda: r.proxy().replays_held == 1, "the request is held")
    sock.close()  # its own deadline passed: the client gave up
    eventually(lambda: r.outcomes() == {"client_gone": 1}, "the hold ended with the client")
    assert r.proxy().replays_held == 0
    revive(upstream)
    r.drain(False)
    assert r.post().result(30).status_code == 200  # the gateway serves on, and sent nothing for the gone one
    assert len(r.completions()) == 2


def test_a_replay_that_fails_too_gets_todays_error_at_most_once(
    rig: Callable[..., Rig], upstream: Upstream
) -> None:
    r = rig()
    engine = Engine()
    upstream.routes[PATH] = engine
    pending = r.post()
    eventually(lambda: engine.frozen == 1, "the request reached the engine")
    r.drain(True)
    engine.stop()
    eventually(lambda: r.proxy().replays_held == 1, "the request is held")
    again = Engine()
    upstream.routes[PATH] = again  # the new engine freezes as well
    r.drain(False)
    eventually(lambda: again.frozen == 1, "the replay reached the new engine")
    r.drain(True)  # a second restart
    again.stop()
    response = pending.result(30)
    assert (response.status_code, response.headers[REPLAYED]) == (502, "1")
    assert len(r.completions()) == 2
    assert r.outcomes() == {"replayed": 1, "failed_again": 1}
    assert r.proxy().replays_held == 0


def test_a_held_request_waits_no_longer_than_drain_max_wait(
    rig: Callable[..., Rig], upstream: Upstream
) -> None:
    r = rig(drain_max_wait=0.2)
    engine = Engine()
    upstream.routes[PATH] = engine
    pending = r.post()
    eventually(lambda: engine.frozen == 1, "the request reached the engine")
    r.drain(True)
    engine.stop()  # and the engine never comes back within drain_max_wait
    response = pending.result(30)
    assert response.status_code == 502
    assert r.outcomes() == {"expired": 1}
    assert len(r.completions()) == 1


@pytest.mark.parametrize("overrides", [{"drain_mode": "reject"}, {"replay": {"enabled": False}}])
def test_replay_off_or_a_reject_drain_gives_todays_error(
    rig: Callable[..., Rig], upstream: Upstream, overrides: dict[str, Any]
) -> None:
    r = rig(**overrides)
    engine = Engine()
    upstream.routes[PATH] = engine
    pending = r.post()
    eventually(lambda: engine.frozen == 1, "the request reached the engine")
    r.drain(True)
    engine.stop()
    assert pending.result(30).status_code == 502
    assert r.outcomes() == {}


GATEWAY = 'targets:\n  - {name: vllm-0, url: "http://127.0.0.1:8000"}\ngateway:\n  listen: 127.0.0.1:8001\n'


def test_the_replay_section_parses_into_its_config() -> None:
    text = (
        GATEWAY
        + "  replay: {enabled: false, max_held: 8, max_bytes: 2MiB, drain_window: 0, dead_window: 5s}\n"
    )
    cfg = parse_config(text, "c.yml", env={})
    assert cfg.gateway is not None
    assert cfg.gateway.replay == ReplayConfig(
        enabled=False, max_held=8, max_bytes=2 * 1024 * 1024, drain_window=0, dead_window=5.0
    )
    default = parse_config(GATEWAY, "c.yml", env={}).gateway
    assert default is not None and default.replay == ReplayConfig()


@pytest.mark.parametrize(
    ("value", "wanted"),
    [
        ("{max_held: 0}", "gateway.replay.max_held"),
        ("{max_bytes: lots}", "gateway.replay.max_bytes"),
        ("{drain_window: soon}", "gateway.replay.drain_window"),
        ("{dead_window: -1s}", "gateway.replay.dead_window"),
        ("{enabled: sometimes}", "gateway.replay.enabled"),
        ("{max_wait: 1s}", "gateway.replay.max_wait"),
    ],
)
def test_a_bad_replay_value_is_named_with_its_file_and_line(value: str, wanted: str) -> None:
    with pytest.raises(ConfigError) as exc:
        parse_config(GATEWAY + f"  replay:\n    {value}\n", "c.yml", env={})
    assert [(p.file, p.line, p.field) for p in exc.value.problems] == [("c.yml", 6, wanted)]
