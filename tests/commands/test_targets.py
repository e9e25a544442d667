"""`vllm-watchdog targets`: a down target's error is printed once, with the probes that saw it; exit 1; the known
answers of each checked target against the daemon's baseline."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import pytest

from tests.support.configs import target, write_config
from tests.support.vllm_server import VllmServer, free_port
from vllm_watchdog.cli import main
from vllm_watchdog.commands.targets import answer_cell
from vllm_watchdog.config.model import Config, load_config
from vllm_watchdog.exitcodes import EXIT_FAILED, EXIT_OK
from vllm_watchdog.integrity.checker import IntegrityOptions, KnownAnswers, Readiness
from vllm_watchdog.integrity.verdict import Verdict, unknown


def test_a_dead_target_names_its_error_once(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    port = free_port()
    cfg = write_config(tmp_path, target(f"http://127.0.0.1:{port}", "dead", canary=True), port=free_port())
    assert main(["targets", "-c", str(cfg)]) == EXIT_FAILED
    [_, row] = capsys.readouterr().out.splitlines()
    error = row.split("  ")[-1]
    assert error.startswith("scrape, health: ") and "canary" in error, row
    # the scrape's and the health probe's identical refusal, once
    assert error.count(f"'127.0.0.1', {port}") == 1, row


def test_discovered_targets_are_listed_too(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    port = free_port()
    (tmp_path / "sd.json").write_text(
        f'[{{"targets": ["127.0.0.1:{port}"], "labels": {{"__watchdog_target__": "found"}}}}]'
    )
    cfg = write_config(
        tmp_path, port=free_port(), rest="file_sd_configs: [{files: [sd.json], target: {canary: false}}]\n"
    )
    assert main(["targets", "-c", str(cfg)]) == EXIT_FAILED
    [_, row] = capsys.readouterr().out.splitlines()
    assert row.split()[:3] == ["found", f"http://127.0.0.1:{port}", "0"], row


@pytest.mark.vllm
def test_known_answers_column_off_unverified_and_against_the_learnt_baseline(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], vllm_server: VllmServer
) -> None:
    """On the real vLLM: a target without a baseline says so; once the daemon's checker learnt one into the
    state_dir, `targets` verifies the answers against it (never learning itself); no canary, no check."""
    cfg = write_config(
        tmp_path,
        target(vllm_server.url, "llm", canary={"timeout": "30s"}),
        target(vllm_server.url, "quiet"),
        port=free_port(),
        integrity=True,
    )
    assert main(["targets", "-c", str(cfg)]) == EXIT_OK
    rows = {row.split()[0]: row for row in capsys.readouterr().out.splitlines()[1:]}
    assert "  no baseline  " in rows["llm"] and "  off  " in rows["quiet"], rows
    config = load_config(str(cfg), env={})
    asyncio.run(_learn(config))
    assert main(["targets", "-c", str(cfg)]) == EXIT_OK
    rows = {row.split()[0]: row for row in capsys.readouterr().out.splitlines()[1:]}
    answers = rows["llm"].split("  ")
    assert "ok 0/0.01" in answers, rows["llm"]  # bit-identical on CPU: 0 nats against the 0.01 floor


async def _learn(config: Config) -> None:
    """Learn the baseline of target `llm` as the daemon does (a check a minute, the engine ready)."""
    async with httpx.AsyncClient(timeout=60) as client:
        options = IntegrityOptions(
            client=lambda _: client,
            readiness=lambda name, at: Readiness(healthy=True, canary=True),
            state_dir=config.state_dir,
        )
        checker = KnownAnswers(config.integrity, options)
        checker.apply(config.integrity, ["llm"])
        llm = next(t for t in config.targets if t.name == "llm")
        for minute in range(8):
            await checker.check(llm, 1_700_000_000.0 + 60 * minute)
            if checker.status("llm").baseline is not None:
                return
    raise AssertionError(f"no baseline learnt: {checker.status('llm')}")


def test_a_verdict_renders_as_its_numbers() -> None:
    wrong = Verdict(ok=False, divergence=0.3127, tolerance=0.0128, greedy_mismatches=1, reason="diverged")
    assert answer_cell(wrong, no_baseline=False) == ("DIVERGED 0.313/0.0128", None)
    assert answer_cell(unknown("probe failed: HTTP 500"), no_baseline=False) == (
        "unknown",
        "probe failed: HTTP 500",
    )
    assert answer_cell(unknown("no known-answer baseline"), no_baseline=True) == ("no baseline", None)
