"""Realistic mixed agent traffic for bench/soak.py, sent through the watchdog's gateway to a healthy vLLM.

A fixed number of agents (the only concurrency) each run one session after another until a deadline:

- coder: chat completions with a tool list; each step appends the model's answer as an assistant message
  carrying one tool call (search, read a file, edit it, run the tests) and the tool's result, as a coding
  agent does. The tests are run with the same arguments after most edits.
- research: chat completions with tools; web searches and page fetches with distinct arguments, streamed.
- json: /v1/completions over a transcript of JSON tool calls that grows by one call per step.
- oneshot: single chat requests (summaries) of a few batch users (OpenAI `user` field, X-Priority: batch).

Agent i starts with kind i of the list above (then draws by weight), so that a few agents cover the mix
however fast the server answers. Besides the agents, `Mix.loopers` adds two agents that loop and then behave
(`Looper`): one sends the same tool call back to back until its breaker opens, then goes on with ordinary
steps at once, waiting out each 429 by its Retry-After; the other loops, is broken, goes quiet for
`quiet_after` seconds (longer than its breaker) and comes back with ordinary steps.

Every chat session shares one system prompt (a shared prefix) and tool list, each session's prompt extends
its previous one (prefix-cache hits), and a session whose prompt nears the tiny model's 2,048 positions
clears its oldest tool results down to half of it in one go, as agents' context editing does. Between steps
an agent "runs the tool" (think time); between sessions it idles. Tool results are slices of Python's
standard library sources: synthetic, never logged.
Deterministic for a seed, bounded in requests by the deadline and in time by the request timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import sysconfig
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

MODEL = "tiny-llama"
# The tiny model has 2,048 positions: 3,600 characters stay under 1,600 tokens even at 2.3 characters per
# token (the 5th percentile of this tokenizer on the code slices below; the median is 3.7).
MAX_PROMPT_CHARS = 3600
KEEP_STEPS = 3  # steps whose tool results survive a compaction
SYSTEM = (
    "You are a careful software agent working in a Python repository. Think step by step, call one tool "
    "at a time, read a file before you edit it, keep each patch small, and run the test suite after every "
    "change that could break it. Report what you changed and why once the tests pass. Tools: search_code "
    "finds symbols, read_file returns a file's text, edit_file applies a unified diff, run_tests runs "
    "pytest, web_search and http_get look things up. Never invent file contents; quote them from tool "
    "results. Answer in English."
)
_FN = {"type": "object", "additionalProperties": False}
TOOLS = [
    {
        "type": "function",
        "function": {"name": name, "description": text, "parameters": _FN | {"properties": props}},
    }
    for name, text, props in [
        ("search_code", "Find a symbol in the repository", {"query": {"type": "string"}}),
        ("read_file", "Read a file", {"path": {"type": "string"}, "start": {"type": "integer"}}),
        ("edit_file", "Apply a unified diff", {"path": {"type": "string"}, "diff": {"type": "string"}}),
        ("run_tests", "Run pytest", {"path": {"type": "string"}, "args": {"type": "array"}}),
        ("web_search", "Search the web", {"query": {"type": "string"}}),
        ("http_get", "Fetch a page", {"url": {"type": "string"}}),
    ]
]
KINDS = {"coder": 0.35, "research": 0.25, "json": 0.2, "oneshot": 0.2}
BATCH_USERS = 3
LOOP_THINK = (0.2, 0.5)  # a looping agent does not think: it calls the same tool again at once


@dataclass
class KindStats:
    """Outcomes of one kind of request (session kind and streaming or not)."""

    ok: int = 0
    errors: dict[str, int] = field(default_factory=dict)  # "HTTP 429", "ReadTimeout", "no [DONE]", ...
    seconds: list[float] = field(default_factory=list)  # latency of each successful request
    prompt_tokens: int = 0
    completion_tokens: int = 0

    def error(self, what: str) -> None:
        """Count one failed request."""
        self.errors[what] = self.errors.get(what, 0) + 1


@dataclass(frozen=True)
class Mix:
    """How much traffic: agents in parallel (the concurrency bound), pauses, sizes."""

    agents: int = 4
    think: tuple[float, float] = (0.5, 3.0)  # seconds between a session's steps (the tool runs)
    idle: tuple[float, float] = (1.0, 5.0)  # seconds between an agent's sessions
    max_tokens: tuple[int, int] = (8, 48)
    request_timeout: float = 120.0
    seed: int = 7
    loopers: bool = False  # add the two agents that loop and then behave
    quiet_after: float = 80.0  # seconds the quiet looper stays silent once broken (longer than its breaker)


@dataclass
class _Reply:
    text: str
    usage: dict[str, Any] | None


class _Corpus:
    """Slices of a fixed, sorted selection of standard-library sources: realistic code-shaped text."""

    def __init__(self) -> None:
        lib = Path(sysconfig.get_paths()["stdlib"])
        self.files = sorted(p for p in lib.glob("*.py") if p.stat().st_size > 4000)[:60]
        self._text: dict[Path, str] = {}

    def path(self, rng: random.Random) -> str:
        return "src/" + rng.choice(self.files).name

    def slice(self, rng: random.Random, size: tuple[int, int], name: str | None = None) -> str:
        src = next((f for f in self.files if name and f.name == name.rsplit("/", 1)[-1]), None)
        src = src or rng.choice(self.files)
        text = self._text.get(src)
        if text is None:
            text = self._text[src] = src.read_text(errors="replace")
        n = rng.randint(*size)
        at = rng.randrange(0, max(1, len(text) - n))
        return text[at : at + n]


class Traffic:
    """Runs the agents against the gateway until a deadline; per-kind outcomes in `stats`."""

    def __init__(self, gateway: str, mix: Mix, clock: Callable[[], float] = time.monotonic) -> None:
        self.gateway = gateway.rstrip("/")
        self.mix = mix
        self.clock = clock
        self.stats: dict[str, KindStats] = {}
        self.sessions: dict[str, int] = {}  # sessions started, by kind
        self.corpus = _Corpus()
        self.failures: list[tuple[float, float, str, str]] = []  # (start, end, kind, what) of failed requests
        self.loopers = (
            [Looper("soak-looper-behaves", 0.0, 2.0), Looper("soak-looper-quiet", mix.quiet_after, 4.0)]
            if mix.loopers
            else []
        )
        self._deadline = 0.0

    async def run(self, seconds: float) -> None:
        """Run every agent for `seconds`; requests in flight at the deadline finish (bounded by timeout)."""
        self._deadline = self.clock() + seconds
        timeout = httpx.Timeout(self.mix.request_timeout, connect=5.0)
        limits = httpx.Limits(max_connections=self.mix.agents + 2)
        async with httpx.AsyncClient(timeout=timeout, limits=limits, trust_env=False) as client:
            agents = [self._agent(client, i) for i in range(self.mix.agents)]
            await asyncio.gather(*agents, *(self._loop(client, looper) for looper in self.loopers))

    def _live(self) -> bool:
        return self.clock() < self._deadline

    async def _pause(self, rng: random.Random, span: tuple[float, float]) -> None:
        await asyncio.sleep(min(rng.uniform(*span), max(0.0, self._deadline - self.clock())))

    async def _agent(self, client: httpx.AsyncClient, index: int) -> None:
        rng = random.Random(self.mix.seed * 1000 + index)
        kinds, weights = list(KINDS), list(KINDS.values())
        n = 0
        while self._live():
            kind = kinds[index % len(kinds)] if n == 0 else rng.choices(kinds, weights)[0]
            self.sessions[kind] = self.sessions.get(kind, 0) + 1
            session = f"soak-{kind}-{index}-{n}"
            n += 1
            if kind == "json":
                await self._json_session(client, rng, session)
            elif kind == "oneshot":
                await self._oneshot(client, rng)
            else:
                await self._chat_session(client, rng, session, kind)
            await self._pause(rng, self.mix.idle)

    # -- sessions --------------------------------------------------------------------------------------
    async def _chat_session(
        self, client: httpx.AsyncClient, rng: random.Random, session: str, kind: str
    ) -> None:
        coder = kind == "coder"
        task = (
            f"Fix the failing test in {self.corpus.path(rng)}."
            if coder
            else "Find how vLLM schedules requests."
        )
        messages: list[dict[str, Any]] = [
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": task},
        ]
        steps = rng.randint(6, 24) if coder else rng.randint(3, 10)
        calls = _coder_calls(rng, steps, self.corpus) if coder else _research_calls(rng, steps)
        for step, (name, args) in enumerate(calls):
            if not self._live():
                return
            stream = rng.random() < (0.5 if coder else 0.8)
            body: dict[str, Any] = {
                "model": MODEL,
                "messages": messages,
                "tools": TOOLS,
                "tool_choice": "none",  # the tiny model cannot call tools: the agent decides (below)
                "max_tokens": rng.randint(*self.mix.max_tokens),
                "temperature": rng.choice([0.0, 0.2, 0.7]),
                "seed": rng.randrange(1 << 30),
            }
            if stream and rng.random() < 0.7:
                body["stream_options"] = {"include_usage": True}
            reply = await self._send(
                client,
                f"{kind}/{'stream' if stream else 'json'}",
                "/v1/chat/completions",
                body,
                session,
                stream,
            )
            if reply is None:
                return  # an agent gives up a session whose request failed
            call_id = f"call_{session}_{step}"
            call = {
                "id": call_id,
                "type": "function",
                "function": {"name": name, "arguments": json.dumps(args)},
            }
            messages.append({"role": "assistant", "content": reply.text, "tool_calls": [call]})
            result = self._tool_result(rng, name, args)
            messages.append({"role": "tool", "tool_call_id": call_id, "content": result})
            _compact(messages)
            await self._pause(rng, self.mix.think)

    async def _json_session(self, client: httpx.AsyncClient, rng: random.Random, session: str) -> None:
        transcript = "Tool calls so far, one JSON object per line:\n"
        for _ in range(rng.randint(2, 6)):
            if not self._live():
                return
            name, args = next(_research_calls(rng, 1))
            transcript += json.dumps({"name": name, "arguments": args}) + "\n"
            stream = rng.random() < 0.3
            body: dict[str, Any] = {
                "model": MODEL,
                "prompt": SYSTEM + "\n" + transcript + 'Next tool call as JSON:\n{"name": "',
                "max_tokens": rng.randint(*self.mix.max_tokens),
                "temperature": rng.choice([0.0, 0.3]),
                "seed": rng.randrange(1 << 30),
                "stream": stream,
            }
            kind = f"json/{'stream' if stream else 'json'}"
            if await self._send(client, kind, "/v1/completions", body, session, stream) is None:
                return
            if len(transcript) > MAX_PROMPT_CHARS - len(SYSTEM):
                return
            await self._pause(rng, self.mix.think)

    async def _oneshot(self, client: httpx.AsyncClient, rng: random.Random) -> None:
        body = {
            "model": MODEL,
            "messages": [
                {"role": "system", "content": "Summarize the code below in two sentences."},
                {"role": "user", "content": self.corpus.slice(rng, (300, 1500))},
            ],
            "max_tokens": rng.randint(*self.mix.max_tokens),
            "temperature": 0.0,
            "user": f"batch-{rng.randrange(BATCH_USERS)}",
        }
        await self._send(client, "oneshot/json", "/v1/chat/completions", body, None, False, priority="batch")

    def _tool_result(self, rng: random.Random, name: str, args: dict[str, Any]) -> str:
        if name == "run_tests":
            failed = rng.randint(0, 2)
            return f"{rng.randint(40, 60) - failed} passed, {failed} failed in {rng.uniform(1, 9):.2f}s"
        if name == "edit_file":
            return "patch applied"
        if name == "search_code":
            return "\n".join(
                self.corpus.path(rng) + f":{rng.randint(1, 900)}" for _ in range(rng.randint(1, 5))
            )
        return self.corpus.slice(rng, (100, 500), args.get("path"))

    # -- agents that loop, then behave -------------------------------------------------------------------
    async def _loop(self, client: httpx.AsyncClient, looper: Looper) -> None:
        rng = random.Random(f"{self.mix.seed}-{looper.session}")
        await self._pause(rng, (looper.start_after, looper.start_after))
        messages: list[dict[str, Any]] = [
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": "Find where the retry limit is set."},
        ]
        stuck = ("read_file", {"path": "src/config.py", "start": 1})  # the call it cannot stop making
        while self._live() and looper.broken_at is None:
            sent = self.clock()
            outcome = await self._step(client, looper, messages, *stuck, len(messages))
            if isinstance(outcome, float):
                looper.broken_at, looper.retry_after = sent, outcome
            elif outcome:
                looper.loop_steps += 1
                await self._pause(rng, LOOP_THINK)
            else:
                return
        if looper.broken_at is None:
            return
        await self._pause(rng, (looper.quiet, looper.quiet))
        looper.resumed_at = self.clock()
        for step, (name, args) in enumerate(_coder_calls(rng, 10_000, self.corpus)):
            outcome: bool | float = False
            while self._live():
                sent = self.clock()
                outcome = await self._step(client, looper, messages, name, args, step)
                if not isinstance(outcome, float):
                    break
                looper.refusals += 1
                await self._pause(rng, (min(outcome, 10.0), min(outcome, 10.0)))
            if not self._live() or outcome is False:
                return
            looper.steps_after += 1
            if looper.admitted_at is None:
                looper.admitted_at = sent
            await self._pause(rng, self.mix.think)

    async def _step(
        self,
        client: httpx.AsyncClient,
        looper: Looper,
        messages: list[dict[str, Any]],
        name: str,
        args: dict[str, Any],
        n: int,
    ) -> bool | float:
        """One chat step of a looper: True if answered, the Retry-After of a 429 session_breaker, False if it
        failed (counted as a failed request)."""
        kind = "looper/json"
        stats = self.stats.setdefault(kind, KindStats())
        body = {"model": MODEL, "messages": messages, "tools": TOOLS, "tool_choice": "none", "max_tokens": 8}
        t0 = self.clock()
        try:
            r = await client.post(
                self.gateway + "/v1/chat/completions", json=body, headers={"X-Session-ID": looper.session}
            )
        except httpx.HTTPError as exc:
            stats.error(type(exc).__name__)
            self.failures.append((t0, self.clock(), kind, type(exc).__name__))
            return False
        if r.status_code == 429 and _error_code(r) == "session_breaker":
            return float(r.headers.get("retry-after") or 1)
        if r.status_code != 200:
            stats.error(f"HTTP {r.status_code}")
            self.failures.append((t0, self.clock(), kind, f"HTTP {r.status_code}"))
            return False
        stats.ok += 1
        stats.seconds.append(self.clock() - t0)
        call_id = f"call_{looper.session}_{n}"
        call = {"id": call_id, "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}
        text = r.json()["choices"][0]["message"]["content"] or ""
        messages.append({"role": "assistant", "content": text, "tool_calls": [call]})
        messages.append({"role": "tool", "tool_call_id": call_id, "content": "no such line"})
        _compact(messages)
        return True

    # -- one request -----------------------------------------------------------------------------------
    async def _send(
        self,
        client: httpx.AsyncClient,
        kind: str,
        path: str,
        body: dict[str, Any],
        session: str | None,
        stream: bool,
        priority: str | None = None,
    ) -> _Reply | None:
        """POST through the gateway; the reply, or None after counting the failure."""
        stats = self.stats.setdefault(kind, KindStats())
        headers = {"X-Session-ID": session} if session else {}
        if priority:
            headers["X-Priority"] = priority
        body = body | {"stream": True} if stream else body
        t0 = self.clock()
        try:
            reply = await (
                _stream(client, self.gateway + path, body, headers)
                if stream
                else _json(client, self.gateway + path, body, headers)
            )
        except (httpx.HTTPError, _Failed) as exc:
            what = type(exc).__name__ if isinstance(exc, httpx.HTTPError) else str(exc)
            stats.error(what)
            self.failures.append((t0, self.clock(), kind, what))
            return None
        stats.ok += 1
        stats.seconds.append(self.clock() - t0)
        if reply.usage:
            stats.prompt_tokens += int(reply.usage.get("prompt_tokens") or 0)
            stats.completion_tokens += int(reply.usage.get("completion_tokens") or 0)
        return reply


class _Failed(Exception):
    """A response that was not a complete success."""


@dataclass
class Looper:
    """An agent session that repeats one tool call until the gateway breaks it, then behaves: at once
    (`quiet` 0: each refusal waited out by its Retry-After), or after `quiet` seconds of silence."""

    session: str
    quiet: float
    start_after: float  # seconds after traffic start
    loop_steps: int = 0  # looping requests answered
    broken_at: float | None = None  # the first 429 session_breaker (traffic clock)
    retry_after: float | None = None  # what that 429 said
    resumed_at: float | None = None  # when it began to behave
    admitted_at: float | None = None  # when its first request after the breaker was sent (and answered)
    refusals: int = 0  # 429 session_breaker, while behaving
    steps_after: int = 0  # ordinary steps answered after the breaker

    def held_for(self, end: float) -> float | None:
        """Seconds from the first refusal to the first admitted request (or to `end` if none was)."""
        if self.broken_at is None:
            return None
        return (self.admitted_at if self.admitted_at is not None else end) - self.broken_at


async def _json(client: httpx.AsyncClient, url: str, body: dict[str, Any], headers: dict[str, str]) -> _Reply:
    resp = await client.post(url, json=body, headers=headers)
    if resp.status_code != 200:
        raise _Failed(f"HTTP {resp.status_code}")
    data = resp.json()
    choice = data["choices"][0]
    text = choice["message"]["content"] if "message" in choice else choice["text"]
    return _Reply(text or "", data.get("usage"))


async def _stream(
    client: httpx.AsyncClient, url: str, body: dict[str, Any], headers: dict[str, str]
) -> _Reply:
    parts: list[str] = []
    usage: dict[str, Any] | None = None
    done = False
    async with client.stream("POST", url, json=body, headers=headers) as resp:
        if resp.status_code != 200:
            raise _Failed(f"HTTP {resp.status_code}")
        async for line in resp.aiter_lines():
            if not line.startswith("data: "):
                continue
            if line == "data: [DONE]":
                done = True
                continue
            event = json.loads(line[6:])
            usage = event.get("usage") or usage
            for choice in event.get("choices") or ():
                parts.append((choice.get("delta") or {}).get("content") or choice.get("text") or "")
    if not done:
        raise _Failed("no [DONE]")
    return _Reply("".join(parts), usage)


def _error_code(r: httpx.Response) -> str | None:
    with contextlib.suppress(ValueError, KeyError, TypeError, AttributeError):
        return str(r.json()["error"]["code"])
    return None


def _compact(messages: list[dict[str, Any]]) -> None:
    """Once the prompt outgrows the context, clear the oldest tool results (then drop the oldest steps) down
    to half of it in one go, as agents' context editing does: each clearing breaks the prefix cache from the
    first cleared message on, so clearing a little every step would defeat the cache for good."""
    size = sum(len(str(m.get("content") or "")) + 40 for m in messages)
    if size <= MAX_PROMPT_CHARS:
        return
    for m in messages[2 : -2 * KEEP_STEPS]:
        if size <= MAX_PROMPT_CHARS // 2:
            return
        if m["role"] == "tool" and m["content"] != "[cleared]":
            size -= len(m["content"]) - len("[cleared]")
            m["content"] = "[cleared]"
    while size > MAX_PROMPT_CHARS // 2 and len(messages) > 2 + 2 * KEEP_STEPS:
        for m in messages[2:4]:
            size -= len(str(m.get("content") or "")) + 40
        del messages[2:4]


def _coder_calls(rng: random.Random, steps: int, corpus: _Corpus) -> Any:
    """A coding agent's tool calls: search, read, then edits each mostly followed by a test run."""
    path = corpus.path(rng)
    yield "search_code", {"query": path.rsplit("/", 1)[-1].removesuffix(".py")}
    yield "read_file", {"path": path, "start": 1}
    edited = False
    for i in range(steps - 2):
        if edited and rng.random() < 0.6:
            yield "run_tests", {"path": "tests/", "args": ["-x", "-q"]}
            edited = False
        elif rng.random() < 0.6:
            line = rng.randint(1, 900)
            diff = f"@@ -{line},3 +{line},{rng.randint(2, 6)} @@ step {i}"
            yield "edit_file", {"path": path, "diff": diff}
            edited = True
        else:
            path = corpus.path(rng)
            yield "read_file", {"path": path, "start": rng.randint(1, 400)}


def _research_calls(rng: random.Random, steps: int) -> Any:
    """A research agent's tool calls: searches and page fetches with distinct arguments."""
    words = [
        "scheduler",
        "kv cache",
        "prefix caching",
        "chunked prefill",
        "preemption",
        "speculative",
        "paged attention",
    ]
    for _ in range(steps):
        if rng.random() < 0.5:
            yield "web_search", {"query": f"vllm {rng.choice(words)} {rng.randint(1, 9999)}"}
        else:
            yield (
                "http_get",
                {"url": f"https://docs.example/{rng.choice(words).replace(' ', '-')}/{rng.randint(1, 9999)}"},
            )
