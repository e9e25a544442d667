"""Tests of the systemd runtime against a stub systemctl (systemd is not PID 1 here)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from vllm_watchdog.actions.runtimes.runtime import Launch
from vllm_watchdog.actions.runtimes.systemd import SystemdRuntime
from vllm_watchdog.errors import ActionError, RefusedError

pytestmark = pytest.mark.anyio

STUB = r"""
import json, os, sys, time
here = os.path.dirname(os.path.abspath(__file__))
state_path = os.path.join(here, "state.json")
def load():
    with open(state_path) as f:
        return json.load(f)
def save(state):
    with open(state_path + ".tmp", "w") as f:
        json.dump(state, f)
    os.replace(state_path + ".tmp", state_path)
args = sys.argv[1:]
with open(os.path.join(here, "calls.jsonl"), "a") as f:
    f.write(json.dumps(args) + "\n")
verb, unit = args[0], args[-1]
if args[-2] != "--":
    sys.exit("stub: the unit must follow --")
state = load()
key = unit if unit in state["units"] else unit + ".service"
u = state["units"].get(key)
if u is not None and verb in u.get("hang", ()):
    time.sleep(60)
if verb == "show":
    values = {"Id": unit, "Names": unit, "LoadState": "not-found"}
    if u is not None:
        values = {"Id": u["names"][0], "Names": " ".join(u["names"]), "LoadState": "loaded",
                  "ExecMainStartTimestampMonotonic": str(u["main_usec"]),
                  "ActiveEnterTimestampMonotonic": str(u.get("enter_usec", 0)), **u.get("props", {})}
    for arg in args:
        if arg.startswith("--property="):
            name = arg.split("=", 1)[1]
            print(f"{name}={values.get(name, '')}")
elif verb == "is-active":
    active = u["state"] if u else "inactive"
    print(active)
    sys.exit(0 if active == "active" else 3)
elif verb == "start":
    if u.get("fail_start"):
        print(f"Job for {key} failed because the control process exited with error code.", file=sys.stderr)
        sys.exit(1)
    u.update(state="active", main_usec=state["monotonic_usec"])
    save(state)
elif verb == "stop":
    if u.get("slow_stop"):  # vLLM draining for longer than the watchdog waits
        u["state"] = "deactivating"
        save(state)
        deadline = time.monotonic() + 30
        while load()["units"][key]["state"] != "inactive" and time.monotonic() < deadline:
            time.sleep(0.05)
        sys.exit(0)
    u.update(state="inactive", main_usec=0)
    save(state)
elif verb == "kill":
    u.update(state="inactive", main_usec=0, killed=args[1:-2])
    save(state)
else:
    sys.exit(f"stub: unknown verb {verb}")
"""


class Systemd:
    """The stub's state and call log."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.command = [sys.executable, str(root / "systemctl.py")]
        (root / "systemctl.py").write_text(STUB)
        self.write(
            {
                "monotonic_usec": 500_000_000,
                "units": {
                    "vllm.service": {"names": ["vllm.service"], "state": "active", "main_usec": 100_000_000}
                },
            }
        )

    def read(self) -> dict[str, Any]:
        state: dict[str, Any] = json.loads((self.root / "state.json").read_text())
        return state

    def write(self, state: dict[str, Any]) -> None:
        (self.root / "state.json").write_text(json.dumps(state))

    def unit(self, name: str = "vllm.service", **changes: Any) -> dict[str, Any]:
        state = self.read()
        state["units"].setdefault(name, {"names": [name], "state": "inactive", "main_usec": 0}).update(
            changes
        )
        self.write(state)
        unit: dict[str, Any] = state["units"][name]
        return unit

    def calls(self, verb: str | None = None) -> list[list[str]]:
        path = self.root / "calls.jsonl"
        lines = path.read_text().splitlines() if path.exists() else []
        return [c for c in map(json.loads, lines) if verb is None or c[0] == verb]


@pytest.fixture
def systemd(tmp_path: Path) -> Systemd:
    return Systemd(tmp_path)


def runtime(systemd: Systemd, unit: str = "vllm.service", **kw: Any) -> SystemdRuntime:
    return SystemdRuntime(
        "vllm-0", unit, systemctl=systemd.command, clock=lambda: 10_000.0, monotonic=lambda: 160.0, **kw
    )


async def test_restart_cycle(systemd: Systemd) -> None:
    rt = runtime(systemd)
    assert await rt.is_running()
    # Main process started at monotonic 100 s; now is monotonic 160 s = unix 10000: started 60 s ago.
    assert await rt.started_at() == 9_940.0
    await rt.stop(5.0)
    assert systemd.calls("stop") == [["stop", "--no-ask-password", "--", "vllm.service"]]
    assert not await rt.is_running()
    assert await rt.started_at() is None
    await rt.stop(5.0)  # stopped already: no second systemctl stop
    assert len(systemd.calls("stop")) == 1

    await rt.start()
    assert systemd.calls("start") == [["start", "--no-ask-password", "--", "vllm.service"]]
    assert await rt.is_running()
    assert await rt.started_at() == 10_000.0 - (160.0 - 500.0)  # the stub's clock, as systemd reports it
    await rt.start()  # running: no-op
    assert len(systemd.calls("start")) == 1
    assert {tuple(c[-2:]) for c in systemd.calls()} == {("--", "vllm.service")}  # only ever this unit


async def test_start_time_falls_back_to_active_enter(systemd: Systemd) -> None:
    systemd.unit(main_usec=0, enter_usec=150_000_000)
    assert await runtime(systemd).started_at() == 9_990.0
    systemd.unit(main_usec=0, enter_usec=0)
    assert await runtime(systemd).started_at() is None


