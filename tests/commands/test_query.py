"""`vllm-watchdog query`: a dead target is an error (not an empty answer), `--time`, and `-o json`."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from tests.support.configs import target, write_config
from tests.support.faultserver import FaultServer
from tests.support.vllm_server import ROOT, free_port
from vllm_watchdog.cli import main
from vllm_watchdog.commands.query import parse_time
from vllm_watchdog.exitcodes import EXIT_FAILED, EXIT_OK, EXIT_UNREACHABLE, EXIT_USAGE

METRICS = (ROOT / "tests" / "fixtures" / "vllm-0.32.0-metrics.txt").read_text()
RUNNING = "vllm:num_requests_running"


def test_a_dead_target_exits_4_and_says_why(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = write_config(tmp_path, target(f"http://127.0.0.1:{free_port()}", "dead"), port=free_port())
    assert main(["query", "-c", str(cfg), "up"]) == EXIT_UNREACHABLE
    captured = capsys.readouterr()
    assert captured.out == ""
    assert "target dead: scrape failed: " in captured.err and "no target could be scraped" in captured.err


def test_one_dead_target_of_two_is_a_warning(
    tmp_path: Path, fault: FaultServer, capsys: pytest.CaptureFixture[str]
) -> None:
    fault.vllm_like(METRICS)
    dead = target(f"http://127.0.0.1:{free_port()}", "dead")
    cfg = write_config(tmp_path, target(fault.url, "live"), dead, port=free_port())
    assert main(["query", "-c", str(cfg), RUNNING]) == EXIT_OK
    captured = capsys.readouterr()
    assert RUNNING in captured.out and '"live"' in captured.out and "=> 1 @[" in captured.out
    assert "target dead: scrape failed" in captured.err


def test_json_output_at_a_given_time(
    tmp_path: Path, fault: FaultServer, capsys: pytest.CaptureFixture[str]
) -> None:
    fault.vllm_like(METRICS)
    cfg = write_config(tmp_path, target(fault.url, "live"), port=free_port())
    # A minute ahead: the fresh samples are within the 5m lookback, and the evaluation time is ours.
    at = float(int(time.time()) + 60)
    assert main(["query", "-c", str(cfg), f"{RUNNING} * 0 + time()", "--time", str(at), "-o", "json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["resultType"] == "vector"
    [sample] = data["result"]
    assert "live" in sample["metric"].values() and "__name__" not in sample["metric"]
    assert sample["value"] == [at, str(int(at))]


def test_time_parsing() -> None:
    assert parse_time("1700000000.5") == 1_700_000_000.5
    assert parse_time("2023-11-14T22:13:20Z") == 1_700_000_000.0
    assert parse_time("2023-11-14T23:13:20+01:00") == 1_700_000_000.0
    with pytest.raises(ValueError, match="neither unix seconds nor RFC 3339"):
        parse_time("yesterday")


def test_bad_time_is_a_usage_error_and_a_bad_expression_a_failure(tmp_path: Path) -> None:
    cfg = write_config(tmp_path, target(f"http://127.0.0.1:{free_port()}", "dead"), port=free_port())
    assert main(["query", "-c", str(cfg), "up", "--time", "noon"]) == EXIT_USAGE
    assert main(["query", "-c", str(cfg), "sum(("]) == EXIT_FAILED
