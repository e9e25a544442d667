"""Targets found, not listed, end to end: a real watchdog process whose targets come from a file_sd file
edited while it runs and from labelled Docker containers, and whose reloads add and remove a process-mode
target. The servers are tests/support/stub_server.py (in a container, or as the watchdog's child): no vLLM
starts here.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.apitargets import targets
from tests.support.configs import AUTH, target, write_config
from tests.support.docker_engine import SESSION
from tests.support.stub_server import StubContainers, stub_args, stubs_on, wait_status, write_stub
from tests.support.vllm_server import free_port
from tests.support.watchdogproc import poll, start_watchdog

LIMIT = 60.0  # bound on each wait; never asserted on
FAST = "startup_grace: 0s, cooldown: 0s, drain_timeout: 1s, stop_timeout: 120s, ready_timeout: 60s"
RULES = """groups:
  - name: sd
    rules:
      - alert: StubServing
        expr: 'vllm:num_requests_running{job="sd"} >= 0'
"""


@pytest.fixture
def stubs(docker_client: Any, hostroot_image: str) -> Iterator[StubContainers]:
    helper = StubContainers(docker_client, hostroot_image)
    yield helper
    helper.close()


def write_sd(path: Path, groups: list[dict[str, Any]]) -> None:
    """Replace the file_sd file at once, as a writer should (a rename over it)."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(groups))
    tmp.rename(path)


def query(base: str, expr: str) -> list[Any]:
    answer = httpx.get(f"{base}/api/v1/query", params={"query": expr}, timeout=5).json()
    result: list[Any] = answer["data"]["result"]
    return result


def named(answer: Any, name: str) -> list[dict[str, Any]]:
    """The active targets of a /api/v1/targets answer named `name`."""
    return [t for t in answer["data"]["activeTargets"] if t.get("watchdog", {}).get("name") == name]


def test_a_file_sd_target_is_watched_acted_on_and_retired_when_the_file_drops_it(
    tmp_path: Path, stubs: StubContainers, cleanup: list[Callable[[], None]]
) -> None:
    hold = tmp_path / "let-it-stop"
    container, vport = stubs.run(["--hold-file", str(hold)], rw=[tmp_path])
    sd_file = tmp_path / "sd" / "stubs.json"
    sd_file.parent.mkdir()
    write_sd(sd_file, [])
    (tmp_path / "rules.yml").write_text(RULES)
    port = free_port()
    base, log = f"http://127.0.0.1:{port}", tmp_path / "watchdog.log"
    cfg = write_config(
        tmp_path,
        port=port,
        rest=f"""rule_files: [rules.yml]
file_sd_configs:
  - files: ["sd/*.json"]
    refresh_interval: 1s
    runtimes: [docker]
    target: {{job: sd, canary: false}}
actions:
  restart: {{type: restart, {FAST}}}
  draft-off: {{type: disable_draft, {FAST}}}
routes:
  - {{match: {{alertname: StubServing}}, actions: [restart, draft-off]}}
""",
    )
    wd = start_watchdog(cfg, log)
    cleanup.append(lambda: (wd.terminate(), wd.wait(20)))
    poll(base + "/api/v1/targets", lambda j: j["data"]["activeTargets"] == [], LIMIT, "the watchdog up", log)

    # The file is edited while the watchdog runs: the target appears, is scraped, and its rule fires.
    group = {
        "targets": [f"127.0.0.1:{vport}"],
        "labels": {"__watchdog_target__": "sd-stub", "__watchdog_container__": container, "model": "stub"},
    }
    write_sd(sd_file, [group])
    answer = poll(
        base + "/api/v1/targets", lambda j: any(t["up"] for t in targets(j)), LIMIT, "the target", log
    )
    (entry,) = named(answer, "sd-stub")
    assert entry["labels"] == {
        "instance": f"127.0.0.1:{vport}",
        "job": "sd",
        "model": "stub",
        "target": "sd-stub",
    }
    assert entry["discoveredLabels"]["__meta_filepath"] == str(sd_file)
    assert entry["watchdog"]["discovery"] == {
        "mechanism": "file_sd",
        "config": "file_sd_configs[0]",
        "source": f"{sd_file}:0",
    }
    assert [s["value"][1] for s in query(base, 'up{target="sd-stub"}')] == ["1"]

    # Its alert runs the restart; the relaunch waits behind it. The stub holds its stop until told.
    def busy(j: Any) -> bool:
        data = j["data"]
        return data["running"] == {"sd-stub": "restart"} and data["queued"] == {"sd-stub": ["draft-off"]}

    poll(base + "/api/v1/actions", busy, LIMIT, "a restart running and a relaunch waiting", log)
    wait_status(f"http://127.0.0.1:{vport}/health", 503)  # SIGTERM received: the stop is under way

    # Dropped from the file mid-restart: gone from the targets, its series stale, its waiting action cancelled.
    write_sd(sd_file, [])
    poll(base + "/api/v1/targets", lambda j: not named(j, "sd-stub"), LIMIT, "the target retired", log)
    assert (
        query(base, 'up{target="sd-stub"}') == []
        and query(base, 'vllm_watchdog_health_up{target="sd-stub"}') == []
    )

    def cancelled(j: Any) -> bool:
        return any(h["action"] == "draft-off" and h["outcome"] == "skipped" for h in j["data"]["history"])

    status = poll(base + "/api/v1/actions", cancelled, LIMIT, "the waiting relaunch cancelled", log)["data"]
    (skipped,) = [
        h for h in status["history"] if h["action"] == "draft-off"
    ]  # and no refusal when it resolved
    assert skipped["reason"].startswith("target_removed: target sd-stub was removed from the config")
    assert status["queued"] == {} and status["running"] == {"sd-stub": "restart"}  # the flow is not cut short

    # The restart ends as it would have: the container runs again, and nothing is left drained.
    hold.write_text("")

    def ended(j: Any) -> bool:
        return any(h["action"] == "restart" and h["outcome"] != "running" for h in j["data"]["history"])

    status = poll(base + "/api/v1/actions", ended, LIMIT, "the restart finished", log)["data"]
    (restart,) = [h for h in status["history"] if h["action"] == "restart"]
    assert restart["outcome"] == "succeeded", restart
    assert status["drained"] == {} and status["running"] == {}
    assert stubs.client.containers.get(container).status == "running"
    assert [h["action"] for h in status["history"]].count("draft-off") == 1  # never run afterwards


