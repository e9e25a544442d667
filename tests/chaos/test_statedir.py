"""Chaos: an unwritable or full state_dir. The watchdog keeps monitoring, alerts on its own health, refuses the
disruptive actions it could not record, and recovers by itself once the directory can be written again.

The state_dir is a real tmpfs: mounted read-only (root ignores file modes, so chmod would prove nothing) or
small and filled up. The end-to-end tests run real watchdog processes against a FaultServer target in process
mode, whose "vLLM" is a sleeping Python child: cheap to start, stop and restart. They load the bundled rules
with the state alert's `for:` cut from a minute to seconds (its timing is the rule tests' to prove). The unit tests at the top drive
StateHealth and the SQLite fallbacks with real failures (a read-only connection, a directory where the file
should be) and an injected probe.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import signal
import sqlite3
import stat
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tests.support.apitargets import targets
from tests.support.configs import AUTH, target, write_config
from tests.support.faultserver import FaultServer
from tests.support.procs import command_lines
from tests.support.vllm_server import ROOT, free_port
from tests.support.watchdogproc import inbound_alert, poll, start_watchdog
from vllm_watchdog.actions.incidents.bundle import Bundles
from vllm_watchdog.actions.store.actionstore import ActionStore
from vllm_watchdog.notifiers.queue import MEMORY_ID_BASE, DeliveryQueue, NewItem
from vllm_watchdog.ruler.state import save_state
from vllm_watchdog.statehealth import PROBE_FILE, StateHealth, probe_write

pytestmark = (
    pytest.mark.spread
)  # each test makes its own state dir and watchdog: any worker may run any of them

ALERT = "VLLMWatchdogStateUnwritable"
ALERT_FOR = "3s"  # bundled: 1m, which rules/tests/vllm.rules.test.yml proves; here only the wait for it
METRICS = """# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{model_name="tiny"} 0
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{model_name="tiny"} 0
"""


def _mount_tmpfs(path: Path, options: str, cleanup: list[Callable[[], None]]) -> None:
    path.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)], check=True)

    def unmount() -> None:
        subprocess.run(["umount", "-l", str(path)], check=False)

    cleanup.append(unmount)


def _fill(directory: Path) -> Path:
    """Write zeros into `directory` until the filesystem is full; the filler file."""
    filler = directory / "filler"
    with filler.open("wb", buffering=0) as f:
        try:
            while True:
                f.write(b"\0" * 4096)
        except OSError as exc:
            assert exc.errno == errno.ENOSPC
    return filler


class ScriptedProbe:
    """A probe that fails while `problem` is set, and counts its calls."""

    def __init__(self) -> None:
        self.problem: OSError | None = None
        self.calls = 0

    def __call__(self, directory: str) -> None:
        self.calls += 1
        if self.problem is not None:
            raise self.problem


# -- unit: StateHealth and the fallbacks --------------------------------------------------------------------


def test_probe_write_fails_on_read_only_full_and_missing_dirs(
    tmp_path: Path, cleanup: list[Callable[[], None]]
) -> None:
    _mount_tmpfs(tmp_path / "ro", "size=64k,ro", cleanup)
    _mount_tmpfs(tmp_path / "full", "size=64k", cleanup)
    (tmp_path / "a-file").write_text("")
    with pytest.raises(OSError) as ro:
        probe_write(str(tmp_path / "ro"))
    assert ro.value.errno == errno.EROFS
    _fill(tmp_path / "full")
    with pytest.raises(OSError) as full:
        probe_write(str(tmp_path / "full"))
    assert full.value.errno == errno.ENOSPC
    assert not (tmp_path / "full" / PROBE_FILE).exists()  # the failed probe leaves nothing behind
    with pytest.raises(OSError):
        probe_write(str(tmp_path / "a-file" / "state"))  # a parent that is no directory
    probe_write(str(tmp_path / "new" / "state"))  # a missing directory is made
    assert os.listdir(tmp_path / "new" / "state") == []


def test_health_probes_when_due_counts_failures_and_recovers(caplog: pytest.LogCaptureFixture) -> None:
    probe = ScriptedProbe()
    health = StateHealth("/state", probe=probe, interval=10.0)
    assert health.tick(0.0) and health.writable and probe.calls == 1
    probe.problem = OSError(errno.ENOSPC, "No space left on device")
    assert health.tick(5.0) and probe.calls == 1  # not due yet: the last answer stands
    assert not health.tick(10.0) and not health.writable
    assert health.errors == {PROBE_FILE: 1}
    reason = health.refusal(11.0)  # a fresh probe before an action, due or not
    assert reason.startswith("state_unwritable: ") and "No space left on device" in reason
    assert health.errors == {PROBE_FILE: 2}
    probe.problem = None
    assert health.refusal(12.0) == "" and health.writable
    logged = [(r.levelname, r.getMessage().split(":")[0]) for r in caplog.records]
    assert logged == [("ERROR", "state_dir is not writable"), ("WARNING", "state_dir is writable again")]


def test_store_moves_to_memory_when_its_file_refuses_a_write_and_back(tmp_path: Path) -> None:
    probe = ScriptedProbe()
    health = StateHealth(str(tmp_path), probe=probe)
    path = str(tmp_path / "actions.sqlite")
    store = ActionStore(path, health=health)
    first = store.record("restart", "restart", "vllm-0", "alert", {}, "skipped", "before", False, 1.0)
    store._db.execute("PRAGMA query_only = 1")  # the file now refuses every write, as a read-only mount does
    second = store.record("restart", "restart", "vllm-0", "alert", {}, "skipped", "during", False, 2.0)
    assert store.degraded and not health.writable and health.errors == {"actions.sqlite": 1}
    assert [r.reason for r in store.history(None)] == ["during", "before"]  # the file's rows came along
    running = store.begin("restart", "restart", "vllm-0", "manual", {}, False, 3.0)
    assert health.check(4.0) and not store.degraded  # a copy taken from the file goes back whole, any time
    store.finish(running, "succeeded", 5.0)
    on_disk = ActionStore(path)
    assert [(r.id, r.outcome) for r in on_disk.history(None)] == [
        (running, "succeeded"),
        (second, "skipped"),
        (first, "skipped"),
    ]
    on_disk.close()
    store.close()


def test_store_begun_in_memory_is_merged_after_the_file_rows(tmp_path: Path) -> None:
    health = StateHealth(str(tmp_path), probe=ScriptedProbe())
    path = tmp_path / "actions.sqlite"
    path.mkdir()  # cannot be opened at all, and there is no file to copy
    store = ActionStore(str(path), health=health)
    assert store.degraded and not health.writable
    refused = store.record("restart", "restart", "vllm-0", "inbound", {}, "skipped", "mem-1", False, 10.0)
    held = store.begin("throttle", "throttle", "vllm-0", "alert", {}, False, 11.0)
    store.step(held, "throttle", 11.5)
    store.put("restore/x/vllm-0", {"due": 99.0})
    path.rmdir()
    other = ActionStore(str(path))  # meanwhile the file came back, with rows of its own
    for reason in ("disk-1", "disk-2"):
        other.record("restart", "restart", "vllm-0", "alert", {}, "skipped", reason, False, 1.0)
    other.close()
    assert not health.check(12.0)  # not while an action holds an id that the merge would change
    store.finish(held, "succeeded", 13.0)
    assert health.check(14.0) and not store.degraded
    rows = store.history(None)
    assert [(r.id, r.reason) for r in rows] == [(4, ""), (3, "mem-1"), (2, "disk-2"), (1, "disk-1")]
    assert [s.step for s in rows[0].steps] == ["throttle"] and refused == 1 and held == 2
    assert store.get("restore/x/vllm-0") == {"due": 99.0}
    store.close()


def test_queue_falls_back_to_memory_and_keeps_order_and_ids(tmp_path: Path) -> None:
    health = StateHealth(str(tmp_path), probe=ScriptedProbe())
    path = tmp_path / "notifications.sqlite"
    path.mkdir()
    queue = DeliveryQueue(str(path), health=health)
    assert queue.degraded
    queue.push("webhook-0", [NewItem("alert", "m1"), NewItem("alert", "m2")], 5.0, 100)
    held = queue.head("webhook-0", 10)  # a delivery in flight holds these ids across the move
    assert all(i.id > MEMORY_ID_BASE for i in held)
    path.rmdir()
    disk = DeliveryQueue(str(path))
    disk.push("webhook-0", [NewItem("alert", "d1")], 1.0, 100)
    disk.close()
    assert health.check(6.0) and not queue.degraded
    assert [i.body for i in queue.head("webhook-0", 10)] == ["d1", "m1", "m2"]
    assert queue.remove(i.id for i in held) == 2
    assert [i.body for i in DeliveryQueue(str(path)).head("webhook-0", 10)] == ["d1"]


def test_queue_that_cannot_write_its_file_keeps_its_items(tmp_path: Path) -> None:
    health = StateHealth(str(tmp_path), probe=ScriptedProbe())
    path = str(tmp_path / "notifications.sqlite")
    queue = DeliveryQueue(path, health=health)
    queue.push("am", [NewItem("alert", "kept"), NewItem("alert", "old", key="a")], 1.0, 100)
    queue._db.execute("PRAGMA query_only = 1")  # the file refuses every write, as a read-only mount does
    queue.push("am", [NewItem("alert", "new", key="a"), NewItem("alert", "b")], 2.0, 100)
    assert queue.degraded and health.errors == {"notifications.sqlite": 1}
    assert [i.body for i in queue.head("am", 10)] == ["kept", "new", "b"]
    assert health.check(3.0)
    assert [i.body for i in DeliveryQueue(path).head("am", 10)] == ["kept", "new", "b"]


@pytest.fixture
def umask_022() -> Iterator[None]:
    """The usual umask, under which files used to come out 0644 and directories 0755."""
    old = os.umask(0o022)
    yield
    os.umask(old)


def _modes(root: Path) -> dict[str, str]:
    found = {".": oct(stat.S_IMODE(root.stat().st_mode))}
    for path in root.rglob("*"):
        found[str(path.relative_to(root))] = oct(stat.S_IMODE(path.stat().st_mode))
    return found


def test_a_fresh_state_dir_and_every_file_in_it_are_the_users_only(tmp_path: Path, umask_022: None) -> None:
    state = tmp_path / "state"
    health = StateHealth(str(state))
    assert health.check(0.0)
    store = ActionStore(str(state / "actions.sqlite"), health=health)
    store.record("restart", "restart", "vllm-0", "alert", {}, "skipped", "x", False, 1.0)
    queue = DeliveryQueue(str(state / "notifications.sqlite"), health=health)
    queue.push("am", [NewItem("alert", "m")], 1.0, 100)
    save_state(state / "alerts.json", [])
    Bundles(str(state)).write("a-1", {"manifest.json": b"{}"}, 1.0)
    modes = _modes(state)
    assert {"actions.sqlite-wal", "actions.sqlite-shm", "notifications.sqlite-wal", "alerts.json"} <= set(
        modes
    )
    assert {name: mode for name, mode in modes.items() if mode != "0o600"} == {
        ".": "0o700",
        "incidents": "0o700",
    }
    store.close()
    queue.close()


def test_an_existing_open_state_dir_is_left_alone_with_one_warning_per_path(
    tmp_path: Path, umask_022: None, caplog: pytest.LogCaptureFixture
) -> None:
    state = tmp_path / "state"
    state.mkdir(mode=0o755)
    (state / "actions.sqlite").touch(mode=0o644)
    health = StateHealth(str(state))
    for now in (0.0, 10.0, 20.0):
        assert health.check(now)
        ActionStore(str(state / "actions.sqlite"), health=health).close()
    assert _modes(state)["."] == "0o755" and _modes(state)["actions.sqlite"] == "0o644"
    warned = [(r.path, r.mode) for r in caplog.records if r.getMessage().startswith("state_dir path open")]  # type: ignore[attr-defined]
    assert warned == [(str(state), "0755"), (str(state / "actions.sqlite"), "0644")]


# -- end to end: real watchdog processes ----------------------------------------------------------------------


def _bundled_rules_with_short_for(path: Path) -> None:
    """rules/vllm.rules.yml as it is, but for ALERT's `for:`, which becomes ALERT_FOR: the test waits for the
    alert to fire, and a minute of real waiting per test proves nothing that the rule's unit test does not."""
    doc = yaml.safe_load((ROOT / "rules" / "vllm.rules.yml").read_text())
    rules = [r for g in doc["groups"] for r in g["rules"] if r.get("alert") == ALERT]
    assert len(rules) == 1 and rules[0]["for"] == "1m", rules
    rules[0]["for"] = ALERT_FOR
    path.write_text(yaml.safe_dump(doc, sort_keys=False))


