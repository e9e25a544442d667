"""The gateway end to end: a real watchdog process with its gateway in front of a real vLLM.

Session limits keep one flooding session from starving another, the throttle action lowers the cap and AIMD
restores it, a looping agent's session is cut off by the bundled rule and its action, and cached-token ratios
are what vLLM reported.
"""

from __future__ import annotations

import itertools
import json
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.support.configs import target, write_config
from tests.support.vllm_server import VllmServer, free_port, holding_completion
from tests.support.watchdogproc import poll, start_watchdog

pytestmark = pytest.mark.vllm
BUNDLED_GATEWAY_RULES = "bundled:gateway.rules.yml"
# One client for every request thread: a client per request loads the CA bundle each time, and ten of those
# at once starve this process so much that its own timestamps mean nothing.
CLIENT = httpx.Client(limits=httpx.Limits(max_connections=64), trust_env=False)


@dataclass
class Watchdog:
    """A running watchdog with a gateway, and where to reach both."""

    api: str
    gateway: str
    log: Path
    proc: subprocess.Popen[bytes]
    extra: dict[str, Any] = field(default_factory=dict)

    def status(self) -> dict[str, Any]:
        """GET /api/v1/gateway."""
        data: dict[str, Any] = httpx.get(self.api + "/api/v1/gateway", timeout=5).json()["data"]
        return data

    def metrics(self) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        """The watchdog's own /metrics as {(sample name, sorted labels): value}."""
        text = httpx.get(self.api + "/metrics", timeout=5).text
        out = {}
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                out[(s.name, tuple(sorted(s.labels.items())))] = s.value
        return out


@pytest.fixture
def watchdog_with_gateway(
    tmp_path: Path, vllm_server: VllmServer, request: pytest.FixtureRequest
) -> Iterator[Callable[[str], Watchdog]]:
    """Start a watchdog whose config is the common part plus `extra` YAML; stopped at teardown."""
    started: list[Watchdog] = []

    def start(extra: str) -> Watchdog:
        port, gport = free_port(), free_port()
        rest = extra.replace("GPORT", str(gport)) + "\n"
        cfg = write_config(tmp_path, target(vllm_server.url), port=port, rest=rest)
        log = tmp_path / "watchdog.log"
        wd = Watchdog(f"http://127.0.0.1:{port}", f"http://127.0.0.1:{gport}", log, start_watchdog(cfg, log))
        started.append(wd)
        poll(wd.api + "/api/v1/gateway", lambda j: j["data"]["limit"] is not None, 60, "the gateway", log)
        return wd

    yield start
    for wd in started:
        wd.proc.terminate()
        try:
            wd.proc.wait(20)
        except subprocess.TimeoutExpired:
            wd.proc.kill()
            wd.proc.wait(10)


def _completion(
    base: str,
    session: str,
    results: list[tuple[str, int, dict[str, Any], float]],
    max_tokens: int = 16,
    prompt: str = "the quick brown fox",
    temperature: float = 0.0,
    ignore_eos: bool = False,
) -> None:
    """One completion through the gateway; appends (session, status, body, finished) to results. Sampling
    (temperature > 0) defeats the shared server's ngram drafts, and ignore_eos keeps a sampled end of sequence
    from cutting it short, so a request takes its full time."""
    body = {
        "model": "tiny-llama",
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": temperature,
        "ignore_eos": ignore_eos,
    }
    sent = time.monotonic()
    resp = CLIENT.post(base + "/v1/completions", json=body, headers={"X-Session-ID": session}, timeout=120)
    try:
        data = resp.json()
    except ValueError:
        data = {"raw": resp.text[:200]}
    results.append(
        (
            session,
            resp.status_code,
            data | {"retry_after": resp.headers.get("retry-after"), "sent": sent},
            time.monotonic(),
        )
    )


def test_a_flooding_session_is_limited_while_another_gets_through(
    watchdog_with_gateway: Callable[[str], Watchdog],
) -> None:
    wd = watchdog_with_gateway(
        "gateway: {listen: 127.0.0.1:GPORT, max_in_flight: 2, sessions: {rate: 0.2, burst: 3, max_in_flight: 1}}"
    )
    results: list[tuple[str, int, dict[str, Any], float]] = []
    flood = [
        # sampled, so that each takes its full time: greedy, they rode the ngram drafts and all three had ended
        # before B was sent (CI saw B finish 0.08 s after the last of them). 256 tokens without an early end:
        # A's three run one after another for several seconds each, so B, sent 0.3 s after them, overtakes
        # them even when a loaded CI stalls the test's threads for seconds (seen: 2.4 s, with 96 tokens).
        threading.Thread(
            target=_completion,
            args=(wd.gateway, "agent-a", results, 256),
            kwargs={"temperature": 1.0, "ignore_eos": True},
        )
        for _ in range(10)
    ]
    for t in flood:
        t.start()
    time.sleep(0.3)  # the flood is at the gateway: 1 of A's in flight, 2 held by A's cap, 7 refused
    other = threading.Thread(target=_completion, args=(wd.gateway, "agent-b", results, 4))
    other.start()
    for t in [*flood, other]:
        t.join(180)
    a = [r for r in results if r[0] == "agent-a"]
    (b,) = [r for r in results if r[0] == "agent-b"]
    assert b[1] == 200, b
    ok_a = [r for r in a if r[1] == 200]
    limited = [r for r in a if r[1] == 429]
    assert len(ok_a) == 3 and len(limited) == 7, [
        (r[1], r[2].get("error")) for r in a
    ]  # the burst, then refusals
    assert all(r[2]["error"]["code"] == "session_rate" and int(r[2]["retry_after"]) >= 1 for r in limited)
    # A's admitted requests go one at a time (its cap), so B overtakes the ones A still had waiting
    assert b[3] < max(r[3] for r in ok_a), sorted((r[2]["sent"], r[3], r[0]) for r in results if r[1] == 200)
    m = wd.metrics()
    assert (
        m[("vllm_watchdog_gateway_rejected_total", (("reason", "session_rate"), ("target", "vllm-0")))] == 7
    )


