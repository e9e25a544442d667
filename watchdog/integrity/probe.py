"""One known-answer probe: the requests to a target's own URL and the parsing of its answers.

Each prompt is one `POST /v1/completions` of prompt + reference at temperature 0 with `prompt_logprobs: 0`
(the logprob of every token of the text, teacher forced) and `logprobs: 2` (the greedy tokens and their top-2
margins). Bodies are read up to MAX_BODY_BYTES; an answer that is not the expected JSON is a ProbeError with
a one-line reason, never another exception, and never quotes the prompt.
"""

from __future__ import annotations

import asyncio
import json
import math
from collections.abc import Mapping, Sequence
from typing import Any

import httpx

from ..config.targets import TargetConfig
from .config import KnownPrompt
from .identity import ModelIdentity, launch_flags, weights_fingerprint
from .scoring import PromptScore

MAX_BODY_BYTES = 4 << 20
MAX_TOKENS_SCORED = 8192  # prompt tokens of one answer


class ProbeError(Exception):
    """A probe that gave no usable answer: the message is one line, without prompt text."""


def headers_of(target: TargetConfig) -> dict[str, str]:
    """The bearer the canary sends (vLLM's --api-key), which the probe sends too."""
    key = target.canary.api_key
    return {"Authorization": f"Bearer {key}"} if key else {}


async def _get_json(
    client: httpx.AsyncClient, method: str, url: str, timeout: float, **kwargs: Any
) -> dict[str, Any]:
    """A JSON object from one request, its body read up to MAX_BODY_BYTES; ProbeError otherwise."""
    path = httpx.URL(url).path
    try:
        async with client.stream(method, url, timeout=timeout, **kwargs) as resp:
            if resp.status_code != 200:
                raise ProbeError(f"{path} returned HTTP status {resp.status_code}")
            chunks: list[bytes] = []
            size = 0
            async for chunk in resp.aiter_bytes():
                size += len(chunk)
                if size > MAX_BODY_BYTES:
                    raise ProbeError(f"{path}: answer larger than {MAX_BODY_BYTES} bytes")
                chunks.append(chunk)
    except httpx.TimeoutException:
        raise ProbeError(f"{path}: timeout after {timeout:g}s") from None
    except httpx.HTTPError as exc:
        raise ProbeError(f"{path}: {type(exc).__name__}: {exc}") from None
    except ValueError as exc:  # a CredentialError: the target's credentials file cannot be read
        raise ProbeError(f"{path}: {exc}") from None
    try:
        data = json.loads(b"".join(chunks))
    except ValueError:
        raise ProbeError(f"{path}: answer is not JSON") from None
    if not isinstance(data, dict):
        raise ProbeError(f"{path}: answer is not a JSON object")
    return data


async def fetch_identity(client: httpx.AsyncClient, target: TargetConfig, timeout: float) -> ModelIdentity:
    """The served model's identity: /v1/models, /version, the launch flags and the weights' fingerprint."""
    base = target.url.rstrip("/")
    models = await _get_json(client, "GET", base + "/v1/models", timeout, headers=headers_of(target))
    data = models.get("data")
    first = data[0] if isinstance(data, list) and data else None
    if not isinstance(first, dict) or not isinstance(first.get("id"), str):
        raise ProbeError("/v1/models lists no model")
    try:
        version = (await _get_json(client, "GET", base + "/version", timeout)).get("version")
    except ProbeError:
        version = ""  # an older vLLM, or a proxy in front of it
    root = first.get("root") if isinstance(first.get("root"), str) else ""
    max_len = first.get("max_model_len")
    flags = launch_flags(target.command)
    return ModelIdentity(
        served_name=first["id"][:256],
        root=str(root)[:4096],
        version=str(version)[:64] if isinstance(version, str) else "",
        max_model_len=max_len if isinstance(max_len, int) else 0,
        dtype=flags.get("dtype", ""),
        quantization=flags.get("quantization", ""),
        speculative_config=flags.get("speculative_config", ""),
        weights=await asyncio.to_thread(weights_fingerprint, str(root)) if root else "",
    )


