"""The systemd units in systemd/: they verify, score as hardened, and the watchdog runs inside their sandbox.

systemd is not PID 1 here, so the units are checked with `systemd-analyze verify` and `security --offline`,
and the unit's sandbox is rebuilt by hand for one real run against the session's vLLM: its system-call
filter, MemoryDenyWriteExecute and RestrictAddressFamilies installed as systemd 252 installs them (seccomp
filters, through libseccomp), no capabilities, no_new_privs, and a file system that is read-only except for
the state directory (ProtectSystem=strict plus StateDirectory=). The notify protocol runs on a socket of
our own: READY=1, WATCHDOG=1 at half of WatchdogSec, STOPPING=1.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.apitargets import targets
from tests.support.configs import target, watchdog_yaml
from tests.support.systemd_sandbox import NotifySocket, Sandbox
from tests.support.vllm_server import VllmServer, free_port
from vllm_watchdog.cli import build_parser

ROOT = Path(__file__).resolve().parents[2]
UNITS = ROOT / "systemd"
WATCHDOG_UNIT = UNITS / "vllm-watchdog.service"
GATEWAY_UNIT = UNITS / "vllm-watchdog-gateway.service"
MODES = {mode: UNITS / "modes" / f"{mode}.conf" for mode in ("docker", "process", "systemd")}
SHIPPED_BINARY = "/usr/local/bin/vllm-watchdog"
VENV_BINARY = str(Path(sys.executable).parent / "vllm-watchdog")
EXPOSURE_LIMIT = 2.0  # systemd-analyze's 0-10 exposure scale; the base unit scores 1.4
WATCHDOG_USEC = 2_000_000  # the sandboxed run's WatchdogSec: pings every second
START_LIMIT = 120.0
SETUP_HINT = "systemd-analyze (package systemd) is missing: run scripts/setup.sh"


def read_unit(path: Path) -> dict[str, list[tuple[str, str]]]:
    """A unit file's assignments per section, in order (systemd keys repeat; line continuations joined)."""
    sections: dict[str, list[tuple[str, str]]] = {}
    current: list[tuple[str, str]] | None = None
    pending = ""
    for raw in path.read_text().splitlines():
        line = pending + raw.strip()
        if line.endswith("\\"):
            pending = line[:-1] + " "
            continue
        pending = ""
        if not line or line[0] in "#;":
            continue
        if line.startswith("["):
            current = sections.setdefault(line.strip("[]"), [])
            continue
        assert current is not None, f"{path}: assignment outside a section: {line}"
        key, _, value = line.partition("=")
        current.append((key.strip(), value.strip()))
    return sections


def last(unit: dict[str, list[tuple[str, str]]], key: str, section: str = "Service") -> str | None:
    """The value in force for a single-valued key (the last assignment wins)."""
    found = [v for k, v in unit.get(section, []) if k == key]
    return found[-1] if found else None


