"""vLLM's per-request speculative decoding metrics, read by the gateway and counted by batch-size range.

The bodies are the ones a real vLLM 0.32 sent (tests/fixtures/README.md says how they were captured), replayed
through a real GatewayServer by the loopback upstream.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.support.gateway_upstream import Upstream, fixed, sse
from vllm_watchdog.gateway.control.metrics import exposition
from vllm_watchdog.gateway.dataplane.bodies import RequestTrace
from vllm_watchdog.gateway.dataplane.server import GatewayServer
from vllm_watchdog.gateway.dataplane.specrequests import SpecRequests, SpecScan, sample_of
from vllm_watchdog.gateway.protocol.codec import decode, encode
from vllm_watchdog.gateway.protocol.snapshot import GatewaySnapshot, SpecDecodeCounts
from vllm_watchdog.sources.specranges import RANGES, range_label

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
JSON_BODY = (FIXTURES / "vllm-0.32.0-per-request-spec-metrics.json").read_bytes()
SSE_BODY = (FIXTURES / "vllm-0.32.0-per-request-spec-metrics.sse").read_bytes()
SPEC = json.loads(JSON_BODY)["metrics"]["speculative_decoding"]
# A stream leaves out what is unset: the per-step arrays of "detailed", null in the JSON body under "summary".
STREAMED = {k: v for k, v in SPEC.items() if v is not None}
# What vLLM sent in both captures: 6 verify steps, 14 draft tokens, 10 accepted, steps by accepted j.
CAPTURED = SpecDecodeCounts(1, 6, 14, 10, (1, 2, 1, 2, 0))
COMPLETION = {"model": "tiny-llama", "prompt": "one two three four", "max_tokens": 32}
STREAM = {**COMPLETION, "stream": True, "stream_options": {"include_usage": True}}


def events(body: bytes) -> list[bytes]:
    """An SSE body as its events, each with its blank line."""
    return [e + b"\n\n" for e in body.split(b"\n\n") if e]


def spec_counts(gw: GatewayServer) -> dict[str, SpecDecodeCounts]:
    """The gateway's counts, read on its loop once the request's trace has finished."""
    return dict(gw.call_sync(gw.snapshot, timeout=10).proxy.spec_decode)


def test_the_captured_bodies_carry_the_object() -> None:
    """The fixtures are what the tests say: vLLM's summary object in the JSON body and the final usage event."""
    assert sample_of(SPEC) == (6, 14, 10, (1, 2, 1, 2, 0))
    assert SPEC["per_step_accepted"] is None and len(STREAMED) == 7
    last = json.loads(events(SSE_BODY)[-2].removeprefix(b"data: "))
    assert last["choices"] == [] and last["metrics"]["speculative_decoding"] == STREAMED


@pytest.mark.parametrize("size", [1, 7, 22, 64, 1 << 20])
def test_a_stream_split_anywhere_gives_the_object(size: int) -> None:
    scan = SpecScan()
    for i in range(0, len(SSE_BODY), size):
        scan.feed(SSE_BODY[i : i + size])
    assert scan.found == STREAMED


def test_the_detailed_arrays_are_cut_not_read() -> None:
    steps = ",".join(["4"] * 5000)
    detailed = {**STREAMED, "per_step_accepted": "ARRAY", "per_step_drafted": "ARRAY"}
    text = json.dumps({"usage": {}, "metrics": {"speculative_decoding": detailed}}, separators=(",", ":"))
    body = b"data: " + text.replace('"ARRAY"', f"[{steps}]").encode() + b"\n\n"
    assert len(body) > 20_000
    scan = SpecScan()
    for i in range(0, len(body), 100):
        scan.feed(body[i : i + 100])
    assert scan.found == STREAMED  # the counts, without the per-step arrays


