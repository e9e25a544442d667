"""Chaos: SIGHUP to a running watchdog with an invalid config, then with invalid rules, then a valid one.

A real watchdog process scrapes a FaultServer and evaluates one rule file. Each invalid reload must leave the
old config and rules in force (same targets, same rules, the alert still firing, scrapes going on), log every
problem with its file and line, count the failure in `vllm_watchdog_config_reloads_total{result="failure"}`
and set `vllm_watchdog_config_last_reload_successful` to 0; a valid SIGHUP afterwards recovers all three.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from tests.support.apitargets import targets
from tests.support.faultserver import FaultServer
from tests.support.vllm_server import free_port
from tests.support.watchdogproc import poll, start_watchdog

PAYLOAD = 'vllm:num_requests_waiting{model_name="m"} 3\nvllm:num_requests_running{model_name="m"} 1\n'
LIMIT = 30.0


def _config(port: int, url: str, rules: Path, target_url: str | None = None) -> str:
    return f"""global: {{scrape_interval: 1s, evaluation_interval: 1s}}
listen: 127.0.0.1:{port}
rule_files: [{rules}]
targets:
  - name: vllm-0
    url: {target_url or url}
    canary: false
"""


RULES = """groups:
  - name: chaos
    rules:
      - alert: ChaosQueueWaiting
        expr: vllm:num_requests_waiting > 1
"""
MORE_RULES = (
    RULES
    + """      - alert: ChaosRunning
        expr: vllm:num_requests_running > 0
"""
)


def _metric(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} not in /metrics")


def _rule_names(base: str) -> list[str]:
    groups = httpx.get(base + "/api/v1/rules", timeout=5).json()["data"]["groups"]
    return [r["name"] for g in groups for r in g["rules"]]


def _rejections(log: Path) -> list[str]:
    """The `problem` of every "reload rejected" line of the watchdog's JSON log."""
    out = []
    for line in log.read_text().splitlines():
        if line.startswith("{"):
            entry: dict[str, Any] = json.loads(line)
            if entry.get("msg") == "reload rejected; keeping the old config":
                out.append(str(entry["problem"]))
    return out


def test_sighup_with_invalid_config_or_rules_keeps_the_old_ones(
    tmp_path: Path, fault: FaultServer, cleanup: list[Callable[[], None]]
) -> None:
    fault.vllm_like(PAYLOAD)
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    cfg, rules, log = tmp_path / "watchdog.yml", tmp_path / "chaos.rules.yml", tmp_path / "watchdog.log"
    good = _config(port, fault.url, rules)
    cfg.write_text(good)
    rules.write_text(RULES)
    wd = start_watchdog(cfg, log)
    cleanup.append(lambda: (wd.kill(), wd.wait(10)))
    poll(base + "/api/v1/alerts", lambda j: len(j["data"]["alerts"]) == 1, LIMIT, "ChaosQueueWaiting", log)

    def hup_and_wait(failures: float, successes: float) -> str:
        wd.send_signal(signal.SIGHUP)
        want = (f'result="failure"}} {failures}', f'result="success"}} {successes}')
        return poll_metrics(lambda t: all(w in t for w in want))

    def poll_metrics(pred: Callable[[str], bool]) -> str:
        box: list[str] = []

        def check(_: Any) -> bool:
            box.append(httpx.get(base + "/metrics", timeout=5).text)
            return pred(box[-1])

        poll(base + "/healthz", check, LIMIT, "reload counted in /metrics", log)
        return box[-1]

    def still_in_force(before: float) -> None:
        """The old targets and rules run: the target is scraped after the failed reload, the alert fires."""
        after = poll(
            base + "/api/v1/targets",
            lambda j: targets(j)[0]["up"] and targets(j)[0]["last_scrape"] > before + 2,
            LIMIT,
            "scrapes going on after the rejected reload",
            log,
        )
        assert [t["name"] for t in targets(after)] == ["vllm-0"]
        assert targets(after)[0]["url"] == fault.url
        assert _rule_names(base) == ["ChaosQueueWaiting"]
        alerts = httpx.get(base + "/api/v1/alerts", timeout=5).json()["data"]["alerts"]
        assert [(a["labels"]["alertname"], a["state"]) for a in alerts] == [("ChaosQueueWaiting", "firing")]

    # 1. invalid config: a bad target URL and an unknown key, each on a line of its own
    bad = _config(port, fault.url, rules, target_url="not a url") + "bogus: 1\n"
    url_line = bad.splitlines().index("    url: not a url") + 1
    bogus_line = bad.splitlines().index("bogus: 1") + 1
    cfg.write_text(bad)
    t0 = targets(httpx.get(base + "/api/v1/targets", timeout=5).json())[0]["last_scrape"]
    text = hup_and_wait(1.0, 0.0)
    assert _metric(text, "vllm_watchdog_config_last_reload_successful") == 0.0
    assert _metric(text, "vllm_watchdog_config_errors") == 2.0
    problems = _rejections(log)
    assert any(p.startswith(f"{cfg}:{url_line}: ") and "url" in p for p in problems), problems
    assert any(p.startswith(f"{cfg}:{bogus_line}: bogus: unknown key") for p in problems), problems
    still_in_force(t0)

    # 2. the config is fine again, but the rule file has a broken expression
    cfg.write_text(good)
    broken = RULES.replace("vllm:num_requests_waiting > 1", "rate(vllm:num_requests_waiting[5m] > 1")
    expr_line = next(i for i, line in enumerate(broken.splitlines(), 1) if "rate(" in line)
    rules.write_text(broken)
    t1 = targets(httpx.get(base + "/api/v1/targets", timeout=5).json())[0]["last_scrape"]
    text = hup_and_wait(2.0, 0.0)
    assert _metric(text, "vllm_watchdog_config_last_reload_successful") == 0.0
    assert _metric(text, "vllm_watchdog_config_errors") == 1.0
    rule_problems = [p for p in _rejections(log) if p.startswith(f"{rules}:{expr_line}: ")]
    assert rule_problems, _rejections(log)
    still_in_force(t1)

    # 3. both valid (one rule more): the reload succeeds and the metrics recover
    rules.write_text(MORE_RULES)
    text = hup_and_wait(2.0, 1.0)
    assert _metric(text, "vllm_watchdog_config_last_reload_successful") == 1.0
    assert _metric(text, "vllm_watchdog_config_errors") == 0.0
    assert _rule_names(base) == ["ChaosQueueWaiting", "ChaosRunning"]
    poll(base + "/api/v1/alerts", lambda j: len(j["data"]["alerts"]) == 2, LIMIT, "both alerts firing", log)
    assert wd.poll() is None