async def test_unknown_or_foreign_units_are_refused_before_anything_is_touched(systemd: Systemd) -> None:
    for bad in ("vllm; reboot", "-vllm", "", "vllm service"):
        with pytest.raises(RefusedError):
            runtime(systemd, bad)
    missing = runtime(systemd, "other.service")
    assert not await missing.is_running()
    with pytest.raises(RefusedError, match=r"no unit other\.service"):
        await missing.stop(5.0)
    with pytest.raises(RefusedError, match="no unit"):
        await missing.start()
    # A name that systemd resolves to another unit is not the configured one.
    systemd.unit("alias.service", names=["real.service"], state="active")
    with pytest.raises(RefusedError, match=r"resolves to real\.service"):
        await runtime(systemd, "alias.service").stop(5.0)
    assert systemd.calls("stop") == systemd.calls("start") == []
    # The configured name among the unit's names (an alias the operator chose) is fine; no suffix too.
    systemd.unit("alias.service", names=["real.service", "alias.service"])
    await runtime(systemd, "alias").stop(5.0)
    assert systemd.calls("stop") == [["stop", "--no-ask-password", "--", "alias"]]


async def test_failed_start_is_an_action_error_with_systemctl_message(systemd: Systemd) -> None:
    systemd.unit(state="inactive", fail_start=True)
    with pytest.raises(ActionError, match="control process exited with error code"):
        await runtime(systemd).start()


async def test_stop_kills_after_timeout(systemd: Systemd) -> None:
    systemd.unit(slow_stop=True)
    rt = runtime(systemd)
    await rt.stop(0.5)
    assert systemd.calls("kill") == [["kill", "--no-ask-password", "--signal=SIGKILL", "--", "vllm.service"]]
    assert not await rt.is_running()


async def test_hanging_systemctl_is_bounded(systemd: Systemd) -> None:
    systemd.unit(hang=["is-active"])
    with pytest.raises(ActionError, match="timed out"):
        await runtime(systemd, command_timeout=0.5).is_running()


async def test_restart_only(systemd: Systemd) -> None:
    rt = runtime(systemd)
    with pytest.raises(ActionError, match="restart only"):
        await rt.launch()
    with pytest.raises(ActionError, match="restart only"):
        await rt.replace(Launch("process", ("vllm",)), stop_timeout=1.0)
    with pytest.raises(ActionError, match="restart only"):
        await rt.rollback(stop_timeout=1.0)
    assert not await rt.has_previous()
    await rt.commit()
    await rt.close()
    assert systemd.calls("stop") == []


async def test_missing_systemctl_is_an_action_error(tmp_path: Path) -> None:
    rt = SystemdRuntime("vllm-0", "vllm.service", systemctl=[str(tmp_path / "no-systemctl")])
    with pytest.raises(ActionError, match="cannot run"):
        await rt.is_running()


JOURNALCTL = r"""
import json, sys
with open(sys.argv[1], "a") as f:
    f.write(json.dumps(sys.argv[2:]) + "\n")
sys.stdout.write(open(sys.argv[1] + ".out").read())
"""
INVOCATION = "0123456789abcdef0123456789abcdef"
EXITED_0 = {"ActiveState": "inactive", "Result": "success", "ExecMainCode": "1", "ExecMainStatus": "0"}


@pytest.mark.parametrize(
    ("props", "journal", "crashed", "respawn"),
    [
        ({**EXITED_0, "Restart": "on-failure"}, "EngineCore encountered a fatal error.\n", True, True),
        ({**EXITED_0, "Restart": "always"}, "EngineDeadError\n", True, False),  # systemd starts it again
        ({**EXITED_0, "Restart": "no"}, "Shutting down FastAPI HTTP server.\n", False, False),  # a stop
        # systemd's own stop (SIGTERM) is a clean end; a SIGKILL is not, and is left to Restart= and the routes
        ({**EXITED_0, "ExecMainCode": "2", "ExecMainStatus": "15"}, "", False, False),
        (
            {"ActiveState": "failed", "Result": "signal", "ExecMainCode": "2", "ExecMainStatus": "9"},
            "",
            True,
            False,
        ),
    ],
)
async def test_an_exit_is_classified_from_the_units_state_and_its_runs_journal(
    systemd: Systemd, tmp_path: Path, props: dict[str, str], journal: str, crashed: bool, respawn: bool
) -> None:
    (tmp_path / "journalctl.py").write_text(JOURNALCTL)
    (tmp_path / "journal.out").write_text(journal)
    systemd.unit(state="inactive", props={**props, "InvocationID": INVOCATION})
    journalctl = [sys.executable, str(tmp_path / "journalctl.py"), str(tmp_path / "journal")]
    status = await runtime(systemd, journalctl=journalctl).exit_status()
    assert status is not None and (status.crashed, status.respawn) == (crashed, respawn), status
    (call,) = map(json.loads, (tmp_path / "journal").read_text().splitlines())
    assert call[-1] == f"_SYSTEMD_INVOCATION_ID={INVOCATION}" and "-n" in call  # that run's lines, bounded


async def test_an_active_unit_has_no_exit_and_is_asked_at_most_every_5s(systemd: Systemd) -> None:
    now = [160.0]
    rt = SystemdRuntime("vllm-0", "vllm.service", systemctl=systemd.command, monotonic=lambda: now[0])
    systemd.unit(props={"ActiveState": "active", "InvocationID": INVOCATION})
    assert await rt.exit_status() is None
    systemd.unit(state="inactive", props={**EXITED_0, "InvocationID": INVOCATION})
    assert await rt.exit_status() is None  # the last reading, not a new systemctl show
    assert len(systemd.calls("show")) == 1
    now[0] += 5.0
    status = await rt.exit_status()
    assert status is not None and status.code == 0 and len(systemd.calls("show")) == 2
