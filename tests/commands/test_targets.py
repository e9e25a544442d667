"""`vllm-watchdog targets`: a down target's error is printed once, with the probes that saw it; exit 1."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.configs import target, write_config
from tests.support.vllm_server import free_port
from vllm_watchdog.cli import main
from vllm_watchdog.exitcodes import EXIT_FAILED


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
