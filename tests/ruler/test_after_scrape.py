"""Scrapes set rule evaluation off: once per group interval, however many targets are spread over it."""

from __future__ import annotations

from pathlib import Path

from vllm_watchdog.config.model import parse_config
from vllm_watchdog.ruler.evaluation import RuleEvaluation
from vllm_watchdog.ruler.files import load_rule_files
from vllm_watchdog.store import SampleStore

NOW = 1_700_000_000.0
RULES = (
    "groups:\n  - name: g\n    rules:\n      - alert: Backlog\n        expr: vllm:num_requests_waiting > 2\n"
)


def _evaluation(tmp_path: Path, targets: int) -> RuleEvaluation:
    rules = tmp_path / "r.yml"
    rules.write_text(RULES)
    listed = ", ".join(f"{{name: v{i}, url: 'http://127.0.0.1:{8000 + i}'}}" for i in range(targets))
    config = parse_config(
        f"global: {{scrape_interval: 1s, evaluation_interval: 1s}}\nrule_files: [{rules}]\ntargets: [{listed}]\n",
        str(tmp_path / "w.yml"),
        env={},
    )
    return RuleEvaluation(config, load_rule_files(config.rule_files), SampleStore(retention=600.0))


def _evaluations(ev: RuleEvaluation) -> int:
    return sum(ev.stats.evaluations.values())


def test_eight_targets_spread_over_the_interval_evaluate_once_per_interval(tmp_path: Path) -> None:
    ev = _evaluation(tmp_path, 8)
    for second in range(60):
        for i in range(8):  # each scrape starts on schedule and lands a few ms later
            scheduled = NOW + second + i / 8
            ev.after_scrape(scheduled + 0.004 + 0.002 * (i % 3), scraped_at=scheduled)
    assert _evaluations(ev) == 60  # a slack of half an interval made it 120


def test_one_target_evaluates_after_every_scrape_whatever_the_scrape_took(tmp_path: Path) -> None:
    ev = _evaluation(tmp_path, 1)
    durations = [0.002, 0.35, 0.001, 0.2, 0.6, 0.003] * 10  # slow scrapes, then quick ones
    for second, took in enumerate(durations):
        ev.after_scrape(NOW + second + took, scraped_at=NOW + second)
    assert _evaluations(ev) == len(durations)


def test_a_scrape_a_little_early_on_the_loop_still_counts(tmp_path: Path) -> None:
    ev = _evaluation(tmp_path, 1)
    for second in range(30):
        jitter = -0.03 if second % 2 else 0.03  # the loop runs a job up to tens of ms off its time
        ev.after_scrape(NOW + second + jitter + 0.01, scraped_at=NOW + second + jitter)
    assert _evaluations(ev) == 30
