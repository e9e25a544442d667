"""A systemd unit's sandbox rebuilt without systemd, for tests where systemd is not PID 1.

`Sandbox.command(argv, env, state)` gives a command line that runs `argv` confined as systemd 252 confines
a service with these settings (run it as root; this file is the child's program):
- SystemCallFilter= / SystemCallErrorNumber= / SystemCallArchitectures=native: a seccomp allow list whose
  default action fails other syscalls with the errno; other architectures' calls kill;
- MemoryDenyWriteExecute=yes: seccomp refuses mmap with PROT_WRITE|PROT_EXEC, mprotect/pkey_mprotect with
  PROT_EXEC and shmat with SHM_EXEC (EPERM), as systemd 252's filter does;
- RestrictAddressFamilies=: socket() with another family fails with EAFNOSUPPORT;
- CapabilityBoundingSet= (empty) and NoNewPrivileges=yes;
- ProtectSystem=strict with StateDirectory=: a mount namespace in which every mount is read-only except
  /proc, /sys, /dev and the state directory.
Not rebuilt: User= (the test runs as root without capabilities, since the venv's interpreter lives under
/root), ProtectHome= (for the same reason), PrivateTmp=, the Protect{Kernel*,Clock,Hostname}= and Restrict*=
settings that guard what the watchdog never calls, and DevicePolicy=.
"""

from __future__ import annotations

import ctypes
import errno
import json
import os
import socket
import subprocess
import sys
import threading
from dataclasses import dataclass
from pathlib import Path

_SCMP_ACT_ALLOW = 0x7FFF0000
_SCMP_CMP_EQ, _SCMP_CMP_GE, _SCMP_CMP_MASKED_EQ = 4, 5, 7
_PROT_WRITE, _PROT_EXEC, _SHM_EXEC = 0x2, 0x4, 0o100000
_AF_MAX = 46
_CLONE_NEWNS = 0x20000
_MS_RDONLY, _MS_REMOUNT, _MS_BIND, _MS_REC, _MS_PRIVATE = 1, 32, 4096, 16384, 1 << 18
_PR_CAPBSET_DROP, _PR_SET_NO_NEW_PRIVS = 24, 38


class _ArgCmp(ctypes.Structure):
    """libseccomp's struct scmp_arg_cmp."""

    _fields_ = [
        ("arg", ctypes.c_uint),
        ("op", ctypes.c_int),
        ("datum_a", ctypes.c_uint64),
        ("datum_b", ctypes.c_uint64),
    ]


def _errno_action(code: int) -> int:
    return 0x00050000 | code  # SCMP_ACT_ERRNO(code)


def syscall_groups() -> dict[str, list[str]]:
    """Every syscall group of this systemd (`systemd-analyze syscall-filter`): name -> members."""
    out = subprocess.run(
        ["systemd-analyze", "syscall-filter"], check=True, capture_output=True, text=True, timeout=60
    ).stdout
    groups: dict[str, list[str]] = {}
    current: list[str] = []
    for line in out.splitlines():
        if line.startswith("@"):
            current = groups.setdefault(line.strip(), [])
        elif line.strip() and not line.strip().startswith("#"):
            current.append(line.strip())
    return groups


def _expand(names: list[str], groups: dict[str, list[str]]) -> set[str]:
    out: set[str] = set()
    for name in names:
        out |= _expand(groups[name], groups) if name.startswith("@") else {name}
    return out


def allow_list(filters: list[str]) -> list[str]:
    """The syscalls that SystemCallFilter= lines add up to (an allow list, then ~ removals)."""
    groups = syscall_groups()
    allowed: set[str] = set()
    for value in filters:
        if value.startswith("~"):
            allowed -= _expand(value[1:].split(), groups)
        else:
            allowed |= _expand(value.split(), groups)
    return sorted(allowed)


@dataclass(frozen=True)
class Sandbox:
    """The seccomp side of a unit: allowed syscalls, the errno for the others, allowed address families."""

    syscalls: tuple[str, ...]
    errno: int
    families: tuple[int, ...]

    @classmethod
    def from_settings(cls, filters: list[str], error_number: str, address_families: str) -> Sandbox:
        """From the unit's SystemCallFilter= lines, SystemCallErrorNumber= and RestrictAddressFamilies=."""
        families = tuple(int(getattr(socket, name)) for name in address_families.split())
        return cls(tuple(allow_list(filters)), int(getattr(errno, error_number)), families)

    def command(self, argv: list[str], env: dict[str, str], state: Path) -> list[str]:
        """A command line that runs `argv` with `env` in the sandbox; `state` is its one writable directory."""
        spec = state.parent / f"sandbox-{state.name}.json"
        body = {"argv": argv, "env": env, "state_dir": str(state), **self.__dict__}
        spec.write_text(json.dumps(body))
        return [sys.executable, __file__, str(spec)]


