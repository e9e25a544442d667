"""Issue 30's proof, end to end: a real CPU vLLM in process mode, launched by the watchdog in dev mode, with
the bundled rules, actions and routes. Its weights are swapped in place for a copy with one layer scaled by 2
(`reload_weights`: /health stays 200 and the canary passes) while mixed traffic runs; the known-answer check
catches it, VLLMAnswersDiverged fires, the bundled answers-restart restarts the engine (which loads the
original weights from disk again), the restart's verify passes, the target is undrained, and the answers are
the ones from before the fault, bit for bit.

One vLLM start and one restart. The draft-equivalence check (a relaunch with ngram speculative decoding gives
the same answers) is a second engine start, so it lives in `bench/integrity.py --draft`."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.support.configs import target, write_config
from tests.support.mixed_traffic import MixedTraffic
from tests.support.perturbed import DEV_MODE_ENV, perturbed_model, reload_weights
from tests.support.vllm_server import ROOT, free_port
from tests.support.watchdogproc import START_LIMIT, api_servers, poll, start_with_process_target

pytestmark = pytest.mark.vllm

NAME = "vllm-i"
OK = "vllm_watchdog_known_answer_ok"
LIMIT = 120.0  # bounds a wait that needs no vLLM start: a check every 5 s, an alert within 1 s of it
# A check costs 140 tokens with the bundled prompts and a divergence is probed again at once: 5 s checks need
# 3,360 tokens a minute; under the budget a check (or its confirmation) is skipped and the catch waits.
# A fixed prompt and continuation of our own (not the watchdog's), scored as the probe scores: the logprob of
# every token, teacher forced, and the greedy tokens.
PROBE = {
    "model": "tiny-llama",
    "prompt": "The capital of France is Paris. def add(a, b): return a + b",
    "max_tokens": 8,
    "temperature": 0,
    "prompt_logprobs": 0,
    "logprobs": 2,
}


def _config(tmp_path: Path, port: int, vport: int) -> Path:
    command = ["bash", str(ROOT / "scripts" / "serve-vllm.sh"), "--port", str(vport)]
    canary = {"enabled": True, "interval": "2s", "timeout": "30s"}
    return write_config(
        tmp_path,
        target(f"http://127.0.0.1:{vport}", name=NAME, canary=canary, command=command, env=DEV_MODE_ENV),
        port=port,
        rest="""
rule_files: ["bundled:vllm.rules.yml"]
include: ["bundled:watchdog.yml"]
integrity: {interval: 5s, max_tokens_per_minute: 4000}
""",
    )


def _answers(vport: int) -> tuple[list[float], list[str]]:
    """Our own probe's teacher-forced logprobs and greedy tokens, straight from vLLM."""
    resp = httpx.post(f"http://127.0.0.1:{vport}/v1/completions", json=PROBE, timeout=60)
    assert resp.status_code == 200, resp.text
    choice = resp.json()["choices"][0]
    logprobs = [next(iter(d.values()))["logprob"] for d in choice["prompt_logprobs"][1:]]
    return logprobs, list(choice["logprobs"]["tokens"])


def _series(base: str) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    """The watchdog's own known-answer series, by name and labels."""
    out: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
    for family in text_string_to_metric_families(httpx.get(base + "/metrics", timeout=5).text):
        for s in family.samples:
            if s.name.startswith("vllm_watchdog_known_answer_") and s.labels.get("target", NAME) == NAME:
                out.setdefault(s.name, {})[tuple(sorted(s.labels.items()))] = s.value
    return out


def _value(series: dict[str, dict[tuple[tuple[str, str], ...], float]], name: str) -> float | None:
    values = list(series.get(name, {}).values())
    return values[0] if values else None


def _wait_metrics(
    base: str, pred: Callable[[dict[str, Any]], bool], limit: float, what: str, log: Path
) -> Any:
    """Poll the watchdog's /metrics until `pred` holds on its known-answer series."""
    deadline, last = time.monotonic() + limit, {}
    while time.monotonic() < deadline:
        try:
            last = _series(base)
            if pred(last):
                return last
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    raise AssertionError(f"{what} not within {limit}s; last: {last}; watchdog log: {log.read_text()[-3000:]}")


