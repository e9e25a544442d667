"""The gateway in front of the real vLLM: what comes through is what vLLM said."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.support.vllm_server import VllmServer, free_port
from vllm_watchdog.gateway.config import GatewayConfig
from vllm_watchdog.gateway.dataplane.server import GatewayServer

pytestmark = pytest.mark.vllm
VOLATILE = ("id", "created", "system_fingerprint")  # differ between any two identical requests


@pytest.fixture(scope="module")
def gateway(vllm_server: VllmServer) -> Iterator[GatewayServer]:
    """A gateway in front of the shared vLLM."""
    server = GatewayServer(GatewayConfig(target="vllm", upstream=vllm_server.url, listen_port=free_port()))
    server.start()
    yield server
    server.stop(grace=1.0)


def stream_events(base: str, body: dict[str, Any]) -> tuple[str, list[Any]]:
    """The content type and the parsed SSE events (without volatile fields) of one streamed completion."""
    events: list[Any] = []
    with httpx.stream("POST", base + "/v1/completions", json=body, timeout=120) as r:
        assert r.status_code == 200
        content_type = r.headers["content-type"]
        text = r.read().decode()
    for block in text.split("\n\n"):
        if not block.strip():
            continue
        assert block.startswith("data: "), block
        data = block[len("data: ") :]
        event = data if data == "[DONE]" else json.loads(data)
        if isinstance(event, dict):
            for key in VOLATILE:
                event.pop(key, None)
        events.append(event)
    return content_type, events


def test_streamed_output_is_identical_through_the_gateway(
    vllm_server: VllmServer, gateway: GatewayServer
) -> None:
    body = {
        "model": "tiny-llama",
        "prompt": "The quick brown fox",
        "max_tokens": 12,
        "temperature": 0,
        "seed": 7,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    direct_type, direct = stream_events(vllm_server.url, body)
    via_type, via = stream_events(gateway.url, body)
    assert via_type == direct_type
    assert via == direct
    assert via[-1] == "[DONE]"
    assert len(via) >= 3  # several chunks, not one blob


def test_usage_passes_through_and_is_recorded(vllm_server: VllmServer, gateway: GatewayServer) -> None:
    body = {"model": "tiny-llama", "prompt": "Count: one two three", "max_tokens": 8, "temperature": 0}
    direct = httpx.post(vllm_server.url + "/v1/completions", json=body, timeout=120).json()
    r = httpx.post(
        gateway.url + "/v1/completions", json=body, headers={"X-Session-ID": "vllm-usage"}, timeout=120
    )
    assert r.status_code == 200
    assert r.headers["content-type"] == "application/json"
    via = r.json()
    assert via["usage"] == direct["usage"]
    assert via["choices"] == direct["choices"]
    stats = {s.session: s for s in gateway.call_sync(gateway.snapshot, timeout=10).sessions}
    assert stats["vllm-usage"].prompt_tokens_total == via["usage"]["prompt_tokens"]
    assert stats["vllm-usage"].completion_tokens_total == via["usage"]["completion_tokens"]