def test_sighup_with_fifo_files_and_leaky_errors_neither_freezes_nor_leaks(
    tmp_path: Path, fault: FaultServer, cleanup: list[Callable[[], None]]
) -> None:
    """A FIFO as include and as rule file froze the daemon loop on SIGHUP (the read never returned), and a bad
    value substituted from a secret variable was logged in clear. Now the reload is refused at once, the daemon
    scrapes on, and the logged problems are the lines `check` prints, the secret masked in both."""
    fault.vllm_like(PAYLOAD)
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    cfg, rules, log = tmp_path / "watchdog.yml", tmp_path / "chaos.rules.yml", tmp_path / "watchdog.log"
    rules.write_text(RULES)
    cfg.write_text(_config(port, fault.url, rules))
    secret = f"secret-{port}-value"
    env = {**os.environ, "SCRAPE_SECRET": secret}
    with log.open("ab") as out:
        wd = subprocess.Popen(
            [sys.executable, "-m", "vllm_watchdog", "run", "--config", str(cfg)],
            stdout=out,
            stderr=out,
            env=env,
        )
    cleanup.append(lambda: (wd.kill(), wd.wait(10)))
    poll(base + "/api/v1/targets", lambda j: targets(j)[0]["up"], LIMIT, "first scrape", log)

    os.mkfifo(tmp_path / "inc.yml")
    os.mkfifo(tmp_path / "fifo.rules.yml")
    leaky = _config(port, fault.url, tmp_path / "fifo.rules.yml").splitlines()[1:]  # no `global:`
    leaky += ["include: [inc.yml]", "global: {scrape_interval: '${SCRAPE_SECRET}'}"]
    cfg.write_text("\n".join(leaky) + "\n")
    t0 = targets(httpx.get(base + "/api/v1/targets", timeout=5).json())[0]["last_scrape"]
    wd.send_signal(signal.SIGHUP)
    poll(
        base + "/api/v1/targets",
        lambda j: targets(j)[0]["up"] and targets(j)[0]["last_scrape"] > t0 + 3,
        LIMIT,
        "scrapes going on after SIGHUP with FIFOs",
        log,
    )
    problems = _rejections(log)
    assert problems == [
        f"{tmp_path}/fifo.rules.yml:1: (file): cannot read: not a regular file but a FIFO",
        f"{cfg}:7: include[0]: cannot read included file {tmp_path}/inc.yml (not a regular file but a FIFO)",
        f"{cfg}:8: global.scrape_interval: not a valid duration string: '<redacted>' (use e.g. 15s, 1m30s, 500ms)",
    ]
    assert secret not in log.read_text()
    check = subprocess.run(
        [sys.executable, "-m", "vllm_watchdog", "check", "--config", str(cfg)],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert check.stderr.splitlines() == problems
    assert wd.poll() is None