def _config(tmp_path: Path, port: int, fault: FaultServer, marker: str) -> Path:
    """A process-mode target whose 'vLLM' is a sleeping child (found by `marker`), scraped at the FaultServer;
    the bundled rules (ALERT's `for:` shortened); inbound VLLMEngineHung restarts it; every alert goes to a
    webhook on the FaultServer."""
    sleeper = [sys.executable, "-c", "import time; time.sleep(3600)", marker]
    _bundled_rules_with_short_for(tmp_path / "vllm.rules.yml")
    return write_config(
        tmp_path,
        target(fault.url, name="vllm-s", command=sleeper),
        port=port,
        rest=f"""rule_files: [vllm.rules.yml]
routes:
  - {{match: {{alertname: VLLMEngineHung}}, actions: [restart]}}
actions:
  restart: {{type: restart, startup_grace: 0s, cooldown: 0s, drain_timeout: 2s, stop_timeout: 10s,
             ready_timeout: 30s}}
notifiers:
  - {{type: webhook, url: {fault.url}/hook, send_resolved: true}}
""",
    )


def _children(marker: str) -> list[int]:
    """PIDs of the sleeping 'vLLM' children of one test."""
    return [pid for pid, argv in command_lines() if marker.encode() in argv]


def _metric(base: str, name: str, labels: str = "") -> float | None:
    text = httpx.get(base + "/metrics", timeout=5).text
    found = re.search(rf"^{re.escape(name + labels)} (\S+)$", text, re.MULTILINE)
    return float(found.group(1)) if found else None


