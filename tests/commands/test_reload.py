"""`vllm-watchdog reload` against a real daemon process: 0 when applied, 3 when rejected (the problems
printed, by the API with a token, by SIGHUP and /metrics without), 4 when nothing listens."""

from __future__ import annotations

import io
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.support.configs import TOKEN, target, write_config
from tests.support.vllm_server import free_port
from tests.support.watchdogproc import poll, start_watchdog
from vllm_watchdog.cli import main
from vllm_watchdog.commands.reload import reload_counts, run_reload
from vllm_watchdog.exitcodes import EXIT_CONFIG, EXIT_OK, EXIT_UNREACHABLE, EXIT_USAGE


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[tuple[Path, str, int]]:
    port = free_port()
    cfg = write_config(tmp_path, target(f"http://127.0.0.1:{free_port()}"), port=port)
    log = tmp_path / "watchdog.log"
    proc = start_watchdog(cfg, log)
    url = f"http://127.0.0.1:{port}"
    try:
        poll(url + "/api/v1/targets", lambda _: True, 30, "the API", log)
        yield cfg, url, proc.pid
    finally:
        proc.terminate()
        proc.wait(20)


def test_reload_by_api_and_by_signal(daemon: tuple[Path, str, int]) -> None:
    cfg, url, pid = daemon
    err = io.StringIO()
    assert run_reload(url, token=TOKEN, pid=None, err=err) == EXIT_OK
    assert run_reload(url, token=None, pid=pid, err=err) == EXIT_OK
    good = cfg.read_text()
    cfg.write_text(good + "bogus: 1\n")
    assert run_reload(url, token=TOKEN, pid=None, err=err) == EXIT_CONFIG
    assert f"{cfg}:" in err.getvalue() and "bogus: unknown key" in err.getvalue()
    assert run_reload(url, token=None, pid=pid, err=err) == EXIT_CONFIG
    assert run_reload(url, token="wrong", pid=pid, err=err) == EXIT_CONFIG  # refused token: SIGHUP instead
    with httpx.Client(trust_env=False) as client:
        assert reload_counts(client, url) == (2.0, 3.0)
    cfg.write_text(good)
    assert run_reload(url, token=TOKEN, pid=None, err=err) == EXIT_OK


def test_reload_without_a_daemon_or_a_way_to_ask() -> None:
    err = io.StringIO()
    url = f"http://127.0.0.1:{free_port()}"
    assert run_reload(url, token=TOKEN, pid=None, err=err) == EXIT_UNREACHABLE
    assert "cannot reach" in err.getvalue()
    assert run_reload(url, token=None, pid=None, err=err) == EXIT_USAGE


def test_reload_and_top_find_the_api_and_token_in_the_config(
    daemon: tuple[Path, str, int], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """As amtool reads its config: a watchdog on a port of its own is found from `--config` alone, and the
    config's api_token authorizes the reload (no VLLM_WATCHDOG_TOKEN, no --url, no --pid)."""
    cfg, _, _ = daemon
    monkeypatch.delenv("VLLM_WATCHDOG_TOKEN", raising=False)
    assert main(["reload", "--config", str(cfg)]) == EXIT_OK
    assert main(["top", "--once", "--no-color", "--config", str(cfg)]) == EXIT_OK
    assert "vllm-0" in capsys.readouterr().out
    assert (
        main(["reload", "--config", str(cfg), "--url", f"http://127.0.0.1:{free_port()}"]) == EXIT_UNREACHABLE
    )
    broken = cfg.parent / "broken.yml"
    broken.write_text("listen: [\n")
    assert main(["reload", "--config", str(broken)]) == EXIT_CONFIG
