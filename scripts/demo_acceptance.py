#!/usr/bin/env python3
"""Measure ngram draft acceptance on a running vLLM for the demo's workloads (docs/demo.md has the numbers).

    bash scripts/serve-vllm.sh --port 8123 --max-num-seqs 4 \\
        --speculative-config '{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4}' &
    .venv/bin/python scripts/demo_acceptance.py http://127.0.0.1:8123

Each workload sends 6 requests of 48 tokens one at a time and reads the increase of
vllm:spec_decode_num_accepted_tokens_total and vllm:spec_decode_num_draft_tokens_total from /metrics.
"""

from __future__ import annotations

import random
import re
import sys
from collections.abc import Callable
from typing import Any

import httpx
from demo_agent import MODEL, REPETITIVE, tool_json_body


def counters(client: httpx.Client, base: str) -> tuple[float, float]:
    """(accepted, drafted) draft tokens so far."""
    text = client.get(base + "/metrics").text

    def value(name: str) -> float:
        m = re.search(r"^" + re.escape(name) + r"\{[^}]*\} (\S+)$", text, re.M)
        return float(m.group(1)) if m else 0.0

    return value("vllm:spec_decode_num_accepted_tokens_total"), value(
        "vllm:spec_decode_num_draft_tokens_total"
    )


def measure(client: httpx.Client, base: str, name: str, body: Callable[[int], dict[str, Any]]) -> None:
    """Print accepted/drafted over 6 requests of one workload."""
    a0, d0 = counters(client, base)
    for i in range(6):
        client.post(base + "/v1/completions", json=body(i)).raise_for_status()
    a1, d1 = counters(client, base)
    rate = f"{(a1 - a0) / (d1 - d0):.2f}" if d1 > d0 else "no drafts"
    print(f"{name:40s} {a1 - a0:5.0f} / {d1 - d0:5.0f}  {rate}", flush=True)


def main() -> int:
    base = sys.argv[1].rstrip("/") if len(sys.argv) > 1 else "http://127.0.0.1:8123"
    rnd = random.Random(1)
    with httpx.Client(timeout=300, trust_env=False) as client:
        for t in (0.0, 0.05, 0.2, 1.0):
            measure(
                client,
                base,
                f"repetitive text, temperature {t}",
                lambda i, t=t: {
                    "model": MODEL,
                    "prompt": REPETITIVE,
                    "max_tokens": 48,
                    "temperature": t,
                    "seed": i,
                },
            )
            measure(
                client,
                base,
                f"JSON tool calls, temperature {t}",
                lambda i, t=t: tool_json_body(rnd, seed=i) | {"temperature": t},
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
