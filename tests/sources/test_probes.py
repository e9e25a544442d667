from __future__ import annotations

import json

import httpx
import pytest

from tests.support.faultserver import FaultServer
from vllm_watchdog.config.targets import CanaryConfig
from vllm_watchdog.sources.probes import CanaryProbe, HealthProbe

pytestmark = pytest.mark.anyio


async def test_health_probe_up_down_and_timeout(fault: FaultServer) -> None:
    probe = HealthProbe(fault.url + "/health", timeout=0.5)
    fault.set("/health", b"")
    assert (await probe.probe(1.0)).ok
    fault.set("/health", b"", status=503)
    st = await probe.probe(2.0)
    assert not st.ok and st.last_error == "HTTP status 503"
    fault.set("/health", b"", delay=1.5)
    st = await probe.probe(3.0)
    assert not st.ok and st.last_error == "timeout after 0.5s"
    await probe.aclose()
    assert (st.runs, st.failures) == (3, 2)


async def test_canary_discovers_model_and_needs_a_token(fault: FaultServer) -> None:
    fault.vllm_like("", model="served")
    async with httpx.AsyncClient() as client:
        canary = CanaryProbe(fault.url, CanaryConfig(prompt="secret prompt"), client)
        assert (await canary.probe(1.0)).ok
        body = next(b for m, p, b in fault.requests if p == "/v1/completions")
        assert json.loads(body) | {"prompt": "p"} == {
            "model": "served",
            "prompt": "p",
            "max_tokens": 1,
            "temperature": 0,
            "stream": False,
        }
        fault.set("/v1/completions", {"choices": [], "usage": {"completion_tokens": 0}})
        st = await canary.probe(2.0)
        assert not st.ok and st.last_error == "completion generated no tokens"
        fault.set("/v1/completions", b"<html>", content_type="text/html")
        st = await canary.probe(3.0)
        assert not st.ok and st.last_error == "/v1/completions: response is not JSON"
        assert "secret prompt" not in (st.last_error or "")


async def test_canary_sends_the_api_key_as_a_bearer_token_when_configured(fault: FaultServer) -> None:
    fault.vllm_like("", model="served")
    async with httpx.AsyncClient() as client:
        assert (await CanaryProbe(fault.url, CanaryConfig(), client).probe(1.0)).ok
        assert (await CanaryProbe(fault.url, CanaryConfig(api_key="sk-x"), client).probe(2.0)).ok
    sent = [(p, a) for p, a in fault.authorizations if p.startswith("/v1/")]
    assert sent == [
        ("/v1/models", None),
        ("/v1/completions", None),
        ("/v1/models", "Bearer sk-x"),
        ("/v1/completions", "Bearer sk-x"),
    ]
    assert "sk-x" not in repr(CanaryConfig(api_key="sk-x"))


async def test_canary_timeout_is_a_failure_not_a_hang(fault: FaultServer) -> None:
    fault.vllm_like("")
    fault.set("/v1/completions", {"usage": {"completion_tokens": 1}}, delay=1.5)
    async with httpx.AsyncClient() as client:
        st = await CanaryProbe(fault.url, CanaryConfig(timeout=0.5), client).probe(1.0)
    assert not st.ok and st.last_error == "timeout after 0.5s"


async def test_canary_re_resolves_model_after_404(fault: FaultServer) -> None:
    fault.vllm_like("", model="old")
    async with httpx.AsyncClient() as client:
        canary = CanaryProbe(fault.url, CanaryConfig(), client)
        await canary.probe(1.0)
        fault.set("/v1/completions", {"error": "model not found"}, status=404)
        assert not (await canary.probe(2.0)).ok
        assert canary.model is None
        fault.vllm_like("", model="new")
        assert (await canary.probe(3.0)).ok and canary.model == "new"