def test_labelled_containers_are_docker_targets_whose_actions_act_on_the_container(
    tmp_path: Path, stubs: StubContainers, cleanup: list[Callable[[], None]]
) -> None:
    prefix = f"sdtest-{SESSION}."  # no other run's containers carry it
    vport = free_port()
    container, _ = stubs.run([], port=vport, labels={prefix + "target": "boxed", prefix + "port": str(vport)})
    port = free_port()
    base, log = f"http://127.0.0.1:{port}", tmp_path / "watchdog.log"
    cfg = write_config(
        tmp_path,
        port=port,
        rest=f"""docker_sd_configs:
  - {{label_prefix: "{prefix}", refresh_interval: 1s, target: {{canary: false}}}}
actions:
  restart: {{type: restart, {FAST}}}
""",
    )
    wd = start_watchdog(cfg, log)
    cleanup.append(lambda: (wd.terminate(), wd.wait(20)))
    answer = poll(
        base + "/api/v1/targets", lambda j: any(t["up"] for t in targets(j)), LIMIT, "the target", log
    )
    (entry,) = named(answer, "boxed")
    assert entry["watchdog"]["container"] == container
    assert entry["discoveredLabels"]["__meta_docker_container_name"] == "/" + container
    started = stubs.client.containers.get(container).attrs["State"]["StartedAt"]

    run = httpx.post(f"{base}/api/v1/actions/restart/run", json={"target": "boxed"}, headers=AUTH, timeout=10)
    assert run.status_code == 202, run.text

    def ended(j: Any) -> bool:
        return any(h["action"] == "restart" and h["outcome"] != "running" for h in j["data"]["history"])

    (row,) = poll(base + "/api/v1/actions", ended, LIMIT, "the restart", log)["data"]["history"]
    assert row["outcome"] == "succeeded", row
    after = stubs.client.containers.get(container).attrs["State"]
    assert after["Running"] and after["StartedAt"] != started  # the container itself was restarted

    stubs.client.containers.get(container).remove(force=True)
    poll(base + "/api/v1/targets", lambda j: not named(j, "boxed"), LIMIT, "the target retired", log)
    assert query(base, 'up{target="boxed"}') == []


def test_a_reload_starts_the_child_of_a_process_target_it_adds_and_stops_the_one_it_removes(
    tmp_path: Path, cleanup: list[Callable[[], None]]
) -> None:
    script, vport, port = write_stub(tmp_path), free_port(), free_port()
    cleanup.append(lambda: [os.killpg(pid, signal.SIGKILL) for pid in stubs_on(vport, script)])
    base, log = f"http://127.0.0.1:{port}", tmp_path / "watchdog.log"
    cfg = write_config(tmp_path, port=port)
    wd = start_watchdog(cfg, log)
    cleanup.append(lambda: (wd.terminate(), wd.wait(20)))
    poll(base + "/api/v1/targets", lambda j: True, LIMIT, "the watchdog up", log)

    command = [sys.executable, str(script), "--port", str(vport)]
    write_config(tmp_path, target(f"http://127.0.0.1:{vport}", "proc", command=command), port=port)
    assert httpx.post(base + "/-/reload", headers=AUTH, timeout=30).status_code == 200
    poll(base + "/api/v1/targets", lambda j: any(t["up"] for t in targets(j)), LIMIT, "the child added", log)
    (pid,) = stubs_on(vport, script)
    assert stub_args(vport)["pid"] == pid
    assert (tmp_path / "state" / "process-proc.json").exists()

    write_config(tmp_path, port=port)
    assert httpx.post(base + "/-/reload", headers=AUTH, timeout=30).status_code == 200

    def retired(j: Any) -> bool:
        return any(h["action"] == "retire" and h["outcome"] != "running" for h in j["data"]["history"])

    (row,) = poll(base + "/api/v1/actions", retired, LIMIT, "the child stopped", log)["data"]["history"]
    assert (row["target"], row["type"], row["outcome"]) == ("proc", "stop", "succeeded")
    assert f"its vLLM process {pid} was stopped" in row["reason"]
    deadline = time.monotonic() + LIMIT
    while stubs_on(vport, script):
        assert time.monotonic() < deadline, "the removed target's child still runs"
        time.sleep(0.05)
    assert not (tmp_path / "state" / "process-proc.json").exists()
