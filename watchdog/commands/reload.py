"""`vllm-watchdog reload`: make a running daemon reload its config and exit with the outcome, so that
`systemctl reload` (ExecReload) fails when the new config is rejected.

With a token (`VLLM_WATCHDOG_TOKEN`) it asks the API (`POST /-/reload`), which answers with every problem.
Without one, given `--pid` (systemd's `$MAINPID`), it sends SIGHUP and reads the outcome from the open
`/metrics` (`vllm_watchdog_config_reloads_total`), so it works where the control API is disabled.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from typing import TextIO

import httpx

from ..exitcodes import EXIT_CONFIG, EXIT_FAILED, EXIT_OK, EXIT_UNREACHABLE, EXIT_USAGE

RELOADS = "vllm_watchdog_config_reloads_total"


def reload_counts(client: httpx.Client, url: str) -> tuple[float, float]:
    """(successful, failed) reloads so far, from the daemon's /metrics."""
    resp = client.get(url.rstrip("/") + "/metrics")
    resp.raise_for_status()
    ok = failed = 0.0
    for line in resp.text.splitlines():
        if line.startswith(RELOADS + '{result="success"}'):
            ok = float(line.split()[-1])
        elif line.startswith(RELOADS + '{result="failure"}'):
            failed = float(line.split()[-1])
    return ok, failed


def _by_api(client: httpx.Client, url: str, token: str, err: TextIO) -> int | None:
    """The outcome of POST /-/reload; None when the control API is disabled (403) or refuses the token."""
    resp = client.post(url.rstrip("/") + "/-/reload", headers={"Authorization": f"Bearer {token}"})
    if resp.status_code == 200:
        return EXIT_OK
    if resp.status_code == 422:
        print("vllm-watchdog reload: rejected; the daemon keeps its old config:", file=err)
        for problem in resp.json().get("errors") or []:
            print(f"  {problem}", file=err)
        return EXIT_CONFIG
    if resp.status_code in (401, 403):
        return None
    print(f"vllm-watchdog reload: {url}: HTTP {resp.status_code}: {resp.text[:200]}", file=err)
    return EXIT_FAILED


def _by_signal(
    client: httpx.Client,
    url: str,
    pid: int,
    err: TextIO,
    timeout: float,
    clock: Callable[[], float],
    sleep: Callable[[float], None],
) -> int:
    """SIGHUP `pid`, then wait until /metrics counts one more reload, and say which kind."""
    before = reload_counts(client, url)
    os.kill(pid, signal.SIGHUP)
    deadline = clock() + timeout
    while clock() < deadline:
        sleep(0.1)
        ok, failed = reload_counts(client, url)
        if failed > before[1]:
            print("vllm-watchdog reload: rejected; the old config stays (see the log)", file=err)
            return EXIT_CONFIG
        if ok > before[0]:
            return EXIT_OK
    print(f"vllm-watchdog reload: no reload seen on {url}/metrics within {timeout:g}s", file=err)
    return EXIT_FAILED


def run_reload(
    url: str,
    *,
    token: str | None,
    pid: int | None,
    err: TextIO,
    timeout: float = 30.0,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> int:
    """Reload the daemon at `url`; the exit status (exitcodes)."""
    if not token and pid is None:
        print("vllm-watchdog reload: needs VLLM_WATCHDOG_TOKEN (the api_token) or --pid", file=err)
        return EXIT_USAGE
    try:
        with httpx.Client(timeout=timeout, trust_env=False) as client:
            if token:
                status = _by_api(client, url, token, err)
                if status is not None:
                    return status
                if pid is None:
                    print("vllm-watchdog reload: the API refused the token (403/401); give --pid", file=err)
                    return EXIT_FAILED
            assert pid is not None
            return _by_signal(client, url, pid, err, timeout, clock, sleep)
    except (httpx.HTTPError, ValueError) as exc:
        print(f"vllm-watchdog reload: cannot reach {url}: {exc}", file=err)
        return EXIT_UNREACHABLE
    except ProcessLookupError:
        print(f"vllm-watchdog reload: no process {pid}", file=err)
        return EXIT_UNREACHABLE