def test_throttle_lowers_the_cap_and_aimd_restores_it(
    watchdog_with_gateway: Callable[[str], Watchdog], tmp_path: Path
) -> None:
    rules = tmp_path / "busy.rules.yml"
    rules.write_text(
        """groups:
  - name: busy
    rules:
      - alert: GatewayBusy
        expr: vllm_watchdog_gateway_in_flight >= 2
        labels: {severity: warning}
"""
    )
    wd = watchdog_with_gateway(
        f"""rule_files: ["{rules}"]
gateway: {{listen: 127.0.0.1:GPORT, max_in_flight: 4}}
actions:
  squeeze: {{type: throttle, factor: 0.5, floor: 1, step: 1, step_interval: 3s}}
routes:
  - {{match: {{alertname: GatewayBusy}}, actions: [squeeze]}}
"""
    )
    assert wd.status()["limit"] == 4
    results: list[tuple[str, int, dict[str, Any], float]] = []
    # Two or more in flight until the test has seen the squeeze, not for as long as a flood lasts: one long
    # completion runs in the engine (--max-num-seqs 1) and five short ones follow it, three into vLLM's queue
    # and two held by the cap of 4; the test hangs up on the long one once squeezed, and the rest run.
    running, release = threading.Event(), threading.Event()
    holder = threading.Thread(target=_hold, args=(wd.gateway, "s0", results, running, release))
    holder.start()
    assert running.wait(120), results
    flood = [
        threading.Thread(
            target=_completion, args=(wd.gateway, f"s{i}", results, 16, "the quick brown fox", 1.0)
        )
        for i in range(1, 6)
    ]
    for t in flood:
        t.start()
    try:
        squeezed = poll(
            wd.api + "/api/v1/gateway", lambda j: j["data"]["limit"] == 2, 120, "the throttle", wd.log
        )
    finally:
        release.set()
    flood.append(holder)
    assert squeezed["data"]["ceiling"] == 4
    limits: list[int] = []

    # Steps 3 s apart: the sampler below reads every 0.2 s, and on a loaded machine one read took over a
    # second, so with 1 s steps it once saw 2 then 4 (the 3 came and went between two reads).
    def sample() -> None:  # from the squeeze until the cap is back at the ceiling (bounded)
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline and (not limits or limits[-1] != 4):
            limits.append(wd.status()["limit"])
            time.sleep(0.2)

    sampler = threading.Thread(target=sample)
    sampler.start()
    for t in flood:
        t.join(180)
    sampler.join(200)
    assert all(r[1] == 200 for r in results), results  # a throttle queues; it loses nothing
    seen = [v for i, v in enumerate(limits) if i == 0 or v != limits[i - 1]]
    assert seen[-1] == 4, seen  # back at the ceiling ...
    assert all(b - a == 1 for a, b in itertools.pairwise(seen)), seen  # ... one step at a time
    assert 3 in seen, seen
    history = httpx.get(wd.api + "/api/v1/actions", timeout=5).json()["data"]["history"]
    squeeze = [h for h in history if h["action"] == "squeeze"]
    assert squeeze and squeeze[-1]["outcome"] == "succeeded" and "4 -> 2" in squeeze[-1]["reason"], squeeze


def _hold(
    base: str,
    session: str,
    results: list[tuple[str, int, dict[str, Any], float]],
    running: threading.Event,
    release: threading.Event,
) -> None:
    """A long completion streamed through the gateway: `running` is set at its first event, and the client
    hangs up once `release` is set (vLLM aborts the request); appends to results as _completion does. The
    squeeze needs one evaluation of the rule, far less than the completion lasts."""
    body = holding_completion("the quick brown fox")
    sent = time.monotonic()
    headers = {"X-Session-ID": session}
    try:
        with CLIENT.stream("POST", base + "/v1/completions", json=body, headers=headers, timeout=120) as resp:
            for _ in resp.iter_lines():
                running.set()
                if release.is_set():
                    break
            results.append((session, resp.status_code, {"sent": sent}, time.monotonic()))
    finally:
        running.set()  # an answer without events (an error) ends the wait too


