"""The known-answer check on the shared real vLLM: it learns a baseline and a second check agrees exactly."""

from __future__ import annotations

import httpx
import pytest

from tests.support.clock import T0
from tests.support.vllm_server import VllmServer
from vllm_watchdog.config.targets import TargetConfig
from vllm_watchdog.integrity.checker import IntegrityOptions, KnownAnswers, Readiness
from vllm_watchdog.integrity.config import IntegrityConfig

pytestmark = [pytest.mark.vllm, pytest.mark.anyio]


async def test_a_real_vllm_learns_a_baseline_and_agrees_with_it(
    vllm_server: VllmServer, tmp_path: object
) -> None:
    target = TargetConfig(name="real", url=vllm_server.url)
    config = IntegrityConfig()  # the default budget: learning may take more than one check
    async with httpx.AsyncClient(trust_env=False) as client:
        options = IntegrityOptions(
            client=lambda t: client,
            readiness=lambda name, now: Readiness(healthy=True, canary=True),
            state_dir=str(tmp_path),
        )
        ka = KnownAnswers(config, options)
        ka.apply(config, ["real"])
        now = T0
        for _ in range(config.learn_probes):  # at most one check per probe, a minute apart
            verdict = await ka.check(target, now)
            now += 61
            if ka.status("real").baseline is not None:
                break
        st = ka.status("real")
        assert st.baseline is not None, verdict.reason
        assert st.baseline.noise == 0.0  # serial and concurrent passes agree bit for bit on CPU
        assert st.identity is not None and st.identity.version.startswith("0.") and st.identity.weights
        assert st.identity.speculative_config == ""  # not launched by the watchdog: no command line to read
        per_check = sum(s.tokens for s in st.baseline.scores)
        checked = await ka.check(target, now)
        assert (checked.ok, checked.divergence, checked.greedy_mismatches) == (True, 0.0, 0), checked.reason
        print(f"known-answer check: {per_check} tokens, tolerance {checked.tolerance} nats")
        assert per_check <= config.max_tokens_per_minute