def analyze(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """Run systemd-analyze; a missing tool fails the test with the setup hint."""
    if shutil.which("systemd-analyze") is None:
        pytest.fail(SETUP_HINT)
    return subprocess.run(["systemd-analyze", *args], cwd=cwd, capture_output=True, text=True, timeout=120)


def installable(tmp: Path, unit: Path, dropin: Path | None = None) -> Path:
    """A copy of `unit` (and a drop-in in its .d directory) whose binaries exist on this machine."""
    text = unit.read_text().replace(SHIPPED_BINARY, VENV_BINARY).replace("/opt/vllm/bin/vllm", "/bin/true")
    copy = tmp / unit.name
    copy.write_text(text)
    if dropin is not None:
        (tmp / f"{unit.name}.d").mkdir()
        shutil.copy(dropin, tmp / f"{unit.name}.d" / dropin.name)
    return copy


def exposure(unit: Path) -> tuple[float, dict[str, bool]]:
    """The overall exposure score of `systemd-analyze security --offline` and which checks are met."""
    text = analyze("security", "--offline=true", unit.name, cwd=unit.parent)
    assert text.returncode == 0, text.stderr
    score = re.search(rf"Overall exposure level for {re.escape(unit.name)}: ([0-9.]+)", text.stdout)
    assert score, text.stdout
    checks = analyze("security", "--offline=true", "--json=short", unit.name, cwd=unit.parent)
    return float(score.group(1)), {c["name"]: c["set"] for c in json.loads(checks.stdout)}


# -- the files as shipped -------------------------------------------------------------------------


def test_exec_start_runs_the_cli_with_real_flags() -> None:
    """ExecStart is the installed console script with flags the `run` command accepts."""
    unit = read_unit(WATCHDOG_UNIT)
    argv = shlex.split(last(unit, "ExecStart") or "")
    assert argv == [SHIPPED_BINARY, "run", "--config", "/etc/vllm-watchdog/config.yml", "--external-gateway"]
    args = build_parser().parse_args(argv[1:])
    assert (args.command, args.config, args.external_gateway) == (
        "run",
        "/etc/vllm-watchdog/config.yml",
        True,
    )
    reload = shlex.split(last(unit, "ExecReload") or "")
    # exits non-zero on a rejected config; finds the API at the config's `listen`
    assert reload == [
        SHIPPED_BINARY,
        "reload",
        "--config",
        "/etc/vllm-watchdog/config.yml",
        "--pid",
        "$MAINPID",
    ]
    args = build_parser().parse_args([a.replace("$MAINPID", "1234") for a in reload[1:]])
    assert (args.command, args.pid, args.url) == ("reload", 1234, None)
    assert args.config == "/etc/vllm-watchdog/config.yml"


def test_gateway_unit_runs_the_gateway_with_the_same_config_and_runtime_directory() -> None:
    """The data plane is a unit of its own: same config, same /run directory for the control socket."""
    gateway, watchdog = read_unit(GATEWAY_UNIT), read_unit(WATCHDOG_UNIT)
    argv = shlex.split(last(gateway, "ExecStart") or "")
    assert argv == [SHIPPED_BINARY, "gateway", "--config", "/etc/vllm-watchdog/config.yml"]
    args = build_parser().parse_args(argv[1:])
    assert (args.command, args.config) == ("gateway", "/etc/vllm-watchdog/config.yml")
    for key in ("RuntimeDirectory", "RuntimeDirectoryPreserve", "User", "StateDirectory", "EnvironmentFile"):
        assert last(gateway, key) == last(watchdog, key), key
    assert (last(gateway, "Type"), last(gateway, "Restart")) == ("notify", "on-failure")
    # enabled, it starts with the daemon (its WantedBy=); the daemon never pulls it in itself
    assert "vllm-watchdog.service" in (last(gateway, "WantedBy", "Install") or "").split()


def test_watchdog_unit_settings() -> None:
    """Type=notify with the watchdog pinged, restarts bounded, state and config directories, the hardening."""
    unit = read_unit(WATCHDOG_UNIT)
    expected = {
        "Type": "notify",
        "NotifyAccess": "main",
        "WatchdogSec": "30s",
        "Restart": "on-failure",
        "RestartSec": "5s",
        "User": "vllm-watchdog",
        "StateDirectory": "vllm-watchdog",
        "ConfigurationDirectory": "vllm-watchdog",
        "EnvironmentFile": "-/etc/vllm-watchdog/env",
        "NoNewPrivileges": "yes",
        "ProtectSystem": "strict",
        "ProtectHome": "yes",
        "PrivateTmp": "yes",
        "CapabilityBoundingSet": "",
        "MemoryDenyWriteExecute": "yes",
        "RestrictAddressFamilies": "AF_UNIX AF_INET AF_INET6",
        "SystemCallArchitectures": "native",
        "LockPersonality": "yes",
        "DevicePolicy": "closed",
        "LimitNOFILE": "65536",  # not the default 1,024: clients cannot leave the daemon without descriptors
    }
    assert {k: last(unit, k) for k in expected} == expected
    assert last(unit, "StartLimitIntervalSec", "Unit") and last(unit, "StartLimitBurst", "Unit")
    filters = [v for k, v in unit["Service"] if k == "SystemCallFilter"]
    assert filters == ["@system-service", "~@privileged @resources"]
    # NVML needs the GPU nodes: PrivateDevices stays off and the device list admits the NVIDIA nodes only.
    assert last(unit, "PrivateDevices") is None
    devices = [v.split()[0] for k, v in unit["Service"] if k == "DeviceAllow"]
    assert devices == ["char-nvidiactl", "char-nvidia-frontend", "char-nvidia-caps"]
    # The Docker group only comes with the docker-mode drop-in; KillMode only with the process-mode one.
    assert last(unit, "SupplementaryGroups") is None and last(unit, "KillMode") is None


def test_mode_dropins() -> None:
    """docker.conf adds the docker group; process.conf keeps vLLM alive across watchdog restarts."""
    docker = read_unit(MODES["docker"])
    assert last(docker, "SupplementaryGroups") == "docker"
    assert last(docker, "After", "Unit") == "docker.service"
    process = read_unit(MODES["process"])
    assert {k: last(process, k) for k in ("KillMode", "RemoveIPC", "MemoryDenyWriteExecute")} == {
        "KillMode": "process",
        "RemoveIPC": "no",
        "MemoryDenyWriteExecute": "no",
    }
    assert last(process, "SystemCallFilter") == ""  # reset: CUDA and torch need more than @system-service
    assert "TMPDIR=/var/cache/vllm-watchdog/tmp" in (last(process, "Environment") or "")
    assert "char-nvidia-uvm rw" in [v for k, v in process["Service"] if k == "DeviceAllow"]


def test_incident_rights_come_with_the_modes_that_hold_stronger_powers() -> None:
    """Docker and systemd modes add ptrace and the kernel log for incident bundles, and nothing else; the base
    unit and process mode (vLLM is the watchdog's own child, which ptrace allows) keep none."""
    rights = "CAP_SYS_PTRACE CAP_SYSLOG"
    for mode in ("docker", "systemd"):
        unit = read_unit(MODES[mode])
        assert last(unit, "CapabilityBoundingSet") == rights and last(unit, "AmbientCapabilities") == rights
        assert (last(unit, "ProtectProc"), last(unit, "ProtectKernelLogs")) == ("default", "no")
        assert last(unit, "SystemCallFilter") == "ptrace syslog"  # added to the base unit's allow list
    for unit in (read_unit(WATCHDOG_UNIT), read_unit(MODES["process"])):
        assert last(unit, "AmbientCapabilities") in (None, "")
    assert last(read_unit(WATCHDOG_UNIT), "CapabilityBoundingSet") == ""


# -- systemd-analyze ------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", [None, *MODES])
def test_watchdog_unit_verifies(tmp_path: Path, mode: str | None) -> None:
    """`systemd-analyze verify` passes without a single warning, with each mode's drop-in too."""
    installable(tmp_path, GATEWAY_UNIT)
    copy = installable(tmp_path, WATCHDOG_UNIT, MODES[mode] if mode else None)
    result = analyze("verify", "--man=no", "--generators=no", copy.name, cwd=tmp_path)
    assert (result.returncode, result.stdout + result.stderr) == (0, "")


def test_gateway_unit_verifies_and_is_hardened(tmp_path: Path) -> None:
    """The gateway unit verifies without a warning and scores as well as the daemon's."""
    copy = installable(tmp_path, GATEWAY_UNIT)
    result = analyze("verify", "--man=no", "--generators=no", copy.name, cwd=tmp_path)
    assert (result.returncode, result.stdout + result.stderr) == (0, "")
    score, checks = exposure(copy)
    print(f"vllm-watchdog-gateway.service exposure: {score}")
    assert score <= EXPOSURE_LIMIT
    assert checks["PrivateDevices="] and checks["NoNewPrivileges="]


def _enable(root: Path, *units: str) -> set[str]:
    """`systemctl --root enable` (offline, no systemd running) of the shipped units: the wants links made."""
    if shutil.which("systemctl") is None:
        pytest.fail("systemctl (package systemd) is missing: run scripts/setup.sh")
    system = root / "etc" / "systemd" / "system"
    system.mkdir(parents=True)
    for unit in (WATCHDOG_UNIT, GATEWAY_UNIT):
        shutil.copy(unit, system / unit.name)
    result = subprocess.run(
        ["systemctl", f"--root={root}", "enable", *units], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    return {str(p.relative_to(system)) for p in system.glob("*.wants/*")}


def test_the_daemon_pulls_in_the_gateway_only_where_it_is_enabled(tmp_path: Path) -> None:
    """A watch-only host enables the daemon alone: nothing starts the gateway unit (which would exit 2 with no
    `gateway:` section and restart into a failed unit). Enabled, the gateway starts with the daemon."""
    daemon = read_unit(WATCHDOG_UNIT)
    pulls = {k: v for k, v in daemon["Unit"] if k in ("Wants", "Requires", "Requisite", "BindsTo", "Upholds")}
    assert not any(GATEWAY_UNIT.name in v for v in pulls.values()), pulls
    alone = _enable(tmp_path / "alone", WATCHDOG_UNIT.name)
    assert alone == {"multi-user.target.wants/vllm-watchdog.service"}
    both = _enable(tmp_path / "both", WATCHDOG_UNIT.name, GATEWAY_UNIT.name)
    assert "vllm-watchdog.service.wants/vllm-watchdog-gateway.service" in both
    assert GATEWAY_UNIT.name in (last(daemon, "After", "Unit") or "")  # ordered: the socket exists first


def test_vllm_unit_verifies(tmp_path: Path) -> None:
    """The example vLLM unit verifies too."""
    copy = installable(tmp_path, UNITS / "vllm.service")
    result = analyze("verify", "--man=no", "--generators=no", copy.name, cwd=tmp_path)
    assert (result.returncode, result.stdout + result.stderr) == (0, "")
    assert "vllm serve" in (last(read_unit(UNITS / "vllm.service"), "ExecStart") or "")


def test_exposure_score(tmp_path: Path) -> None:
    """`systemd-analyze security --offline` rates the unit at most EXPOSURE_LIMIT (0 safest, 10 unsafe)."""
    score, checks = exposure(installable(tmp_path, WATCHDOG_UNIT))
    print(f"vllm-watchdog.service exposure: {score}")
    assert score <= EXPOSURE_LIMIT
    for name in (
        "NoNewPrivileges=",
        "ProtectSystem=",
        "ProtectHome=",
        "PrivateTmp=",
        "MemoryDenyWriteExecute=",
    ):
        assert checks[name], name
    threshold = analyze(
        "security",
        "--offline=true",
        f"--threshold={int(EXPOSURE_LIMIT * 10)}",
        WATCHDOG_UNIT.name,
        cwd=tmp_path,
    )
    assert threshold.returncode == 0


@pytest.mark.parametrize(
    ("mode", "relaxed"),
    [
        ("docker", "SupplementaryGroups="),
        ("process", "MemoryDenyWriteExecute="),
        ("systemd", "CapabilityBoundingSet=~CAP_SYS_PTRACE"),
    ],
)
def test_dropins_are_applied(tmp_path: Path, mode: str, relaxed: str) -> None:
    """The offline analysis reads the drop-in from the unit's .d directory: the setting it relaxes shows."""
    score, checks = exposure(installable(tmp_path, WATCHDOG_UNIT, MODES[mode]))
    print(f"vllm-watchdog.service + {mode}.conf exposure: {score}")
    assert not checks[relaxed]


# -- the sandbox, rebuilt by hand (tests/support/systemd_sandbox.py) ------------------------------------------


def unit_sandbox() -> Sandbox:
    """The shipped unit's system-call filter, its errno and its address families."""
    unit = read_unit(WATCHDOG_UNIT)
    if shutil.which("systemd-analyze") is None:
        pytest.fail(SETUP_HINT)
    error_number = last(unit, "SystemCallErrorNumber")
    assert error_number, "the unit sets no SystemCallErrorNumber=: a filtered syscall would kill the watchdog"
    return Sandbox.from_settings(
        [v for k, v in unit["Service"] if k == "SystemCallFilter"],
        error_number,
        last(unit, "RestrictAddressFamilies") or "",
    )


@pytest.fixture
def state_dir() -> Iterator[Path]:
    """The writable state directory, in a short path (AF_UNIX socket paths are limited to 108 bytes)."""
    if os.geteuid() != 0:
        pytest.fail(
            "the sandbox tests need root (a mount namespace): run them as root, as scripts/test.sh does"
        )
    path = Path(tempfile.mkdtemp(prefix="wd-unit-"))
    (path / "state").mkdir()
    yield path / "state"
    shutil.rmtree(path, ignore_errors=True)


PROBE = """
import errno, mmap, os, socket, sys
results = {}
try:
    mmap.mmap(-1, 4096, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
    results["wx"] = "allowed"
except OSError as exc:
    results["wx"] = errno.errorcode[exc.errno]
try:
    socket.socket(socket.AF_PACKET, socket.SOCK_RAW)
    results["packet"] = "allowed"
except OSError as exc:
    results["packet"] = errno.errorcode[exc.errno]
try:
    os.setpriority(os.PRIO_PROCESS, 0, 5)  # @resources
    results["setpriority"] = "allowed"
except OSError as exc:
    results["setpriority"] = errno.errorcode[exc.errno]
try:
    open("/etc/vllm-watchdog-probe", "w")
    results["etc"] = "allowed"
except OSError as exc:
    results["etc"] = errno.errorcode[exc.errno]
open(os.path.join(sys.argv[1], "written"), "w").write("ok")
results["caps"] = [l.split()[1] for l in open("/proc/self/status") if l.startswith(("CapEff", "CapBnd"))]
print(results)
"""


def test_sandbox_is_in_force(state_dir: Path) -> None:
    """The rebuilt sandbox really confines: no W+X memory, no packet sockets, no @resources calls, a
    read-only /etc, no capabilities; the state directory stays writable."""
    cmd = unit_sandbox().command(
        [sys.executable, "-c", PROBE, str(state_dir)], {"PATH": "/usr/bin"}, state_dir
    )
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == str(
        {
            "wx": "EPERM",
            "packet": "EAFNOSUPPORT",
            "setpriority": "EPERM",
            "etc": "EROFS",
            "caps": ["0" * 16] * 2,
        }
    )
    assert (state_dir / "written").read_text() == "ok"


@pytest.mark.vllm
def test_watchdog_runs_in_the_units_sandbox(vllm_server: VllmServer, state_dir: Path) -> None:
    """The real daemon, confined as the unit confines it, starts (READY=1), pings the systemd watchdog,
    scrapes and probes vLLM, forwards a completion through the gateway (uvloop, aiohttp), reloads on SIGHUP
    and stops on SIGTERM with STOPPING=1 and exit 0."""
    api, gw = free_port(), free_port()
    config = state_dir.parent / "config.yml"
    config.write_text(
        watchdog_yaml(
            target(vllm_server.url, canary={"enabled": True, "interval": "2s", "timeout": "20s"}),
            port=api,
            token="${VLLM_WATCHDOG_TOKEN}",  # from the environment, as the unit's EnvironmentFile= gives it
            state_dir="${STATE_DIRECTORY}",
            rest=f"""
gpus: {{nvml: true}}
rule_files: ["bundled:vllm.rules.yml", "bundled:gateway.rules.yml"]
gateway: {{listen: 127.0.0.1:{gw}, target: vllm-0}}
include: ["bundled:watchdog.yml"]
""",
        )
    )
    run_dir = state_dir.parent / "run"  # RuntimeDirectory=: the gateway's control socket
    (run_dir / "notify").mkdir(parents=True)
    notify, gateway_notify = NotifySocket(state_dir.parent), NotifySocket(run_dir / "notify")
    env = {  # what systemd puts into the environment of a Type=notify service with these settings
        "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin",
        "LANG": "C.UTF-8",
        "HOME": str(state_dir),
        "STATE_DIRECTORY": str(state_dir),
        "RUNTIME_DIRECTORY": str(run_dir),
        "NOTIFY_SOCKET": str(notify.path),
        "WATCHDOG_USEC": str(WATCHDOG_USEC),
        "VLLM_WATCHDOG_TOKEN": "unit-test-token",
    }
    log = state_dir.parent / "watchdog.log"
    procs = []
    try:
        # vllm-watchdog-gateway.service first (enabled, it is wanted by the daemon's unit, which is After= it): its own sandbox,
        # with the runtime directory as its one writable place.
        gateway_argv = _exec_start(GATEWAY_UNIT, config)
        gateway_env = {**env, "NOTIFY_SOCKET": str(gateway_notify.path)}
        with log.open("ab") as out:
            gateway = subprocess.Popen(
                unit_sandbox().command(gateway_argv, gateway_env, run_dir),
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        procs.append(gateway)
        gateway_notify.wait_for("READY=1", 1, START_LIMIT, log)
        with log.open("ab") as out:
            proc = subprocess.Popen(
                unit_sandbox().command(_exec_start(WATCHDOG_UNIT, config), env, state_dir),
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        procs.append(proc)
        notify.wait_for("READY=1", 1, START_LIMIT, log)
        notify.wait_for("WATCHDOG=1", 3, 10 * WATCHDOG_USEC / 1e6, log)
        base = f"http://127.0.0.1:{api}"
        _poll(lambda: targets(httpx.get(base + "/api/v1/targets", timeout=5).json())[0]["up"], log)
        _poll(lambda: httpx.get(base + "/healthz", timeout=5).status_code == 200, log)
        _poll(lambda: httpx.get(base + "/api/v1/gateway", timeout=5).json()["data"]["pid"], log)
        body = {"model": "tiny-llama", "prompt": "Hello", "max_tokens": 2, "temperature": 0}
        resp = httpx.post(f"http://127.0.0.1:{gw}/v1/completions", json=body, timeout=120)
        assert resp.status_code == 200, resp.text
        assert resp.json()["usage"]["completion_tokens"] >= 1
        assert list(state_dir.iterdir()), "nothing written to the state directory"
        proc.send_signal(signal.SIGHUP)  # ExecReload=
        reloaded = 'vllm_watchdog_config_reloads_total{result="success"} 1.0'
        _poll(lambda: reloaded in httpx.get(base + "/metrics", timeout=5).text, log)
        proc.send_signal(signal.SIGTERM)
        assert _exit_code(proc, log) == 0, f"exit {proc.returncode}; log: {log.read_text()[-3000:]}"
        notify.wait_for("STOPPING=1", 1, 5, log)
        # The gateway is not the daemon's child here: it outlives the daemon's stop, and stops on its own SIGTERM.
        resp = httpx.post(f"http://127.0.0.1:{gw}/v1/completions", json=body, timeout=120)
        assert resp.status_code == 200, resp.text
        gateway.send_signal(signal.SIGTERM)
        assert _exit_code(gateway, log) == 0, f"exit {gateway.returncode}; log: {log.read_text()[-3000:]}"
        gateway_notify.wait_for("STOPPING=1", 1, 5, log)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(timeout=30)
        notify.close()
        gateway_notify.close()


def _exit_code(proc: subprocess.Popen[bytes], log: Path, limit: float = 60.0) -> int:
    """The exit code of a process told to stop; one that does not stop within `limit` fails the test with the
    end of the log (a TimeoutExpired alone says nothing of why)."""
    try:
        return proc.wait(timeout=limit)
    except subprocess.TimeoutExpired:
        raise AssertionError(
            f"{proc.args} did not stop within {limit}s; log: {log.read_text()[-3000:]}"
        ) from None


def _exec_start(unit: Path, config: Path) -> list[str]:
    """The unit's ExecStart with the venv's binary and our config."""
    argv = shlex.split(last(read_unit(unit), "ExecStart") or "")
    argv[0], argv[argv.index("--config") + 1] = VENV_BINARY, str(config)
    return argv


def _poll(pred: Callable[[], Any], log: Path, limit: float = 60.0) -> None:
    """Call pred until it is true; AssertionError with the watchdog's log after `limit` seconds."""
    deadline = time.monotonic() + limit
    last_error: Exception | None = None
    while time.monotonic() < deadline:
        try:
            if pred():
                return
        except (httpx.HTTPError, KeyError, IndexError, ValueError) as exc:
            last_error = exc
        time.sleep(0.3)
    raise AssertionError(f"not within {limit}s (last error: {last_error}); log: {log.read_text()[-3000:]}")
