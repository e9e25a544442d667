"""Chaos: the webhook receiver and the Alertmanager are down for over a minute while alerts fire and resolve,
and the watchdog is killed with SIGKILL in the middle; nothing is lost, and the webhook gets it all in order.

A real watchdog evaluates one rule on a gauge a FaultServer serves, `chaos_flag{cycle="i"}`, which the test
turns on and off: alerts fire and resolve four times (the last one stays firing). Both receivers are down from
the start: the webhook's port is closed, the real Alertmanager (tests/support/alertmanager_server.py) is stopped. The
watchdog is killed with SIGKILL while cycle 2 fires and started again on the same state_dir. After at least
DOWN seconds both receivers come up; then every transition must arrive: the webhook in the order the watchdog
saw them (re-sends of a state, which notifiers.md documents, are allowed; a firing after its resolution is
not), the Alertmanager with the final state (its queue keeps the newest state of each alert).
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx

from tests.support.alertmanager_server import AlertmanagerServer
from tests.support.apitargets import targets
from tests.support.configs import target, write_config
from tests.support.faultserver import FaultServer
from tests.support.vllm_server import free_port
from tests.support.watchdogproc import poll, start_watchdog

DOWN = 65.0  # seconds both receivers stay down, counted from the first queued notification
CYCLES = 4  # alerts 1..3 fire and resolve, 4 stays firing
KILL_IN = 2  # the watchdog is killed while this cycle's alert fires
LIMIT = 60.0


class Hook:
    """A webhook receiver on a fixed 127.0.0.1 port, started late; records the JSON bodies in order."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.bodies: list[dict[str, Any]] = []
        self.server: ThreadingHTTPServer | None = None

    def start(self) -> None:
        """Listen on the port from now on."""
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length") or 0))
                outer.bodies.append(json.loads(body))
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

        self.server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        threading.Thread(
            target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        ).start()

    def transitions(self) -> list[tuple[int, str]]:
        """(cycle, status) of every ChaosFlip alert received, in arrival order."""
        return [
            (int(a["labels"]["cycle"]), a["status"])
            for body in list(self.bodies)
            if body.get("type") == "alert"
            for a in body["alerts"]
            if a["labels"].get("alertname") == "ChaosFlip"
        ]

    def close(self) -> None:
        """Stop listening."""
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()


def _metrics(on: set[int]) -> str:
    return "".join(f'chaos_flag{{cycle="{i}"}} {1 if i in on else 0}\n' for i in range(1, CYCLES + 1))


def _metric(base: str, name: str, notifier: str) -> float:
    for line in httpx.get(base + "/metrics", timeout=5).text.splitlines():
        if line.startswith(f'{name}{{notifier="{notifier}"}} '):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def _rule_transitions(log: Path) -> list[tuple[int, str]]:
    """(cycle, state) of every ChaosFlip firing and resolution the rule engine logged, in order (both watchdog
    processes write the one log). The flips make most of them; a scrape that a loaded CI times out makes a
    resolution and, a scrape later, a firing again (seen: 24 s of a starved daemon): transitions too, which
    the notifiers must deliver like the others."""
    out = []
    for line in log.read_text(errors="replace").splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if rec.get("alertname") == "ChaosFlip" and rec.get("msg") in ("alert firing", "alert resolved"):
            cycle = re.search(r'cycle="(\d+)"', rec["labels"])
            assert cycle is not None, rec
            out.append((int(cycle.group(1)), rec["msg"].removeprefix("alert ")))
    return out


def _firsts(items: list[tuple[int, str]]) -> list[tuple[int, str]]:
    """Each item at its first occurrence, in order (resends repeat an alert's state)."""
    out: list[tuple[int, str]] = []
    for item in items:
        if item not in out:
            out.append(item)
    return out