def test_a_stream_without_the_object_holds_nothing() -> None:
    scan = SpecScan()
    for event in events(SSE_BODY)[:-2]:  # every event but the final usage one and [DONE]
        scan.feed(event)
        assert (scan.found, scan._pending, scan._tail) == (None, None, b"")
    scan.feed(b'data: {"text": "speculative_decoding \\"speculative_decoding\\""}')  # in text: no key
    assert scan.found is None and scan._pending is None
    scan.feed(b'data: {"metrics": {"speculative_decoding": null}}\n\n')
    assert scan.found is None and scan._pending is None


def test_an_unfinished_object_is_kept_only_up_to_its_bound() -> None:
    scan = SpecScan()
    scan.feed(b'data: {"metrics":{"speculative_decoding":{"num_spec_steps":' + b"1" * 100)
    assert scan._pending is not None
    scan.feed(b"1" * 5000)  # past the bound: dropped, not grown
    assert scan._pending is None and scan.found is None


@pytest.mark.parametrize(
    "change",
    [
        {"num_spec_steps": "6"},
        {"num_draft_tokens": -1},
        {"num_accepted_draft_tokens": 10**30},
        {"num_spec_steps": 6.0},
        {"num_spec_steps": True},
        {"num_draft_tokens": None},
        {"acceptance_histogram": "1,2,1,2,0"},
        {"acceptance_histogram": [1, -1, 1]},
        {"acceptance_histogram": [1, 2, 10**30]},
        {"acceptance_histogram": [1, {"a": 1}]},
    ],
)
def test_malformed_values_are_not_counted(change: dict[str, object]) -> None:
    counts = SpecRequests()
    assert counts.observe(1, {**SPEC, **change}) is False
    assert counts.observe(1, ["not", "an", "object"]) is False
    assert counts.snapshot() == {}


def test_histogram_entries_past_16_are_not_read() -> None:
    counts = SpecRequests()
    assert counts.observe(5, {**SPEC, "acceptance_histogram": [1] * 17 + ["x", -1, 10**30] * 61})
    assert counts.snapshot() == {"4-7": SpecDecodeCounts(1, 6, 14, 10, (1,) * 17)}


def test_counts_sum_by_range_and_position() -> None:
    counts = SpecRequests()
    for batch in (1, 2, 3, 300):
        counts.observe(batch, SPEC)
    counts.observe(2, {**SPEC, "acceptance_histogram": [5, 0, 0, 0, 0, 0, 7]})
    assert counts.snapshot() == {
        "1": CAPTURED,
        "2-3": SpecDecodeCounts(3, 18, 42, 30, (7, 4, 2, 4, 0, 0, 7)),
        "256+": CAPTURED,
    }
    assert [range_label(i) for i in range(len(RANGES))][-1] == "256+"  # the estimator's ranges, its labels


def test_the_trace_reads_the_object_from_a_json_body_and_only_below_400() -> None:
    done = []
    trace = RequestTrace(done.append, streaming=False, content_type="application/json")
    trace.feed(JSON_BODY[:100])
    trace.feed(JSON_BODY[100:])
    trace.finish(200)
    assert trace.spec == SPEC and done[0] is not None and done[0]["completion_tokens"] == 32
    failed = RequestTrace(done.append, streaming=True, content_type="text/event-stream")
    failed.feed(SSE_BODY)
    failed.finish(500)
    assert failed.spec is None


