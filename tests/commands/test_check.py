"""`vllm-watchdog check`: files as arguments (as promtool takes them), "did you mean", and the exit statuses."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.configs import target, write_config
from vllm_watchdog.cli import main
from vllm_watchdog.exitcodes import EXIT_CONFIG, EXIT_OK, EXIT_USAGE


def test_check_takes_several_files_as_arguments(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    a = write_config(tmp_path / "a", target("http://127.0.0.1:8000", "a"), port=9460)
    b = write_config(
        tmp_path / "b", target("http://127.0.0.1:8001", "b"), target("http://127.0.0.1:8002", "c"), port=9461
    )
    assert main(["check", str(a), str(b)]) == EXIT_OK
    out = capsys.readouterr().out
    assert f"{a}: OK: 1 targets" in out and f"{b}: OK: 2 targets" in out


def test_check_goes_on_after_an_invalid_file_and_exits_3(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "bad.yml"
    bad.write_text("global:\n  scrape_intervl: 1s\n")
    good = write_config(tmp_path, target("http://127.0.0.1:8000", "a"), port=9460)
    assert main(["check", str(bad), str(good)]) == EXIT_CONFIG
    captured = capsys.readouterr()
    assert f"{good}: OK" in captured.out
    assert captured.err.startswith(
        f"{bad}:2: global.scrape_intervl: unknown key (did you mean 'scrape_interval'? allowed: "
    )


def test_no_hint_when_nothing_is_close(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.yml"
    bad.write_text("targets:\n  - name: a\n    url: http://127.0.0.1:1\n    bogus: 1\n    helth_path: /h\n")
    assert main(["check", "--config", str(bad)]) == EXIT_CONFIG
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith(f"{bad}:4: targets[0].bogus: unknown key (allowed: ")
    assert err[1].startswith(f"{bad}:5: targets[0].helth_path: unknown key (did you mean 'health_path'? ")


def test_a_usage_error_is_2_and_not_a_config_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["check", "--no-such-flag"])
    assert exc.value.code == EXIT_USAGE


def test_replay_audit_without_plot_is_a_usage_error(tmp_path: Path) -> None:
    assert main(["replay", "--input", str(tmp_path / "log"), "--audit", str(tmp_path)]) == EXIT_USAGE
