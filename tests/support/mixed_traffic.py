"""Mixed user traffic beside a known-answer probe, straight to a vLLM: sampled generations, long prompts and
the soak's agents (tests/support/agent_traffic.py), several at once, so that the probe's requests are batched
with others of every shape. Threads; bounded in time (each request) and in count (the workers)."""

from __future__ import annotations

import random
import threading
from collections import Counter

import httpx

from tests.support import agent_traffic

KINDS = ("sampled", "long", "agent")
SAMPLED_TOKENS = 300
LONG_PROMPT = agent_traffic.PREFIX * 3  # about 1,000 tokens of the tiny model's 2,048
REQUEST_TIMEOUT = 180.0


class MixedTraffic:
    """`workers` threads, each sending one request after another of a kind drawn at random (seeded) until
    stopped; counts the answers by kind and status (a failure is any status but 200, or no answer)."""

    def __init__(self, url: str, workers: int = 6, seed: int = 30) -> None:
        self.url = url.rstrip("/")
        self.counts: Counter[str] = Counter()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._rngs = [random.Random(seed + i) for i in range(workers)]
        self._threads: list[threading.Thread] = []

    def start(self) -> MixedTraffic:
        """Start the workers."""
        for i, rng in enumerate(self._rngs):
            t = threading.Thread(target=self._work, args=(i, rng), name=f"traffic-{i}", daemon=True)
            t.start()
            self._threads.append(t)
        return self

    def stop(self, timeout: float = REQUEST_TIMEOUT) -> Counter[str]:
        """Stop after the requests in flight (each bounded by REQUEST_TIMEOUT); returns the counts."""
        self._stop.set()
        for t in self._threads:
            t.join(timeout)
        return self.counts

    def failed(self) -> int:
        """Requests that got no 200."""
        return sum(n for key, n in self.counts.items() if not key.endswith(":200"))

    def _work(self, worker: int, rng: random.Random) -> None:
        step = 0
        while not self._stop.is_set():
            kind = rng.choice(KINDS)
            try:
                statuses = self._send(kind, f"traffic-{worker}-{step}", rng)
            except httpx.HTTPError:
                statuses = [0]
            with self._lock:
                self.counts.update(f"{kind}:{s}" for s in statuses)
            step += 1
            if 0 in statuses:
                self._stop.wait(1.0)  # the engine is away (a restart): do not spin

    def _send(self, kind: str, session: str, rng: random.Random) -> list[int]:
        if kind == "agent":
            statuses: list[int] = []
            agent_traffic.agent(self.url, session, statuses)
            return statuses
        body: dict[str, object] = {"model": "tiny-llama", "ignore_eos": True}
        if kind == "sampled":
            body |= {"prompt": f"{session} tell me", "max_tokens": SAMPLED_TOKENS, "temperature": 1.0}
            body |= {"stream": rng.random() < 0.5}
        else:
            body |= {"prompt": LONG_PROMPT + session, "max_tokens": 16, "temperature": 0}
        return [agent_traffic.post(self.url, "/v1/completions", session, body)]