def _enter(spec_path: str) -> None:
    """The child (as root): build the sandbox the spec file describes, then exec its argv."""
    spec = json.loads(Path(spec_path).read_text())
    libc = ctypes.CDLL(None, use_errno=True)

    def check(rc: int, what: str) -> None:
        if rc != 0:
            sys.exit(f"sandbox: {what}: {os.strerror(ctypes.get_errno())}")

    # ProtectSystem=strict + StateDirectory=: every mount read-only in a mount namespace of our own.
    check(libc.unshare(_CLONE_NEWNS), "unshare")
    check(libc.mount(None, b"/", None, _MS_REC | _MS_PRIVATE, None), "make / private")
    state = spec["state_dir"].encode()
    check(libc.mount(state, state, None, _MS_BIND, None), "bind the state directory")
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        target = line.split()[4].encode().decode("unicode_escape").encode()
        if target == state or target.startswith((b"/proc", b"/sys", b"/dev")):
            continue
        libc.mount(None, target, None, _MS_REMOUNT | _MS_BIND | _MS_RDONLY, None)  # nsfs and the like refuse
    # CapabilityBoundingSet= (empty) and NoNewPrivileges=yes: after execve the program holds no capability.
    for cap in range(int(Path("/proc/sys/kernel/cap_last_cap").read_text()) + 1):
        check(libc.prctl(_PR_CAPBSET_DROP, cap, 0, 0, 0), f"drop capability {cap}")
    check(libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")

    seccomp = ctypes.CDLL("libseccomp.so.2", use_errno=True)
    seccomp.seccomp_init.restype = ctypes.c_void_p
    seccomp.seccomp_rule_add_array.argtypes = [
        ctypes.c_void_p, ctypes.c_uint32, ctypes.c_int, ctypes.c_uint, ctypes.POINTER(_ArgCmp)
    ]  # fmt: skip
    seccomp.seccomp_load.argtypes = [ctypes.c_void_p]

    def rule(ctx: int, action: int, name: str, *cmps: tuple[int, int, int, int]) -> None:
        nr = seccomp.seccomp_syscall_resolve_name(name.encode())
        if nr < 0:
            return  # not a syscall of this architecture (systemd skips those too)
        arr = (_ArgCmp * max(len(cmps), 1))(*[_ArgCmp(*c) for c in cmps])
        if seccomp.seccomp_rule_add_array(ctx, action, nr, len(cmps), arr) != 0:
            sys.exit(f"sandbox: seccomp rule for {name}")

    # SystemCallFilter=: the allow list; a filter is for the native architecture only, so calls through
    # another ABI meet libseccomp's bad-architecture action (kill), as SystemCallArchitectures=native.
    allow = seccomp.seccomp_init(_errno_action(spec["errno"]))
    for name in spec["syscalls"]:
        rule(allow, _SCMP_ACT_ALLOW, name)
    refuse = _errno_action(errno.EPERM)
    mdwe = seccomp.seccomp_init(_SCMP_ACT_ALLOW)
    both = _PROT_WRITE | _PROT_EXEC
    rule(mdwe, refuse, "mmap", (2, _SCMP_CMP_MASKED_EQ, both, both))
    for name in ("mprotect", "pkey_mprotect"):
        rule(mdwe, refuse, name, (2, _SCMP_CMP_MASKED_EQ, _PROT_EXEC, _PROT_EXEC))
    rule(mdwe, refuse, "shmat", (2, _SCMP_CMP_MASKED_EQ, _SHM_EXEC, _SHM_EXEC))
    families = seccomp.seccomp_init(_SCMP_ACT_ALLOW)
    no_family = _errno_action(errno.EAFNOSUPPORT)
    for family in range(_AF_MAX):
        if family not in spec["families"]:
            rule(families, no_family, "socket", (0, _SCMP_CMP_EQ, family, 0))
    rule(families, no_family, "socket", (0, _SCMP_CMP_GE, _AF_MAX, 0))
    for ctx in (families, mdwe, allow):  # the allow list last: it refuses seccomp() itself
        if seccomp.seccomp_load(ctx) != 0:
            sys.exit("sandbox: seccomp_load failed")
    os.execve(spec["argv"][0], spec["argv"], spec["env"])


class NotifySocket:
    """The sd_notify socket systemd would give a Type=notify service: collects the datagrams sent to it, read
    as they come, as systemd reads them (a socket nobody reads fills up, and the service drops what does not
    fit: a test reading only when it waits would lose a later STOPPING=1)."""

    def __init__(self, directory: Path) -> None:
        self.path = directory / "notify.sock"
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(str(self.path))
        self.sock.settimeout(0.2)
        self.messages: list[str] = []
        self._arrived = threading.Condition()
        self._closed = threading.Event()
        self._reader = threading.Thread(target=self._read, daemon=True, name=f"notify:{self.path}")
        self._reader.start()

    def _read(self) -> None:
        while not self._closed.is_set():
            try:
                data = self.sock.recv(4096)
            except TimeoutError:
                continue
            except OSError:
                return
            with self._arrived:
                self.messages.append(data.decode())
                self._arrived.notify_all()

    def wait_for(self, message: str, count: int, limit: float, log: Path) -> None:
        """Until `message` has arrived `count` times; AssertionError (with the service's log) after `limit`
        seconds without it."""
        with self._arrived:
            if not self._arrived.wait_for(lambda: self.messages.count(message) >= count, limit):
                raise AssertionError(
                    f"no {message} within {limit}s; got {self.messages}; log: {log.read_text()[-3000:]}"
                )

    def close(self) -> None:
        """Stop reading, close and remove the socket."""
        self._closed.set()
        self._reader.join(5)
        self.sock.close()
        self.path.unlink(missing_ok=True)


if __name__ == "__main__":
    _enter(sys.argv[1])
