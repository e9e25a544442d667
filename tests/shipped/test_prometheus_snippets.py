"""The Prometheus snippets the docs give for scraping the watchdog, as an operator would paste them.

Every scrape job of the watchdog in the docs and in deploy/prometheus.yml drops the watchdog's own `ALERTS`
and `ALERTS_FOR_STATE`: a Prometheus that runs the same rules writes series of the same names and labels, and
two writers of one series make its value flap. Checked on the text, then in a real Prometheus 2.42 scraping a
real watchdog that has an alert firing: the snippet's job brings none of the watchdog's alert series in.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.configs import watchdog_yaml
from tests.support.faultserver import FaultServer
from tests.support.prometheus_server import running_prometheus
from tests.support.vllm_server import free_port
from tests.support.watchdogproc import poll, start_watchdog
from vllm_watchdog.goregex import compile_anchored

ROOT = Path(__file__).resolve().parents[2]
DOCS = [*sorted((ROOT / "docs").glob("*.md")), ROOT / "README.md"]
LIMIT = 60.0  # a bound on each wait, not a timing: everything scrapes and evaluates every second
ALWAYS_FIRING = "groups:\n  - name: t\n    rules:\n      - {alert: AlwaysFiring, expr: vector(1)}\n"


def _yaml_blocks(path: Path) -> Iterator[Any]:
    for block in re.findall(r"```ya?ml\n(.*?)```", path.read_text(), flags=re.S):
        try:
            yield yaml.safe_load(block)
        except yaml.YAMLError:
            continue  # a fragment with placeholders, not a file


def watchdog_jobs() -> list[tuple[str, dict[str, Any]]]:
    """(where, job) for every scrape job of the watchdog in the docs and the shipped Prometheus config."""
    found = []
    docs = [(p, doc) for p in DOCS for doc in _yaml_blocks(p)]
    docs.append(
        (ROOT / "deploy" / "prometheus.yml", yaml.safe_load((ROOT / "deploy/prometheus.yml").read_text()))
    )
    for path, doc in docs:
        jobs = doc.get("scrape_configs") if isinstance(doc, dict) else None
        for job in jobs or []:
            if job.get("job_name") == "vllm-watchdog":
                found.append((str(path.relative_to(ROOT)), job))
    return found


def _drops(job: dict[str, Any], name: str) -> bool:
    """Prometheus' metric relabelling of a series named `name` (anchored RE2, `;`-joined source labels)."""
    rules = job.get("metric_relabel_configs") or []
    return any(
        r.get("source_labels") == ["__name__"]
        and r.get("action") == "drop"
        and compile_anchored(r["regex"]).match_string(name)
        for r in rules
    )


def test_the_docs_give_snippets_to_check() -> None:
    places = {where for where, _ in watchdog_jobs()}
    assert {"docs/metrics.md", "docs/rules.md", "deploy/prometheus.yml"} <= places


@pytest.mark.parametrize("where,job", watchdog_jobs(), ids=lambda v: v if isinstance(v, str) else "")
def test_every_snippet_drops_the_watchdogs_alert_series(where: str, job: dict[str, Any]) -> None:
    assert job.get("honor_labels") is True, where
    assert _drops(job, "ALERTS") and _drops(job, "ALERTS_FOR_STATE"), where
    assert not _drops(job, "vllm_watchdog_health_up"), where


def test_a_prometheus_with_the_snippet_gets_no_alert_series_from_the_watchdog(
    tmp_path: Path, fault: FaultServer, cleanup: list[Callable[[], None]]
) -> None:
    fault.vllm_like((ROOT / "tests" / "fixtures" / "vllm-0.32.0-metrics.txt").read_text())
    port = free_port()
    (tmp_path / "always.yml").write_text(ALWAYS_FIRING)
    cfg, log = tmp_path / "watchdog.yml", tmp_path / "watchdog.log"
    settings = {"scrape_interval": "1s", "evaluation_interval": "1s"}
    rest = f"rule_files: [{tmp_path / 'always.yml'}]\n"
    cfg.write_text(
        watchdog_yaml({"name": "vllm-0", "url": fault.url}, port=port, global_settings=settings, rest=rest)
    )
    proc = start_watchdog(cfg, log)
    cleanup.append(lambda: (proc.kill(), proc.wait(10)))
    base = f"http://127.0.0.1:{port}"
    poll(
        base + "/api/v1/alerts",
        lambda j: any(a["state"] == "firing" for a in j["data"]["alerts"]),
        LIMIT,
        "the alert",
        log,
    )
    (job,) = [job for where, job in watchdog_jobs() if where == "docs/rules.md"]
    job = {**job, "static_configs": [{"targets": [f"127.0.0.1:{port}"]}]}
    config = {"global": {"scrape_interval": "1s", "evaluation_interval": "1s"}, "scrape_configs": [job]}
    with running_prometheus(json.dumps(config), tmp_path / "prometheus") as prom:
        # Scraped with the watchdog's alert firing: its ALERTS were in the scrape and were dropped.
        prom.wait_for(
            'scrape_samples_post_metric_relabeling{job="vllm-watchdog"} < scrape_samples_scraped{job="vllm-watchdog"}',
            timeout=LIMIT,
        )
        prom.wait_for('vllm_watchdog_health_up{target="vllm-0"}', timeout=LIMIT)
        assert prom.api_query('{__name__=~"ALERTS|ALERTS_FOR_STATE"}')["result"] == []
    assert proc.poll() is None, log.read_text()[-3000:]