def _until(check: Callable[[], bool], limit: float, what: str, log: Path) -> None:
    """Wait until `check` holds (errors count as not yet); AssertionError with the log's end if it never does."""
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        with contextlib.suppress(httpx.HTTPError, OSError):
            if check():
                return
        time.sleep(0.3)
    raise AssertionError(f"{what} not within {limit}s; watchdog log: {log.read_text()[-3000:]}")


def _writable(base: str, value: int) -> Callable[[], bool]:
    return lambda: _metric(base, "vllm_watchdog_state_writable") == value


def _start(tmp_path: Path, fault: FaultServer, cleanup: list[Callable[[], None]]) -> tuple[str, Path, str]:
    fault.vllm_like(METRICS)
    fault.set("/hook", b"")
    port, marker = free_port(), f"statedir-{uuid.uuid4().hex}"
    cfg, log = _config(tmp_path, port, fault, marker), tmp_path / "watchdog.log"

    def kill_children() -> None:
        for pid in _children(marker):
            os.killpg(pid, signal.SIGKILL)

    cleanup.append(kill_children)
    wd = start_watchdog(cfg, log)

    def stop() -> None:
        wd.terminate()
        wd.wait(20)

    cleanup.append(stop)
    base = f"http://127.0.0.1:{port}"
    poll(base + "/api/v1/targets", lambda j: targets(j)[0]["up"], 60, "the target scraped", log)
    return base, log, marker