def test_json_and_streamed_responses_are_counted_in_their_batch_size_range(
    upstream: Upstream, gateway: Callable[..., GatewayServer]
) -> None:
    go = threading.Event()
    upstream.routes["/v1/chat/completions"] = sse([b"data: held\n\n", b"data: [DONE]\n\n"], go)
    upstream.routes["/v1/completions"] = fixed(200, [("Content-Type", "application/json")], JSON_BODY)
    gw = gateway()
    with httpx.Client(timeout=30) as client:
        r = client.post(gw.url + "/v1/completions", json=COMPLETION)
        assert r.content == JSON_BODY
        wait_for(lambda: spec_counts(gw) == {"1": CAPTURED})  # alone in flight

        with ThreadPoolExecutor(2) as pool:  # two streams held in flight: the next request is the third
            held = [pool.submit(hold, gw.url, go) for _ in range(2)]
            try:
                wait_for(lambda: gw.call_sync(lambda: gw.gate.in_flight) == 2)
                upstream.routes["/v1/completions"] = sse(events(SSE_BODY))
                with client.stream("POST", gw.url + "/v1/completions", json=STREAM) as s:
                    assert b"".join(s.iter_raw()) == SSE_BODY
            finally:
                go.set()
            assert [h.result(30) for h in held] == [b"data: held\n\ndata: [DONE]\n\n"] * 2
    wait_for(lambda: "2-3" in spec_counts(gw))
    assert spec_counts(gw) == {"1": CAPTURED, "2-3": CAPTURED}
    snap = gw.call_sync(gw.snapshot, timeout=10)
    assert decode(GatewaySnapshot, encode(snap)) == snap  # what the control channel carries to the daemon
    got = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for f in text_string_to_metric_families(exposition(snap))
        for s in f.samples
        if s.name.startswith("vllm_watchdog_gateway_spec_decode_")
    }
    p, t = "vllm_watchdog_gateway_spec_decode_", ("target", "test")
    assert got[(p + "requests_total", (("batch_size", "2-3"), t))] == 1
    assert got[(p + "steps_total", (("batch_size", "1"), t))] == 6
    assert got[(p + "draft_tokens_total", (("batch_size", "1"), t))] == 14
    assert got[(p + "accepted_tokens_total", (("batch_size", "2-3"), t))] == 10
    assert got[(p + "accepted_per_step_total", (("accepted", "3"), ("batch_size", "2-3"), t))] == 2
    assert len(got) == 2 * (4 + 5)


def test_responses_without_the_object_count_nothing(
    upstream: Upstream, gateway: Callable[..., GatewayServer]
) -> None:
    plain = json.loads(JSON_BODY)
    del plain["metrics"]
    upstream.routes["/v1/completions"] = fixed(
        200, [("Content-Type", "application/json")], json.dumps(plain).encode()
    )
    upstream.routes["/v1/chat/completions"] = sse([*events(SSE_BODY)[:-2], b"data: [DONE]\n\n"])
    hostile = {**SPEC, "num_spec_steps": -1, "acceptance_histogram": list(range(200))}
    bad = json.dumps({"choices": [], "metrics": {"speculative_decoding": hostile}}).encode()
    upstream.routes["/v1/hostile"] = fixed(200, [("Content-Type", "application/json")], bad)
    gw = gateway()
    with httpx.Client(timeout=30) as client:
        assert client.post(gw.url + "/v1/completions", json=COMPLETION).status_code == 200
        assert client.post(gw.url + "/v1/chat/completions", json=STREAM).status_code == 200
        upstream.routes["/v1/completions"] = upstream.routes["/v1/hostile"]
        assert client.post(gw.url + "/v1/completions", json=COMPLETION).content == bad
    wait_for(lambda: sum(gw.call_sync(gw.snapshot, timeout=10).proxy.responses_total.values()) == 3)
    wait_for(lambda: gw.call_sync(lambda: gw.gate.in_flight) == 0)
    assert spec_counts(gw) == {}


def hold(url: str, go: threading.Event) -> bytes:
    """A stream the upstream holds open until `go`: one request in flight."""
    with (
        httpx.Client(timeout=30) as client,
        client.stream("POST", url + "/v1/chat/completions", json=STREAM) as r,
    ):
        return b"".join(r.iter_raw())


def wait_for(check: Callable[[], bool]) -> None:
    """Wait (bounded) for something the gateway's loop does after a response."""
    done = threading.Event()
    for _ in range(500):
        if check():
            return
        done.wait(0.02)
    raise AssertionError("never happened")
