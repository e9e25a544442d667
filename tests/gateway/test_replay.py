"""Replay through a restart: the real gateway (uvicorn, aiohttp) in front of an upstream whose requests freeze
until the test "stops the engine" (drops their connections), drained and undrained by the same command table
the daemon's control channel uses."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import httpx
import pytest

from tests.support.gateway_upstream import SSE_HEAD, Handler, Seen, Upstream, chunk, echo, response_head, sse
from vllm_watchdog.config.gatewayreplay import ReplayConfig
from vllm_watchdog.config.model import parse_config
from vllm_watchdog.errors import ConfigError
from vllm_watchdog.gateway.dataplane.commands import GatewayCommands
from vllm_watchdog.gateway.dataplane.server import GatewayServer
from vllm_watchdog.gateway.protocol.snapshot import ProxySnapshot

PATH = "/v1/completions"
COMPLETION = {"model": "m", "prompt": "hello", "max_tokens": 4}
STREAM = {**COMPLETION, "stream": True}
REPLAYED = "x-vllm-watchdog-replayed"
EVENTS = [
    b'data: {"choices":[{"text":"a"}]}\n\n',
    b'data: {"choices":[{"text":"b"}]}\n\n',
    b"data: [DONE]\n\n",
]


class Engine:
    """The upstream's completions route: each request freezes (after `head`, if given) until stop(), which
    drops its connection (after `last`: vLLM's own error for a request whose engine died), as a stopped vLLM
    does."""

    def __init__(self, head: bytes = b"", last: bytes = b"") -> None:
        self.head = head
        self.last = last
        self.stopped = threading.Event()
        self.frozen = 0  # requests frozen so far

    async def __call__(self, seen: Seen, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Freeze, then drop the connection."""
        if self.head:
            writer.write(self.head)
            await writer.drain()
        self.frozen += 1
        await asyncio.to_thread(self.stopped.wait, 30)
        if self.last:
            writer.write(self.last)
            await writer.drain()
        writer.transport.abort()

    def stop(self) -> None:
        """Stop the engine: every frozen request's connection drops."""
        self.stopped.set()


def eventually(check: Callable[[], bool], what: str) -> None:
    """Wait (bounded) until check() holds."""
    for _ in range(1000):
        if check():
            return
        time.sleep(0.02)
    raise AssertionError(f"never happened: {what}")


class Rig:
    """A gateway in front of `upstream`, a way to drain it, and clients sent in the background."""

    def __init__(self, gw: GatewayServer, upstream: Upstream) -> None:
        self.gw = gw
        self.upstream = upstream
        self.commands = GatewayCommands(gw)
        self.pool = ThreadPoolExecutor(8)

    def drain(self, drained: bool) -> None:
        """What the daemon's restart flow sends (set_drain) through the control channel."""
        self.gw.call_sync(lambda: self.commands.run("set_drain", {"drained": drained}), timeout=10)

    def proxy(self) -> ProxySnapshot:
        """The forwarding counters, read on the gateway's loop."""
        return self.gw.call_sync(self.gw.snapshot, timeout=10).proxy

    def outcomes(self) -> dict[str, int]:
        """replays_total by outcome (only those seen)."""
        return dict(self.proxy().replays_total)

    def post(self, body: dict[str, Any] | bytes = COMPLETION) -> Future[httpx.Response]:
        """A plain request in the background; its response read whole."""
        content = body if isinstance(body, bytes) else json.dumps(body).encode()

        def run() -> httpx.Response:
            with httpx.Client(timeout=60) as client:
                return client.post(
                    self.gw.url + PATH, content=content, headers={"content-type": "application/json"}
                )

        return self.pool.submit(run)

    def stream(
        self, body: dict[str, Any] = STREAM, path: str = PATH
    ) -> Future[tuple[int, dict[str, str], bytes | str]]:
        """A streamed request in the background: status, headers and its body, or the error that cut it off."""

        def run() -> tuple[int, dict[str, str], bytes | str]:
            with (
                httpx.Client(timeout=60) as client,
                client.stream("POST", self.gw.url + path, json=body) as r,
            ):
                got = b""
                try:
                    for part in r.iter_raw():
                        got += part
                except httpx.HTTPError as exc:
                    return r.status_code, dict(r.headers), f"cut off after {got!r}: {type(exc).__name__}"
                return r.status_code, dict(r.headers), got

        return self.pool.submit(run)

    def completions(self) -> list[Seen]:
        """The completions requests the upstream received."""
        return [s for s in self.upstream.seen if s.target == PATH]


@pytest.fixture
def rig(upstream: Upstream, gateway: Callable[..., GatewayServer]) -> Iterator[Callable[..., Rig]]:
    """Make a Rig with config overrides (replay: ReplayConfig keywords under `replay`)."""
    rigs: list[Rig] = []

    def make(**overrides: Any) -> Rig:
        replay = ReplayConfig(**overrides.pop("replay", {}))
        made = Rig(gateway(replay=replay, **overrides), upstream)
        rigs.append(made)
        return made

    yield make
    for made in rigs:
        made.pool.shutdown(wait=False, cancel_futures=True)


def revive(upstream: Upstream, handler: Handler = echo) -> None:
    """The new engine serves the completions route."""
    upstream.routes[PATH] = handler


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


DEAD = (
    b'{"error": {"message": "EngineCore encountered an issue.", "type": "InternalServerError", "code": 500}}'
)
DEAD_500 = (
    response_head(500, [("Content-Type", "application/json"), ("Content-Length", str(len(DEAD)))]) + DEAD
)
DEAD_EVENT = chunk(b"data: " + DEAD + b"\n\n") + chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n"


@pytest.mark.parametrize(
    ("head", "last", "streamed"),
    [(b"", DEAD_500, False), (SSE_HEAD, DEAD_EVENT, True)],
    ids=["500", "sse-error-event"],
)
def test_the_engines_own_error_while_drained_is_replayed(
    rig: Callable[..., Rig], upstream: Upstream, head: bytes, last: bytes, streamed: bool
) -> None:
    r = rig()
    engine = Engine(head=head, last=last)
    upstream.routes[PATH] = engine
    pending = r.stream() if streamed else r.post()
    eventually(lambda: engine.frozen == 1, "the request reached the engine")
    r.drain(True)
    engine.stop()  # vLLM answers what it held with EngineDeadError as its engine goes
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


def test_the_engines_own_error_without_a_drain_is_forwarded_as_today(
    rig: Callable[..., Rig], upstream: Upstream
) -> None:
    r = rig(replay={"drain_window": 60.0})
    engine = Engine(last=DEAD_500)
    upstream.routes[PATH] = engine
    pending = r.post()
    eventually(lambda: engine.frozen == 1, "the request reached the engine")
    engine.stop()
    response = pending.result(30)
    assert (response.status_code, response.content) == (500, DEAD)
    assert REPLAYED not in response.headers
    assert r.outcomes() == {}


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
    r = rig(replay={"drain_window": 0.1})
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
    eventually(lambda: r.proxy().replays_held == 1, "the request is held")
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
    text = GATEWAY + "  replay: {enabled: false, max_held: 8, max_bytes: 2MiB, drain_window: 0}\n"
    cfg = parse_config(text, "c.yml", env={})
    assert cfg.gateway is not None
    assert cfg.gateway.replay == ReplayConfig(
        enabled=False, max_held=8, max_bytes=2 * 1024 * 1024, drain_window=0
    )
    default = parse_config(GATEWAY, "c.yml", env={}).gateway
    assert default is not None and default.replay == ReplayConfig()


@pytest.mark.parametrize(
    ("value", "wanted"),
    [
        ("{max_held: 0}", "gateway.replay.max_held"),
        ("{max_bytes: lots}", "gateway.replay.max_bytes"),
        ("{drain_window: soon}", "gateway.replay.drain_window"),
        ("{enabled: sometimes}", "gateway.replay.enabled"),
        ("{max_wait: 1s}", "gateway.replay.max_wait"),
    ],
)
def test_a_bad_replay_value_is_named_with_its_file_and_line(value: str, wanted: str) -> None:
    with pytest.raises(ConfigError) as exc:
        parse_config(GATEWAY + f"  replay:\n    {value}\n", "c.yml", env={})
    assert [(p.file, p.line, p.field) for p in exc.value.problems] == [("c.yml", 6, wanted)]