async def probe_prompt(
    client: httpx.AsyncClient, target: TargetConfig, model: str, prompt: KnownPrompt, timeout: float
) -> PromptScore:
    """Send one prompt and score its answer; ProbeError (one line, no prompt text) if unusable."""
    body = {
        "model": model,
        "prompt": prompt.prompt + prompt.reference,
        "max_tokens": prompt.max_tokens,
        "temperature": 0,
        "prompt_logprobs": 0,
        "logprobs": 2,
        "stream": False,
    }
    url = target.url.rstrip("/") + "/v1/completions"
    data = await _get_json(client, "POST", url, timeout, json=body, headers=headers_of(target))
    return parse_answer(prompt.name, data)


def parse_answer(name: str, data: Mapping[str, Any]) -> PromptScore:
    """A completion answer's scores; ProbeError naming what was missing."""
    choices = data.get("choices")
    choice = choices[0] if isinstance(choices, list) and choices else None
    if not isinstance(choice, dict):
        raise ProbeError(f"prompt {name}: answer has no choices")
    logprobs = _prompt_logprobs(name, choice.get("prompt_logprobs"))
    greedy, margins = _greedy(name, choice.get("logprobs"))
    usage = data.get("usage")
    tokens = 0
    if isinstance(usage, dict):
        tokens = sum(v for k in ("prompt_tokens", "completion_tokens") if isinstance(v := usage.get(k), int))
    return PromptScore(name, logprobs, greedy, margins, tokens or len(logprobs) + 1 + len(greedy))


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if not math.isnan(value) else None


def _prompt_logprobs(name: str, entries: Any) -> tuple[float, ...]:
    """One logprob per prompt token after the first (vLLM answers null for the first)."""
    if not isinstance(entries, list) or len(entries) < 2 or len(entries) > MAX_TOKENS_SCORED:
        raise ProbeError(f"prompt {name}: answer has no prompt_logprobs (is this vLLM?)")
    out: list[float] = []
    for entry in entries[1:]:
        first = next(iter(entry.values()), None) if isinstance(entry, dict) else None
        value = _number(first.get("logprob")) if isinstance(first, dict) else None
        if value is None:
            raise ProbeError(f"prompt {name}: a prompt_logprobs entry has no logprob")
        out.append(value)
    return tuple(out)


def _greedy(name: str, logprobs: Any) -> tuple[tuple[str, ...], tuple[float, ...]]:
    """The greedy tokens and, at each, the margin between the best two candidates."""
    tokens = logprobs.get("tokens") if isinstance(logprobs, dict) else None
    tops = logprobs.get("top_logprobs") if isinstance(logprobs, dict) else None
    if not isinstance(tokens, list) or not isinstance(tops, list) or len(tokens) > MAX_TOKENS_SCORED:
        raise ProbeError(f"prompt {name}: answer has no logprobs")
    if not all(isinstance(t, str) for t in tokens):
        raise ProbeError(f"prompt {name}: a greedy token is not a string")
    margins = [_margin(top) for top in tops[: len(tokens)]]
    margins += [math.inf] * (len(tokens) - len(margins))
    return tuple(t[:64] for t in tokens), tuple(margins)


def _margin(top: Any) -> float:
    values = sorted(
        (v for v in (_number(x) for x in top.values()) if v is not None) if isinstance(top, dict) else (),
        reverse=True,
    )
    return values[0] - values[1] if len(values) >= 2 else math.inf


async def probe_all(
    client: httpx.AsyncClient,
    target: TargetConfig,
    model: str,
    prompts: Sequence[KnownPrompt],
    timeout: float,
    concurrent: bool = False,
) -> tuple[PromptScore, ...]:
    """Every prompt, one after another or all at once (another batch shape); ProbeError at a failure."""
    if concurrent:
        return tuple(
            await asyncio.gather(*(probe_prompt(client, target, model, p, timeout) for p in prompts))
        )
    return tuple([await probe_prompt(client, target, model, p, timeout) for p in prompts])