def _restart(base: str) -> None:
    body = inbound_alert("VLLMEngineHung", "vllm-s")
    resp = httpx.post(base + "/api/v1/alertmanager", json=body, headers=AUTH, timeout=10)
    assert resp.status_code == 200 and resp.json()["queued"] == 1, resp.text


def _history(j: Any) -> list[dict[str, Any]]:
    return list(j["data"]["history"])


def _assert_unwritable_behaviour(base: str, log: Path, fault: FaultServer) -> dict[str, Any]:
    """Gauge 0, a restart refused and counted, the own alert firing and delivered; the refused row."""
    _until(_writable(base, 0), 30, "gauge 0", log)
    _restart(base)

    def refused(j: Any) -> bool:
        return any(r["reason"].startswith("state_unwritable") for r in _history(j))

    status = poll(base + "/api/v1/actions", refused, 60, "the restart refused", log)["data"]
    row = next(r for r in status["history"] if r["reason"].startswith("state_unwritable"))
    assert row["action"] == "restart" and row["outcome"] == "skipped", row
    assert not status["state"]["writable"] and status["state"]["problem"]
    assert not any(r["outcome"] in ("running", "succeeded") for r in status["history"])
    skipped = '{action="restart",outcome="skipped",target="vllm-s"}'
    assert (_metric(base, "vllm_watchdog_actions_total", skipped) or 0) >= 1
    assert (_metric(base, "vllm_watchdog_state_write_errors_total", f'{{file="{PROBE_FILE}"}}') or 0) >= 1

    def firing(j: Any) -> bool:
        return any(a["labels"]["alertname"] == ALERT and a["state"] == "firing" for a in j["data"]["alerts"])

    poll(base + "/api/v1/alerts", firing, 150, f"{ALERT} firing", log)
    delivered = lambda: any(p == "/hook" and ALERT.encode() in b for _, p, b in fault.requests)  # noqa: E731
    _until(delivered, 60, f"{ALERT} delivered to the webhook", log)
    poll(base + "/api/v1/targets", lambda j: targets(j)[0]["up"], 10, "the target still scraped", log)
    assert "state_dir is not writable" in log.read_text()
    return dict(row)