def test_receivers_down_for_a_minute_and_a_kill_9_lose_nothing(
    tmp_path: Path, fault: FaultServer, cleanup: list[Callable[[], None]]
) -> None:
    on: set[int] = set()
    fault.set("/metrics", _metrics(on))
    hook = Hook(free_port())
    cleanup.append(hook.close)
    (tmp_path / "am").mkdir()
    am = AlertmanagerServer(tmp_path / "am")  # not started: down from the beginning
    cleanup.append(am.close)
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    log = tmp_path / "watchdog.log"
    rules = tmp_path / "chaos.rules.yml"
    rules.write_text(
        "groups:\n  - name: chaos\n    rules:\n      - alert: ChaosFlip\n        expr: chaos_flag > 0\n"
    )
    cfg = write_config(
        tmp_path,
        target(fault.url, health_probe=False),
        port=port,
        token=None,
        rest=f"""rule_files: [{rules}]
notifiers:
  - {{type: webhook, name: hook, url: "http://127.0.0.1:{hook.port}/hook", timeout: 2s, backoff_initial: 1s, backoff_max: 4s}}
  - {{type: alertmanager, name: am, url: "{am.url}", timeout: 2s, backoff_initial: 1s, backoff_max: 4s}}
""",
    )
    wd = start_watchdog(cfg, log)
    cleanup.append(lambda: (wd.kill(), wd.wait(10)))
    poll(base + "/api/v1/targets", lambda j: targets(j)[0]["up"], LIMIT, "target up", log)

    def firing() -> dict[int, str]:
        alerts = httpx.get(base + "/api/v1/alerts", timeout=5).json()["data"]["alerts"]
        return {int(a["labels"]["cycle"]): a["state"] for a in alerts}

    def flip(cycle: int, state: bool) -> None:
        (on.add if state else on.discard)(cycle)
        fault.set("/metrics", _metrics(on))
        want = "firing" if state else None
        poll(
            base + "/api/v1/alerts",
            lambda _: firing().get(cycle) == want,
            LIMIT,
            f"cycle {cycle} {'firing' if state else 'resolved'}",
            log,
        )

    flip(1, True)
    poll(
        base + "/healthz",
        lambda _: _metric(base, "vllm_watchdog_notifications_queued", "hook") > 0,
        LIMIT,
        "queued",
        log,
    )
    down_since = time.monotonic()
    flip(1, False)
    flip(KILL_IN, True)
    poll(
        base + "/healthz",
        lambda _: (
            _metric(base, "vllm_watchdog_notification_retries_total", "hook") >= 2
            and _metric(base, "vllm_watchdog_notification_retries_total", "am") >= 2
        ),
        LIMIT,
        "delivery tried and failed while the receivers are down",
        log,
    )
    queued_before = _metric(base, "vllm_watchdog_notifications_queued", "hook")
    wd.kill()  # SIGKILL while cycle KILL_IN fires
    wd.wait(10)
    wd = start_watchdog(cfg, log)
    cleanup.append(lambda: (wd.kill(), wd.wait(10)))
    poll(base + "/api/v1/targets", lambda j: targets(j)[0]["up"], LIMIT, "restarted watchdog up", log)
    assert _metric(base, "vllm_watchdog_notifications_queued", "hook") >= queued_before
    poll(base + "/api/v1/alerts", lambda _: firing().get(KILL_IN) == "firing", LIMIT, "alert restored", log)
    flip(KILL_IN, False)
    for cycle in range(KILL_IN + 1, CYCLES + 1):
        flip(cycle, True)
        if cycle < CYCLES:
            flip(cycle, False)
    assert hook.bodies == []
    time.sleep(max(0.0, DOWN - (time.monotonic() - down_since)))
    downtime = time.monotonic() - down_since

    hook.start()
    am.start()
    expected = [(i, s) for i in range(1, CYCLES + 1) for s in ("firing", "resolved")][:-1]
    hook_done = poll(
        base + "/healthz",
        lambda _: (
            set(expected) <= set(hook.transitions())
            and _metric(base, "vllm_watchdog_notifications_queued", "hook") == 0
        ),
        LIMIT,
        "every transition at the webhook",
        log,
    )
    assert hook_done
    got = hook.transitions()
    made = _rule_transitions(log)  # what the rule engine did: the flips, and any a missed scrape made
    assert set(expected) <= set(made), made
    assert _firsts(got) == _firsts(made), (got, made)  # every transition, in the order they happened
    for cycle in range(1, CYCLES):
        resolved_at = len(got) - 1 - got[::-1].index((cycle, "resolved"))
        assert (cycle, "firing") not in got[resolved_at:], (cycle, got)  # no firing after its resolution
    am_alerts = am.wait_for_alerts(
        lambda a: [int(x["labels"]["cycle"]) for x in a] == [CYCLES], timeout=LIMIT, alertname="ChaosFlip"
    )
    assert am_alerts[0]["status"]["state"] == "active"
    poll(
        base + "/healthz",
        lambda _: _metric(base, "vllm_watchdog_notifications_queued", "am") == 0,
        LIMIT,
        "am queue empty",
        log,
    )
    for notifier in ("hook", "am"):
        assert _metric(base, "vllm_watchdog_notifications_dropped_total", notifier) == 0.0
        assert _metric(base, "vllm_watchdog_notifications_failed_total", notifier) == 0.0
    resends = len(got) - len(expected)
    print(
        f"\nreceivers down {downtime:.0f} s; webhook got {len(got)} alert states for {len(expected)} transitions"
    )
    assert resends >= 0
