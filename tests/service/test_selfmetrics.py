"""The watchdog's own counters exist from the start, each known label value at 0 (Prometheus' "avoid missing
metrics"): a dashboard shows 0 instead of "No data", and increase() sees the first event."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.ruler.test_evaluation import start
from tests.service.test_daemon import PAYLOAD
from tests.support.configs import target, write_config
from tests.support.faultserver import FaultServer
from tests.support.vllm_server import free_port
from vllm_watchdog.actions.store.auditlog import OUTCOMES
from vllm_watchdog.errors import SCRAPE_ERROR_KINDS
from vllm_watchdog.listener import REFUSALS

pytestmark = pytest.mark.anyio
RULES = """
groups:
  - name: quiet
    rules:
      - alert: Never
        expr: vllm:num_requests_waiting > 1e9
        labels: {severity: info}
"""
Labels = frozenset[tuple[str, str]]


@pytest.fixture
async def metrics(tmp_path: Path, fault: FaultServer) -> AsyncIterator[dict[str, dict[Labels, float]]]:
    """/metrics of a daemon with two targets, two actions and two notifiers, before anything happened."""
    fault.vllm_like(PAYLOAD)
    (tmp_path / "quiet.rules.yml").write_text(RULES)
    port = free_port()
    cfg = write_config(
        tmp_path,
        target(fault.url),
        target(fault.url, name="vllm-1"),
        port=port,
        rest=f"""rule_files: [quiet.rules.yml]
actions:
  restart: {{type: restart, startup_grace: 0s}}
  throttle: {{type: throttle, factor: 0.5}}
routes:
  - {{match: {{alertname: Never}}, actions: [restart]}}
notifiers:
  - {{type: webhook, name: hook-a, url: "{fault.url}/a"}}
  - {{type: webhook, name: hook-b, url: "{fault.url}/b"}}
""",
    )
    d, task = await start(cfg)
    async with httpx.AsyncClient(timeout=10) as c:
        text = (await c.get(f"http://127.0.0.1:{port}/metrics")).text
    d.stop()
    await asyncio.wait_for(task, 10)
    # Each stage registers its own collector: no family may come from two of them.
    types = [line.split()[2] for line in text.splitlines() if line.startswith("# TYPE ")]
    assert len(types) == len(set(types)), sorted(t for t in types if types.count(t) > 1)
    out: dict[str, dict[Labels, float]] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out.setdefault(s.name, {})[frozenset(s.labels.items())] = s.value
    yield out


def values(series: dict[Labels, float], *keys: str) -> dict[tuple[str, ...], float]:
    """Each series' values of `keys`, other labels ignored; "name" is the target's name, its `target` label
    where the series has one, else its `instance`."""

    def value(labels: dict[str, str], key: str) -> str:
        return labels.get("target") or labels["instance"] if key == "name" else labels[key]

    return {tuple(value(dict(labels), k) for k in keys): v for labels, v in series.items()}


async def test_every_action_target_and_outcome_starts_at_zero(
    metrics: dict[str, dict[Labels, float]],
) -> None:
    got = values(metrics["vllm_watchdog_actions_total"], "action", "target", "outcome")
    expected = {
        (a, t, o): 0.0 for a in ("restart", "throttle") for t in ("vllm-0", "vllm-1") for o in OUTCOMES
    }
    assert got == expected


async def test_every_scrape_error_kind_starts_at_zero_per_target(
    metrics: dict[str, dict[Labels, float]],
) -> None:
    got = values(metrics["vllm_watchdog_scrape_errors_total"], "name", "kind")
    for name in ("vllm-0", "vllm-1"):
        assert {k: got.get((name, k)) for k in SCRAPE_ERROR_KINDS} == dict.fromkeys(SCRAPE_ERROR_KINDS, 0.0)


async def test_every_notifier_and_rule_group_has_its_counters(
    metrics: dict[str, dict[Labels, float]],
) -> None:
    for name in ("sent", "failed", "dropped"):
        got = values(metrics[f"vllm_watchdog_notifications_{name}_total"], "notifier")
        assert got == {("hook-a",): 0.0, ("hook-b",): 0.0}, name
    for name in ("rule_group_evaluations_total", "rule_evaluation_failures_total"):
        groups = values(metrics[f"vllm_watchdog_{name}"], "rule_group")
        assert [g.endswith("quiet.rules.yml;quiet") for (g,) in groups] == [True], (name, groups)


async def test_every_api_refusal_reason_starts_at_zero(metrics: dict[str, dict[Labels, float]]) -> None:
    got = values(metrics["vllm_watchdog_api_refused_total"], "reason")
    assert got == {(reason,): 0.0 for reason in REFUSALS}