def test_unwritable_at_start(tmp_path: Path, fault: FaultServer, cleanup: list[Callable[[], None]]) -> None:
    state = tmp_path / "state"
    _mount_tmpfs(state, "size=1m,ro", cleanup)
    base, log, marker = _start(tmp_path, fault, cleanup)
    assert "notifications.sqlite" in log.read_text()  # the notifier queue went to memory, with a warning
    row = _assert_unwritable_behaviour(base, log, fault)
    assert _children(marker) == []  # not started, not restarted: nothing could have been recorded

    subprocess.run(["mount", "-o", "remount,rw", str(state)], check=True)
    _until(_writable(base, 1), 60, "gauge 1", log)
    _until(lambda: len(_children(marker)) == 1, 60, "the deferred start", log)
    db = sqlite3.connect(f"{(state / 'actions.sqlite').as_uri()}?mode=ro", uri=True)
    reasons = [r[0] for r in db.execute("SELECT reason FROM actions")]
    db.close()
    assert row["reason"] in reasons  # what was decided in memory reached the file


def test_full_while_running(tmp_path: Path, fault: FaultServer, cleanup: list[Callable[[], None]]) -> None:
    state = tmp_path / "state"
    _mount_tmpfs(state, "size=2m", cleanup)
    base, log, marker = _start(tmp_path, fault, cleanup)
    _until(lambda: len(_children(marker)) == 1, 60, "the child started", log)
    assert _metric(base, "vllm_watchdog_state_writable") == 1
    (child,) = _children(marker)

    filler = _fill(state)
    _assert_unwritable_behaviour(base, log, fault)
    assert _children(marker) == [child]  # refused before anything was stopped

    filler.unlink()
    _until(_writable(base, 1), 60, "gauge 1", log)
    _restart(base)

    def restarted(j: Any) -> bool:
        return any(r["outcome"] == "succeeded" and r["action"] == "restart" for r in _history(j))

    poll(base + "/api/v1/actions", restarted, 90, "the restart allowed again", log)
    children = _children(marker)
    assert len(children) == 1 and children != [child]