def _firing(j: Any) -> bool:
    return any(
        a["labels"].get("alertname") == "VLLMAnswersDiverged" and a["state"] == "firing"
        for a in j["data"]["alerts"]
    )


def _undrained_and_idle(j: Any) -> bool:
    return j["data"]["drained"] == {} and all(r["outcome"] != "running" for r in j["data"]["history"])


def _restarts(j: Any) -> list[dict[str, Any]]:
    return [r for r in j["data"]["history"] if r["action"] == "answers-restart"]


def test_weights_perturbed_in_place_are_caught_and_cured_by_the_bundled_route(
    tmp_path: Path, cleanup: list[Callable[[], None]]
) -> None:
    perturbed = perturbed_model(2.0)
    port, vport = free_port(), free_port()
    cfg, log = _config(tmp_path, port, vport), tmp_path / "watchdog.log"
    base = f"http://127.0.0.1:{port}"
    _, original = start_with_process_target(cfg, log, base, vport, cleanup)

    def learnt(s: dict[str, Any]) -> bool:
        info = s.get("vllm_watchdog_known_answer_baseline_info", {})
        return any(dict(k).get("state") == "learnt" for k in info) and _value(s, OK) == 1

    _wait_metrics(base, learnt, START_LIMIT, "a learnt baseline and a passing check", log)
    before = _answers(vport)
    traffic = MixedTraffic(f"http://127.0.0.1:{vport}", workers=2).start()
    cleanup.append(traffic.stop)

    reload_weights(f"http://127.0.0.1:{vport}", perturbed)
    faulted = time.monotonic()
    assert httpx.get(f"http://127.0.0.1:{vport}/health", timeout=10).status_code == 200  # a silent fault
    assert _answers(vport) != before
    poll(base + "/api/v1/alerts", _firing, LIMIT, "VLLMAnswersDiverged firing", log)
    detected = time.monotonic() - faulted
    print(f"\ndetection: {detected:.1f} s from reload_weights to VLLMAnswersDiverged firing (interval 5 s)")

    def settled(j: Any) -> bool:
        rows = _restarts(j)
        return bool(rows) and rows[-1]["outcome"] != "running"

    status = poll(base + "/api/v1/actions", settled, START_LIMIT, "the answers-restart", log)["data"]
    cured = time.monotonic() - faulted
    row = _restarts({"data": status})[-1]
    assert row["outcome"] == "succeeded", row
    assert [r for r in _restarts({"data": status}) if r["outcome"] == "succeeded"] == [row]  # restarted once
    verify = [s for s in row["steps"] if s["step"] == "verify"]
    assert len(verify) == 1 and verify[0]["details"]["ok"] is True, row["steps"]  # checked before undrain
    assert verify[0]["details"]["divergence"] == 0.0, verify
    assert [s["step"] for s in row["steps"]][-1] == "undrain", row["steps"]
    # Undrained, not quarantined. VLLMDown may fire while the restart has the server stopped; its
    # graceful-restart, queued behind this one, is superseded by it: one engine start, no second drain.
    idle = poll(base + "/api/v1/actions", _undrained_and_idle, LIMIT, "undrained with no action running", log)
    assert _restarts(idle)[-1]["id"] == row["id"], idle
    others = [r for r in idle["data"]["history"] if r["action"] == "graceful-restart"]
    assert all(r["outcome"] == "skipped" and r["reason"].startswith("superseded") for r in others), others
    servers = api_servers(vport)
    assert len(servers) == 1 and servers[0] != original
    traffic.stop()
    print(
        f"cured: {cured:.1f} s from reload_weights to the restart's success; traffic {dict(traffic.counts)}"
    )

    assert _answers(vport) == before  # the original weights, from disk: bit-identical answers

    def passing_again(s: dict[str, Any]) -> bool:
        return _value(s, OK) == 1 and _value(s, "vllm_watchdog_known_answer_divergence") == 0.0

    _wait_metrics(base, passing_again, LIMIT, "the periodic check passing with divergence 0", log)
    poll(base + "/api/v1/alerts", lambda j: not _firing(j), LIMIT, "VLLMAnswersDiverged resolved", log)