def _tool_step(session: str) -> dict[str, Any]:
    """An agent step whose last assistant message calls the same tool with the same arguments as before."""
    call = {"id": "call_1", "type": "function", "function": {"name": "search", "arguments": '{"q": "vllm"}'}}
    return {
        "model": "tiny-llama",
        "max_tokens": 1,
        "messages": [
            {"role": "user", "content": "find it"},
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "call_1", "content": "nothing found"},
        ],
    }


def test_a_looping_agent_session_is_cut_off_by_the_bundled_rule(
    watchdog_with_gateway: Callable[[str], Watchdog],
) -> None:
    wd = watchdog_with_gateway(
        f"""rule_files: ["{BUNDLED_GATEWAY_RULES}"]
gateway: {{listen: 127.0.0.1:GPORT}}
actions:
  breaker: {{type: throttle_session, duration: 10m}}
routes:
  - {{match: {{alertname: GatewaySessionToolCallLoop}}, actions: [breaker]}}
"""
    )
    headers = {"X-Session-ID": "looper"}
    for _ in range(5):
        resp = httpx.post(
            wd.gateway + "/v1/chat/completions", json=_tool_step("looper"), headers=headers, timeout=60
        )
        assert resp.status_code == 200, resp.text
    status = poll(
        wd.api + "/api/v1/gateway", lambda j: "looper" in j["data"]["breakers"], 60, "the breaker", wd.log
    )
    assert status["data"]["breakers"]["looper"]["seconds_left"] > 500
    refused = httpx.post(
        wd.gateway + "/v1/chat/completions", json=_tool_step("looper"), headers=headers, timeout=60
    )
    assert refused.status_code == 429 and int(refused.headers["retry-after"]) > 500
    error = refused.json()["error"]
    assert error["code"] == "session_breaker" and "GatewaySessionToolCallLoop" in error["message"], error
    fine = httpx.post(
        wd.gateway + "/v1/chat/completions",
        json=_tool_step("x"),
        headers={"X-Session-ID": "other-agent"},
        timeout=60,
    )
    assert fine.status_code == 200
    assert (
        "find it" not in wd.log.read_text() and "nothing found" not in wd.log.read_text()
    )  # never log prompts


def test_cached_token_ratios_match_what_vllm_reported(
    watchdog_with_gateway: Callable[[str], Watchdog],
) -> None:
    wd = watchdog_with_gateway("gateway: {listen: 127.0.0.1:GPORT}")
    # Two KV blocks (vLLM's CPU backend holds 128 tokens in one; each word is 2-3 tokens), shared by every
    # request: a longer prefix costs the first request's prefill and shows nothing more.
    prefix = " ".join(f"word{i}" for i in range(120))  # 273 tokens with BOS
    seen_prompt = seen_cached = 0
    for i in range(4):
        body = {"model": "tiny-llama", "prompt": f"{prefix} question {i}", "max_tokens": 2, "temperature": 0}
        resp = httpx.post(
            wd.gateway + "/v1/completions", json=body, headers={"X-Session-ID": "cachey"}, timeout=120
        )
        usage = resp.json()["usage"]
        seen_prompt += usage["prompt_tokens"]
        seen_cached += (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
    stream_body = {
        "model": "tiny-llama",
        "prompt": f"{prefix} question streamed",
        "max_tokens": 2,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    with httpx.stream(
        "POST",
        wd.gateway + "/v1/completions",
        json=stream_body,
        headers={"X-Session-ID": "cachey"},
        timeout=120,
    ) as resp:
        events = [line[6:] for line in resp.iter_lines() if line.startswith("data: {")]
    usage = [json.loads(e)["usage"] for e in events if json.loads(e).get("usage")][-1]
    seen_prompt += usage["prompt_tokens"]
    seen_cached += (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
    assert seen_cached > 0  # the shared prefix was served from the cache

    def exported(name: str) -> float:
        key = (name, (("session", "cachey"), ("target", "vllm-0")))
        return wd.metrics().get(key, -1.0)

    # Wait on the values asserted, not on the request counter: a request is counted when it is admitted, its
    # tokens when its (streamed) response has ended, and both reach /metrics at the daemon's next tick. A
    # request whose usage were lost would keep the totals short until the deadline and fail below.
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and (
        exported("vllm_watchdog_gateway_session_prompt_tokens_total") != seen_prompt
        or exported("vllm_watchdog_gateway_session_cached_tokens_total") != seen_cached
    ):
        time.sleep(0.3)
    assert exported("vllm_watchdog_gateway_session_requests_total") == 5
    assert exported("vllm_watchdog_gateway_session_prompt_tokens_total") == seen_prompt
    assert exported("vllm_watchdog_gateway_session_cached_tokens_total") == seen_cached
    assert exported("vllm_watchdog_gateway_session_prefix_cache_hit_ratio") == pytest.approx(
        seen_cached / seen_prompt
    )
