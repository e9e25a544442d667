"""A fake vLLM for the known-answer tests: deterministic logprobs of the text it is sent, which a test can
shift (a perturbation), and a count of the requests it answered."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import httpx

from vllm_watchdog.config.targets import TargetConfig
from vllm_watchdog.integrity.checker import IntegrityOptions, Readiness
from vllm_watchdog.integrity.config import IntegrityConfig

URL = "http://192.0.2.10:8000"
TARGET = TargetConfig(name="t0", url=URL)


@dataclass
class FakeEngine:
    """What the fake answers: the served model, a shift of every logprob, another greedy token, raw bodies."""

    model: str = "tiny"
    shift: float = 0.0  # added to every logprob: a perturbation
    greedy_token: str = "a"  # the first greedy token
    margin: float = 1.0  # top-1 minus top-2 at every greedy token
    body: bytes | None = None  # answers every completion with this body instead
    status: int = 200
    completions: int = 0
    requests: list[str] = field(default_factory=list)

    def handler(self, request: httpx.Request) -> httpx.Response:
        """The MockTransport handler."""
        self.requests.append(request.url.path)
        if request.url.path == "/v1/models":
            return httpx.Response(
                200, json={"data": [{"id": self.model, "root": "/nonexistent", "max_model_len": 128}]}
            )
        if request.url.path == "/version":
            return httpx.Response(200, json={"version": "0.32.0"})
        self.completions += 1
        if self.status != 200:
            return httpx.Response(self.status)
        if self.body is not None:
            return httpx.Response(200, content=self.body)
        return httpx.Response(200, json=self.answer(json.loads(request.content)))

    def answer(self, body: dict[str, Any]) -> dict[str, Any]:
        """A completion answer: one logprob per word of the text, `max_tokens` greedy tokens."""
        words = body["prompt"].split()
        prompt_lps: list[Any] = [None] + [
            {str(i): {"logprob": -((len(w) % 5) / 10) - self.shift, "rank": 1, "decoded_token": "x"}}
            for i, w in enumerate(words[1:])
        ]
        n = body["max_tokens"]
        tokens = [self.greedy_token] + ["b"] * (n - 1)
        tops = [{t: -0.1, "zz": -0.1 - self.margin} for t in tokens]
        return {
            "choices": [
                {
                    "text": "".join(tokens),
                    "prompt_logprobs": prompt_lps,
                    "logprobs": {"tokens": tokens, "token_logprobs": [-0.1] * n, "top_logprobs": tops},
                }
            ],
            "usage": {"prompt_tokens": len(words), "completion_tokens": n},
        }


@dataclass
class Monitor:
    """What the monitor would say of the target: healthy, canary passing, paused or not."""

    ready: Readiness = field(default_factory=lambda: Readiness(healthy=True, canary=True))

    def readiness(self, name: str, now: float) -> Readiness:
        """IntegrityOptions.readiness."""
        return self.ready


def options(
    engine: FakeEngine, monitor: Monitor, state_dir: str | None = None, **kw: Any
) -> IntegrityOptions:
    """IntegrityOptions on the fake engine."""
    client = httpx.AsyncClient(transport=httpx.MockTransport(engine.handler))
    return IntegrityOptions(client=lambda t: client, readiness=monitor.readiness, state_dir=state_dir, **kw)


BIG = IntegrityConfig(max_tokens_per_minute=100_000)  # learning in one check
